"""Drop-ins for the engines' logits gather: klgen.integrations.vllm and
klgen.integrations.sglang. Neither engine is a dependency; each module
documents how to switch its engine over."""
