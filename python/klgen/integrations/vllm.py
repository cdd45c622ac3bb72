"""vLLM: the logits gather of LogitsProcessor, on klgen.

vLLM's LogitsProcessor._gather_logits does, with TP > 1 and all-gather on,

    logits = tensor_model_parallel_all_gather(logits)   # [..., tp * shard]
    logits = logits[..., :self.org_vocab_size]

all_gather(gather) returns a function with the contract of
tensor_model_parallel_all_gather(input_, dim=-1) followed by that slice, done
in one one-shot step. To switch vLLM over (every TP rank, after the model is
built and torch.distributed is up):

    import klgen
    from klgen.integrations import vllm as kv
    from vllm.distributed import get_tp_group
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    gather = klgen.LogitsGather(vocab_size=org_vocab_size, dtype=torch.bfloat16,
                                padded_vocab=padded_vocab_size, max_tokens=512,
                                group=get_tp_group().device_group)
    kv.patch_logits_processor(LogitsProcessor, gather)

The org vocabulary is vocab_size and the padded one padded_vocab (what vLLM's
VocabParallelEmbedding pads to, a multiple of 64 by default).
"""

import torch


def all_gather(gather):
    """input_ [..., shard] -> [..., vocab_size]: the all-gather along the last
    dimension and the slice to the org vocabulary, in one step."""

    def tensor_model_parallel_all_gather(input_, dim=-1):
        if dim not in (-1, input_.dim() - 1):
            raise ValueError(f"klgen gathers logits along the last dimension, not dim={dim}")
        lead = input_.shape[:-1]
        out = gather(input_.reshape(-1, input_.shape[-1]))
        return out.view(*lead, out.shape[-1])

    return tensor_model_parallel_all_gather


def patch_logits_processor(cls, gather):
    """Makes cls._gather_logits (vLLM's LogitsProcessor) gather with klgen; returns
    the method it replaced."""
    fn = all_gather(gather)
    original = cls._gather_logits

    def _gather_logits(self, logits):
        if logits.shape[-1] != gather.shard:
            raise ValueError(f"logits have {logits.shape[-1]} columns per rank; the klgen spec "
                             f"has {gather.shard}")
        return fn(logits)

    cls._gather_logits = _gather_logits
    return original
