"""klgen: the tensor-parallel logits all-gather, generated for your model.

    import klgen
    info = klgen.spec_info("kimi_k3_tp8")   # a shipped spec by name, or a path
    info.shard, info.padded_vocab           # 20480, 163840

Specs are sandboxed Lua files (see the specs/ guide shipped in SPECS_DIR);
klgen.generate() writes the CUDA source and C header the `klgen` command
writes. Errors in a spec raise SpecError, whose str() is the command line's
'file:line: field: what is wrong'.
"""

import ctypes
import math
import os
import re
import subprocess
from typing import List, NamedTuple, Optional

from . import _capi
from ._cli import BINARY
from ._errors import DeviceError, Error, SpecError

__version__ = "0.1.0"
__all__ = [
    "DeviceError", "Error", "LogitsGather", "SPECS_DIR", "Sample", "SpecError", "SpecInfo", "TopK",
    "TopLogprobs",
    "generate", "shipped_specs", "spec_info", "spec_names", "spec_path",
]


def _torch_missing(what, error):
    """The ImportError for `what`, a part that needs PyTorch, when the import that
    failed with `error` was torch's own; else `error` is raised as it is."""
    if error.name != "torch":
        raise error
    return ImportError(f"{what} needs PyTorch: pip install 'klgen[torch]'", name="torch")


def __getattr__(name):
    # The PyTorch part loads torch only when asked for: spec queries need no torch.
    if name in ("LogitsGather", "Sample", "TopK", "TopLogprobs"):
        try:
            import torch  # noqa: F401
        except ModuleNotFoundError as e:
            raise _torch_missing(f"klgen.{name}", e) from None
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
    noise: str = "philox"  # LogitsGather.sample's noise: "philox" or "vllm"


def spec_path(name):
    """The path of a shipped spec file, by its stem ('kimi_k3_tp8') or by the
    name of a spec it defines ('deepseek_v3_tp4'), as `klgen --list` shows them."""
    return _shipped(name)[0]


def _shipped(name):
    """(path, spec name) of a shipped spec: by file stem (name None: the
    file's every spec), else the file that defines a spec of that name."""
    path = os.path.join(SPECS_DIR, name + ".lua")
    if os.path.exists(path):
        return path, None
    defined = []
    for stem in shipped_specs():
        file = os.path.join(SPECS_DIR, stem + ".lua")
        names = spec_names(file)
        if name in names:
            return file, name
        defined += names
    raise FileNotFoundError(f"{name}: no such file, and no shipped spec file or spec of that "
                            f"name (shipped: {', '.join(shipped_specs())}; their specs: "
                            f"{', '.join(defined)})")


def shipped_specs() -> List[str]:
    """The names of the shipped specs (file stems), as `klgen --list` shows them."""
    return sorted(f[:-4] for f in os.listdir(SPECS_DIR) if f.endswith(".lua"))


_NAME = re.compile(r"[A-Za-z0-9_]+\Z")


def _resolve(path, name=None):
    """A spec argument as (file, name): the path itself when it exists or is
    no name, else the shipped spec of that name (a file of that name wins),
    which may stand for one spec of its file; `name` picks one too."""
    if isinstance(path, str) and _NAME.match(path) and not os.path.exists(path):
        path, picked = _shipped(path)
        if picked is not None and name is not None and name != picked:
            raise ValueError(f"name {name!r} and the spec {picked!r} the path names differ")
        name = picked if picked is not None else name
    return path, name


def _path_arg(path, what):
    """A path as bytes for C, refused where C would read less of it."""
    path = os.fspath(path)
    if ("\0" if isinstance(path, str) else b"\0") in path:
        raise ValueError(f"{what}: a path cannot contain a NUL byte: {path!r}")
    return path


def _source_args(path, source, what, name=None):
    """(file as bytes, or None; the source as bytes, or None; the spec's name):
    the name a shipped spec's name stands for, or `name`."""
    if (path is None) == (source is None):
        raise TypeError(f"{what}() takes a spec path or source=..., exactly one of them")
    if path is not None:
        path, name = _resolve(_path_arg(path, what), name)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file or directory", path)
        return os.fsencode(path), None, name
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    # C takes the text up to its first NUL: what follows would never be run.
    if "\0" in source:
        raise SpecError(f"<spec string>:1: the source has a NUL byte at offset {source.index(chr(0))}",
                        file="<spec string>", line=1)
    try:
        return None, source.encode(), name
    except UnicodeEncodeError as e:
        raise SpecError(f"<spec string>:1: the source is not text that UTF-8 can carry ({e.reason} "
                        f"at offset {e.start})", file="<spec string>", line=1) from None


def _name_arg(name):
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or None, not {type(name).__name__}")
    if "\0" in name:
        raise ValueError(f"name cannot contain a NUL byte: {name!r}")
    try:
        return name.encode()
    except UnicodeEncodeError:
        raise ValueError(f"name is not text that UTF-8 can carry: {name!r}") from None


