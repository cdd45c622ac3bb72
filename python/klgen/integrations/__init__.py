"""Drop-ins for the engines' logits gathers: klgen.integrations.vllm and
klgen.integrations.sglang (README, "Use with vLLM and SGLang").
Neither engine is a dependency of klgen; each module imports its engine.

The engines run their plugins in every process they start: vllm_plugin (the
`vllm.general_plugins` entry point) and sglang_plugin (`sglang.srt.plugins`)
turn the drop-in on when KLGEN_VLLM / KLGEN_SGLANG asks for it, and import
nothing otherwise."""

import os

# "klgen": libklrt on the GPU; "torch": TorchGather, the same contract in torch
# ops, for machines without a GPU (tests)
BACKENDS = ("klgen", "torch")


def check_backend(backend, where):
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


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
