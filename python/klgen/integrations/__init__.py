"""Drop-ins for the engines' logits gathers: klgen.integrations.vllm and
klgen.integrations.sglang (README, "Use with vLLM" and "Use with SGLang").
Neither engine is a dependency of klgen; each module imports its engine."""


def vllm_plugin():
    """klgen's `vllm.general_plugins` entry point, which vLLM runs in every
    process it starts: with KLGEN_VLLM set (1, or torch for the torch
    backend) it replaces vLLM's LogitsProcessor. Without it, it imports
    nothing."""
    import os

    if os.environ.get("KLGEN_VLLM", "") in ("", "0"):
        return
    from . import vllm

    vllm.enable(vllm.backend_from_env())