def spec_info(path=None, name: Optional[str] = None, *, source: Optional[str] = None) -> SpecInfo:
    """Sizes of the spec in a file (a path, or a shipped spec's name such as
    'kimi_k3_tp8') or a string (source=...).

    name picks one spec of a file that defines several; without it the file
    must define exactly one. Needs no GPU.
    """
    file, text, name = _source_args(path, source, "spec_info", name)
    cname = _name_arg(name)
    info = _capi.Info(size=ctypes.sizeof(_capi.Info))
    if file is not None:
        _capi.check(_capi.lib.kl_spec_info_file(file, cname, ctypes.byref(info)))
    else:
        _capi.check(_capi.lib.kl_spec_info_string(text, cname, ctypes.byref(info)))
    return SpecInfo(info.name.decode(), info.vocab_size, info.padded_vocab, info.shard, info.tp,
                    _DTYPES[info.dtype], info.max_tokens, info.buffer_bytes,
                    _DTYPES[info.out_dtype], info.topk, _capi.NOISES[info.noise])


def spec_names(path=None, *, source: Optional[str] = None) -> List[str]:
    """The names of the specs a file (path or shipped name) or a string defines, in
    order; for a shipped spec's own name, that name alone."""
    file, text, picked = _source_args(path, source, "spec_names")
    if picked is not None:
        return [picked]
    fn = _capi.lib.kl_spec_names_file if file is not None else _capi.lib.kl_spec_names_string
    # One evaluation for the count and the names: room for the most a file may define.
    count = ctypes.c_int(0)
    names = ((ctypes.c_char * _capi.INFO_NAME) * _capi.SPECS_MAX)()
    _capi.check(fn(file if file is not None else text, names, _capi.SPECS_MAX, ctypes.byref(count)))
    if count.value > _capi.SPECS_MAX:
        raise Error(f"{count.value} specs, more than the {_capi.SPECS_MAX} a file may define")
    return [names[i].value.decode() for i in range(count.value)]


# A summary line of `klgen` (stdout): "<name>: vocab ...", the name a C identifier.
_SUMMARY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*): vocab ", re.MULTILINE)


def generate(path, out_dir, name: Optional[str] = None) -> List[str]:
    """Does what `klgen -o out_dir path [name]` does; returns the files written.

    Every spec of the file (at most 16), or the one `name` picks (or a shipped
    spec's name stands for), gives <out_dir>/<name>.cu and <name>.h, under the
    spec time limit KLGEN_SPEC_TIME_MS (as spec_info). On any error nothing is
    replaced: a bad spec raises SpecError, a malformed KLGEN_SPEC_TIME_MS
    ValueError (as spec_info), anything else Error.
    """
    path, name = _resolve(_path_arg(path, "generate"), name)
    out_dir = _path_arg(out_dir, "generate")
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    picks = []
    if name is not None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"name must be a spec's name (letters, digits, '_'): {name!r}")
        picks = [name]
    # "--": the path is a path even if it starts with '-'. The files are those
    # the command reports for the specs it wrote (a second evaluation of the
    # spec could name others).
    done = subprocess.run([BINARY, "-o", out_dir, "--", path] + picks, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        message = done.stderr.strip()
        if message.startswith("klgen: "):
            message = message[len("klgen: "):]
        err = _capi.spec_error(message)
        if err.line is not None:
            raise err
        if done.returncode == 2:  # a usage error: here, the environment
            raise ValueError(message)
        raise Error(message)
    return [os.path.join(out_dir, n + ext) for n in _SUMMARY.findall(done.stdout)
            for ext in (".cu", ".h")]


def _lua_value(key, value):
    """value as a Lua literal that reads back as exactly value: strings byte by
    byte (anything but printable ASCII as a 3-digit escape), floats by repr
    (shortest round trip), ints within Lua's 64 bits. Refused, before any Lua
    is written: what Lua cannot hold or a spec must not say (NaN, inf, NUL)."""
    if isinstance(value, str):
        if "\0" in value:
            raise SpecError(f"{key}: {value!r} has a NUL byte", field=key)
        try:
            raw = value.encode()
        except UnicodeEncodeError:
            raise SpecError(f"{key}: {value!r} is not text that UTF-8 can carry",
                            field=key) from None
        return '"' + "".join(chr(b) if 0x20 <= b < 0x7f and b not in b'"\\' else f"\\{b:03d}"
                             for b in raw) + '"'
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"spec fields are str, int or float, got {type(value).__name__} {value!r}")
    if isinstance(value, int):  # int(), float(): subclasses (IntEnum, numpy) print otherwise
        if abs(value) >= 1 << 63:
            raise SpecError(f"{key}: {value} is beyond a spec integer's range", field=key)
        return str(int(value))
    if not math.isfinite(value):
        raise SpecError(f"{key}: {value!r} is not a finite number", field=key)
    return repr(float(value))


def _fields_source(fields):
    """A spec's Lua source from plain field values (name defaults to "logits")."""
    unknown = sorted(set(fields) - set(_capi.FIELDS))
    if unknown:
        raise TypeError(f"unknown spec field(s) {', '.join(unknown)}; fields are "
                        f"{', '.join(_capi.FIELDS)}")
    fields = dict(fields)
    fields.setdefault("name", "logits")
    body = ", ".join(f"{k} = {_lua_value(k, v)}" for k, v in fields.items())
    return f"return {{ {body} }}"
