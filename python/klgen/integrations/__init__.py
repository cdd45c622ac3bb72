"""Drop-ins for the engines' logits gathers: klgen.integrations.vllm and
klgen.integrations.sglang (README, "Use with vLLM and SGLang").
Neither engine is a dependency of klgen; each module imports its engine.

The engines run their plugins in every process they start: vllm_plugin (the
`vllm.general_plugins` entry point) and sglang_plugin (`sglang.srt.plugins`)
turn the drop-in on when KLGEN_VLLM / KLGEN_SGLANG asks for it, and import
nothing otherwise."""

import hashlib
import inspect
import os

# "klgen": libklrt on the GPU; "torch": TorchGather, the same contract in torch
# ops, for machines without a GPU (tests)
BACKENDS = ("klgen", "torch")


def check_backend(backend, where):
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


def unknown_code(engine, version, known, *functions, unwrap=False):
    """Why one of (name, function) is not the code `known` names (the sha256
    of each one's source as `engine` `version` ships it), or None. unwrap:
    a function's source is that of what it wraps (functools.wraps), for an
    engine whose glue checks for other wrappers itself."""
    for name, fn in functions:
        try:
            text = inspect.getsource((inspect.unwrap(fn) if unwrap else fn).__code__)
        except (AttributeError, OSError, TypeError):
            return f"{engine}'s {name} has no source to check"
        if hashlib.sha256(text.encode()).hexdigest() != known[name]:
            return f"{engine}'s {name} is not {engine} {version}'s"
    return None


def backend_from_env(variable):
    """The backend `variable` asks for: None when it is unset, empty or 0,
    "klgen" for 1, else its value (klgen or torch)."""
    value = os.environ.get(variable, "")
    if value in ("", "0"):
        return None
    return check_backend("klgen" if value == "1" else value, f"{variable}={value!r}")


def vllm_plugin():
    """KLGEN_VLLM set: every LogitsProcessor vLLM builds is klgen's."""
    backend = backend_from_env("KLGEN_VLLM")
    if backend is not None:
        from . import vllm

        vllm.enable(backend)


def sglang_plugin():
    """KLGEN_SGLANG set: every LogitsProcessor SGLang builds gathers on klgen."""
    backend = backend_from_env("KLGEN_SGLANG")
    if backend is not None:
        from . import sglang

        sglang.enable(backend)
