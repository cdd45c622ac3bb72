"""SGLang: the vocab gather of its LogitsProcessor, on klgen.

SGLang's LogitsProcessor._get_logits does, with TP > 1,

    logits = tensor_model_parallel_all_gather(logits)   # [rows, tp * local]
    ...
    logits = logits[:, : self.config.vocab_size]

VocabGather keeps that contract ([rows, local] -> [rows, tp * local], padding
columns included, the slice left to SGLang), so switching is one assignment
(every TP rank, after torch.distributed is up):

    from klgen.integrations.sglang import VocabGather
    import sglang.srt.layers.logits_processor as lp

    lp.tensor_model_parallel_all_gather = VocabGather(
        local_vocab=padded_vocab // tp, dtype=torch.bfloat16, max_rows=512,
        group=get_tp_group().device_group)
"""

import torch

from .._torch import LogitsGather


class VocabGather:
    """[rows, local] -> [rows, tp * local] over a group, through klgen.

    VocabGather(local_vocab, dtype, max_rows, group=None, device=None): the
    spec has vocab_size = tp * local_vocab (no slice: SGLang slices).
    """

    def __init__(self, local_vocab, dtype=torch.bfloat16, max_rows=256, group=None, device=None):
        import torch.distributed as dist

        tp = dist.get_world_size(group if group is not None else dist.group.WORLD)
        self.gather = LogitsGather(vocab_size=tp * local_vocab, padded_vocab=tp * local_vocab,
                                   dtype=dtype, max_tokens=max_rows, group=group, device=device,
                                   name="sglang_vocab")
        self.local_vocab, self.tp = local_vocab, tp

    def __call__(self, input_, dim=-1):
        if dim not in (-1, input_.dim() - 1) or input_.dim() != 2:
            raise ValueError(f"expected [rows, {self.local_vocab}] gathered along dim -1, got "
                             f"shape {tuple(input_.shape)} and dim={dim}")
        return self.gather(input_)

    def close(self):
        self.gather.close()
