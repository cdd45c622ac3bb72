"""klgen: the tensor-parallel logits all-gather, generated for your model.

    import klgen
    info = klgen.spec_info(klgen.spec_path("kimi_k3_tp8"))
    info.shard, info.padded_vocab        # 20480, 163840

Specs are sandboxed Lua files (see the specs/ guide shipped in SPECS_DIR);
klgen.generate() writes the CUDA source and C header the `klgen` command
writes. Errors in a spec raise SpecError, whose str() is the command line's
'file:line: field: what is wrong'.
"""

import ctypes
import os
import subprocess
from typing import List, NamedTuple, Optional

from . import _capi
from ._cli import BINARY
from ._errors import DeviceError, Error, SpecError

__version__ = "0.1.0"
__all__ = [
    "DeviceError", "Error", "LogitsGather", "SPECS_DIR", "SpecError", "SpecInfo", "TopK",
    "generate", "spec_info", "spec_names", "spec_path",
]


def __getattr__(name):
    # The PyTorch part loads torch only when asked for: spec queries need no torch.
    if name in ("LogitsGather", "TopK"):
        from . import _torch
        return getattr(_torch, name)
    raise AttributeError(f"module 'klgen' has no attribute {name!r}")

SPECS_DIR = os.path.join(_capi.PACKAGE_DIR, "specs")
_DTYPES = ("bf16", "fp16", "fp32")


class SpecInfo(NamedTuple):
    """A spec's sizes: what a caller needs to allocate its buffers."""

    name: str
    vocab_size: int
    padded_vocab: int
    shard: int
    tp: int
    dtype: str
    max_tokens: int
    buffer_bytes: int  # one-shot receive memory per rank
    out_dtype: Optional[str] = None  # the output's dtype: dtype, or "fp32" with an epilogue
    topk: int = 0  # k of LogitsGather.topk; 0: the spec has none


def spec_path(name):
    """The path of a shipped spec, by file stem ('kimi_k3_tp8')."""
    path = os.path.join(SPECS_DIR, name + ".lua")
    if not os.path.exists(path):
        shipped = sorted(f[:-4] for f in os.listdir(SPECS_DIR) if f.endswith(".lua"))
        raise FileNotFoundError(f"no shipped spec {name!r}; shipped: {', '.join(shipped)}")
    return path


def _source_args(path, source, what):
    if (path is None) == (source is None):
        raise TypeError(f"{what}() takes a spec path or source=..., exactly one of them")
    if path is not None:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file or directory", path)
        return os.fsencode(path), None
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    return None, source.encode()


def spec_info(path=None, name: Optional[str] = None, *, source: Optional[str] = None) -> SpecInfo:
    """Sizes of the spec in a file (path) or a string (source=...).

    name picks one spec of a file that defines several; without it the file
    must define exactly one. Needs no GPU.
    """
    file, text = _source_args(path, source, "spec_info")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, not {type(name).__name__}")
    info = _capi.Info(size=ctypes.sizeof(_capi.Info))
    cname = name.encode() if name is not None else None
    if file is not None:
        _capi.check(_capi.lib.kl_spec_info_file(file, cname, ctypes.byref(info)))
    else:
        _capi.check(_capi.lib.kl_spec_info_string(text, cname, ctypes.byref(info)))
    return SpecInfo(info.name.decode(), info.vocab_size, info.padded_vocab, info.shard, info.tp,
                    _DTYPES[info.dtype], info.max_tokens, info.buffer_bytes,
                    _DTYPES[info.out_dtype], info.topk)


def spec_names(path=None, *, source: Optional[str] = None) -> List[str]:
    """The names of the specs a file (or a string) defines, in order."""
    file, text = _source_args(path, source, "spec_names")
    fn = _capi.lib.kl_spec_names_file if file is not None else _capi.lib.kl_spec_names_string
    arg = file if file is not None else text
    count = ctypes.c_int(0)
    _capi.check(fn(arg, None, 0, ctypes.byref(count)))
    names = ((ctypes.c_char * _capi.INFO_NAME) * max(count.value, 1))()
    _capi.check(fn(arg, names, count.value, ctypes.byref(count)))
    return [names[i].value.decode() for i in range(count.value)]


def generate(path, out_dir) -> List[str]:
    """Does what `klgen -o out_dir path` does; returns the files written.

    Every spec of the file gives <out_dir>/<name>.cu and <name>.h. On any error
    nothing is replaced: a bad spec raises SpecError, anything else Error.
    """
    path, out_dir = os.fspath(path), os.fspath(out_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    done = subprocess.run([BINARY, "-q", "-o", out_dir, path], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        message = done.stderr.strip()
        if message.startswith("klgen: "):
            message = message[len("klgen: "):]
        err = _capi.spec_error(message)
        if err.line is not None:
            raise err
        raise Error(message)
    return [os.path.join(out_dir, n + ext) for n in spec_names(path) for ext in (".cu", ".h")]
