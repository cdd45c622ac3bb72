"""Faithful minimal stand-ins for the engines' logits gather (neither vLLM nor
SGLang is installed on these machines): the same tensor operations, in the
same order, as the engines' code they are named after."""

import torch
import torch.distributed as dist


def all_gather(input_, dim=-1):
    """vLLM GroupCoordinator.all_gather (and SGLang's, the same code): NCCL's
    all_gather_into_tensor along dim 0, then the ranks' blocks moved to dim."""
    world = dist.get_world_size()
    if dim < 0:
        dim += input_.dim()
    size = input_.size()
    out = torch.empty((size[0] * world,) + size[1:], dtype=input_.dtype, device=input_.device)
    dist.all_gather_into_tensor(out, input_)
    out = out.reshape((world,) + size).movedim(0, dim)
    return out.reshape(size[:dim] + (world * size[dim],) + size[dim + 1:])


class VllmLogitsProcessor:
    """vLLM's LogitsProcessor._gather_logits with use_all_gather on."""

    def __init__(self, org_vocab_size):
        self.org_vocab_size = org_vocab_size

    def _gather_logits(self, logits):
        logits = all_gather(logits)
        if logits is not None:
            logits = logits[..., : self.org_vocab_size]
        return logits


def sglang_get_logits(logits, vocab_size, gather=all_gather):
    """SGLang's LogitsProcessor._get_logits, its gather and slice."""
    logits = gather(logits)
    return logits[:, :vocab_size]
