"""The CUDA libraries a PyTorch process already has, for libklrt to use.

libklrt loads NVRTC and NCCL at run time and takes a copy already in the
process first. torch has loaded NCCL by the time a process group exists; NVRTC
it may not have, so it is loaded here from where torch's own wheels put it
(nvidia-cuda-nvrtc) before libklrt looks. Never a second copy of either.
"""

import ctypes
import glob
import os
import sys

RTLD_NOLOAD = getattr(os, "RTLD_NOLOAD", 4)
NVRTC = "libnvrtc.so.13"
NCCL = "libnccl.so.2"


def _loaded(soname):
    try:
        return ctypes.CDLL(soname, mode=RTLD_NOLOAD | os.RTLD_LOCAL)
    except OSError:
        return None


def _wheel_copies(soname):
    """Paths of soname inside the nvidia-* wheels on sys.path, most specific first."""
    found = []
    for base in sys.path:
        if base and os.path.isdir(os.path.join(base, "nvidia")):
            found += sorted(glob.glob(os.path.join(base, "nvidia", "**", soname), recursive=True))
    return found


def _load(soname, what, env):
    lib = _loaded(soname)
    if lib is not None:
        return lib
    searched = [f"{soname} already in the process (no)"]
    candidates = ([os.environ[env]] if os.environ.get(env) else []) + _wheel_copies(soname) + [soname]
    for path in candidates:
        try:
            return ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        except OSError as e:
            searched.append(f"{path} ({e})")
    raise ImportError(f"{what} not found; searched: " + ", ".join(searched))


def nvrtc():
    """NVRTC, loaded so that libklrt's JIT finds it (it takes the loaded copy)."""
    return _load(NVRTC, "NVRTC", "KLGEN_NVRTC_LIBRARY")


def nccl():
    """The NCCL torch loaded, with the prototypes this package calls."""
    lib = _load(NCCL, "NCCL", "KLGEN_NCCL_LIBRARY")
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                     ctypes.c_int]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclGetErrorString.argtypes = [ctypes.c_int]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


class UniqueId(ctypes.Structure):
    """ncclUniqueId."""

    _fields_ = [("internal", ctypes.c_byte * 128)]
