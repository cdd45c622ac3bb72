"""libklrt through ctypes: the library, its prototypes, and its errors as exceptions.

ctypes rather than an extension module: the wheel then depends on no Python
version (one wheel, py3-none), and the C API is the contract (klrt/klrt.h).
"""

import ctypes
import os
import re

from ._errors import DeviceError, Error, SpecError

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(PACKAGE_DIR, "lib", "libklrt.so.0")

# kl_result values (klrt.h), in order.
OK, EINVAL, ESPEC, ENODRIVER, ECUDA, ENCCL, EDEVICE, EUNAVAILABLE, ENOMEM, ESTATE, EBUSY = range(11)

INFO_NAME = 64  # KL_INFO_NAME
SPECS_MAX = 256  # the most specs one file may define (gen/spec.c)


class Info(ctypes.Structure):
    """kl_info."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("name", ctypes.c_char * INFO_NAME),
        ("vocab_size", ctypes.c_longlong),
        ("padded_vocab", ctypes.c_longlong),
        ("shard", ctypes.c_longlong),
        ("max_tokens", ctypes.c_longlong),
        ("tp", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("elem_bytes", ctypes.c_int),
        ("vec_bytes", ctypes.c_int),
        ("buffer_bytes", ctypes.c_longlong),
        ("out_dtype", ctypes.c_int),
        ("out_elem_bytes", ctypes.c_int),
        ("topk", ctypes.c_int),
        ("noise", ctypes.c_int),
    ]


DECLINES = ("disabled", "not-ready", "tokens", "size")  # kl_decline, in order
NOISES = ("philox", "vllm")  # kl_info.noise, in order

ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_void_p)


class Config(ctypes.Structure):
    """kl_config."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("device", ctypes.c_int),
        ("nccl", ctypes.c_void_p),
        ("allgather", ALLGATHER_FN),
        ("allgather_user", ctypes.c_void_p),
        ("group", ctypes.c_void_p),
        ("cache_dir", ctypes.c_char_p),
        ("crossover_bytes", ctypes.c_longlong),
        ("no_pdl", ctypes.c_int),
    ]


class Sampling(ctypes.Structure):
    """kl_sampling: device pointers to the parameters (NULL but temperature:
    off), and the tables' index arrays with their counts."""

    _fields_ = ([("size", ctypes.c_size_t)]
                + [(name, ctypes.c_void_p)
                   for name in ("temperature", "top_k", "top_p", "min_p", "seed", "offset",
                                "state_rows")]
                + [("states", ctypes.c_int64), ("offset_rows", ctypes.c_void_p),
                   ("offsets", ctypes.c_int64), ("state_rows_bits", ctypes.c_int),
                   ("offset_rows_bits", ctypes.c_int), ("bitmask", ctypes.c_void_p)]
                + [(name, ctypes.c_void_p)
                   for name in ("repetition_penalty", "frequency_penalty", "presence_penalty",
                                "prompt_mask", "output_counts", "allowed_count", "allowed_ids")]
                + [("allowed_width", ctypes.c_int), ("bias_width", ctypes.c_int)]
                + [(name, ctypes.c_void_p)
                   for name in ("bias_count", "bias_ids", "bias_values", "min_len", "stop_count",
                                "stop_ids", "position", "banned")]
                + [("stop_width", ctypes.c_int), ("banned_width", ctypes.c_int),
                   ("rank", ctypes.c_void_p), ("logit_values", ctypes.c_int),
                   ("reserved", ctypes.c_int)])


class Stats(ctypes.Structure):
    """kl_stats."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("oneshot", ctypes.c_uint64),
        ("nccl", ctypes.c_uint64),
        ("declined", ctypes.c_uint64 * len(DECLINES)),
        ("sample_gathered", ctypes.c_uint64),
        ("staged", ctypes.c_uint64),
        ("oneshot_ready", ctypes.c_int),
        ("cache_hit", ctypes.c_int),
        ("crossover_bytes", ctypes.c_longlong),
        ("not_ready", ctypes.c_char * 256),
        ("arch", ctypes.c_char * 16),
    ]


def _load():
    if not os.path.exists(LIBRARY):
        raise ImportError(f"klgen: {LIBRARY} is missing: the package is not installed whole")
    lib = ctypes.CDLL(LIBRARY)
    proto = {
        "kl_spec_info_file": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Info)]),
        "kl_spec_info_string": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Info)]),
        "kl_spec_names_file": (
            ctypes.c_int,
            [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        ),
        "kl_spec_names_string": (
            ctypes.c_int,
            [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        ),
        "kl_ctx_create_file": (
            ctypes.c_int,
            [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Config)],
        ),
        "kl_ctx_create_string": (
            ctypes.c_int,
            [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Config)],
        ),
        "kl_gather": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p],
        ),
        "kl_argmax": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
             ctypes.c_void_p],
        ),
        "kl_topk": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_int, ctypes.c_void_p],
        ),
        "kl_sample": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(Sampling), ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
             ctypes.c_void_p],
        ),
        "kl_ctx_info": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(Info)]),
        "kl_ctx_stats": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(Stats)]),
        "kl_ctx_status": (ctypes.c_int, [ctypes.c_void_p]),
        "kl_ctx_destroy": (ctypes.c_int, [ctypes.c_void_p]),
        "kl_last_error": (ctypes.c_char_p, []),
        "kl_result_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kl_device_count": (ctypes.c_int, []),
    }
    for name, (restype, argtypes) in proto.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


lib = _load()

# A spec's fields (kl_field_names in gen/spec.c).
FIELDS = ("name", "vocab_size", "pad_to", "padded_vocab", "tp", "dtype", "max_tokens", "timeout_ms",
          "out_dtype", "softcap", "scale", "numerics", "topk", "noise")
# The field is one of FIELDS, or the key a spec wrote that is none of them.
_LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?:(?P<field>%s): |(?P<unknown>.+?): unknown "
                      r"field(?=$| \())?" % "|".join(FIELDS))


def spec_error(message):
    """A SpecError from a message of the form 'file:line: field: what is wrong'."""
    m = _LOCATED.match(message)
    if not m:
        return SpecError(message)
    return SpecError(message, file=m.group("file"), line=int(m.group("line")),
                     field=m.group("field") or m.group("unknown"))


def check(result):
    """Raises the exception for a failed kl_result, with libklrt's message."""
    if result == OK:
        return
    message = (lib.kl_last_error() or b"").decode("utf-8", "replace")
    if result == ESPEC:
        raise spec_error(message)
    if result == EINVAL:
        raise ValueError(message)
    if result == ENOMEM:
        raise MemoryError(message)
    if result in (ENODRIVER, ECUDA, EDEVICE, EUNAVAILABLE):
        raise DeviceError(message)
    name = lib.kl_result_name(result).decode()
    raise Error(f"{name}: {message}")
