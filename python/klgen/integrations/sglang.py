"""SGLang: the gather of its LogitsProcessor on klgen.

SGLang's LogitsProcessor._get_logits, with TP > 1, multiplies the shard by
logit_scale in place, gathers it with self._logits_gatherer ([rows, local]
-> [rows, tp * local], a MultimemAllGatherer that falls back to NCCL), then
_copy_logits_to_buffer slices to vocab_size and casts to fp32, and the
soft-cap follows in fp32. install(processor) gives an instance a
LogitsGatherer: the gather, the slice and the fp32 upcast in one klgen step,
so that the slice and the cast find nothing left to do. logit_scale stays
before the gather and the soft-cap after it, where SGLang applies them, in
the same precision. deferred_argmax (speculative verification's greedy
token from the fp32 shards) runs on kl_argmax over the soft-capped row.
_gather_softcap_fused (SGLang's own one-pass gather and soft-cap of fp32
shards, taken on the GPU instead of the gatherer for a soft-capped fp32 LM
head, and by speculative verification's finish_deferred_gather) runs on
klgen's gather with the cap fused, into SGLang's logits buffer where it
fits. The LM-head all-to-all (enable_tp_lm_head_all_to_all: each rank gets
its own rows, a collective klgen does not have) stays SGLang's, each call
counted as a declined "gather".

Turn it on with KLGEN_SGLANG=1 in the environment SGLang starts with.
klgen's package declares a `sglang.srt.plugins` entry point
(klgen.integrations:sglang_plugin) that SGLang runs in every process it
starts; with the variable set it calls enable(), which hooks
LogitsProcessor.__init__ through SGLang's HookRegistry (an AFTER hook), so
that every LogitsProcessor built from then on -- each head, each with its own
vocabulary -- is installed.

What does not fit stays with SGLang's gatherer: TP 1, the attention-TP LM
head, an empty batch, logits that are not [rows, local] on a GPU. stats() and
the debug log (logger "sglang.klgen") say which calls klgen served.
enable("torch") / install(p, "torch") run the same glue on TorchGather, the
torch implementation of klgen's contract: for CPUs and tests.
"""

import logging
import types

import torch
from sglang.srt.distributed.parallel_state import get_tp_group
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import _gathers, check_backend
from ._gathers import Gathers

log = logging.getLogger("sglang.klgen")

_INIT = f"{LogitsProcessor.__module__}.LogitsProcessor.__init__"
_backend = None  # enable()'s; the hook reads it: HookRegistry patches a target once


def enable(backend="klgen"):
    """Installs klgen (`backend` "klgen", or "torch" for CPUs) in every
    LogitsProcessor this process builds from now on."""
    global _backend
    first = _backend is None
    _backend = check_backend(backend, "enable")
    if first:
        HookRegistry.register(_INIT, _built, HookType.AFTER)
        HookRegistry.apply_hooks()  # what load_plugins does after its plugins
    log.debug("klgen: every new LogitsProcessor gathers on %s", backend)


def _built(result, processor, *args, **kwargs):
    install(processor, _backend)


def install(processor, backend="klgen"):
    """Gives `processor` (SGLang's LogitsProcessor) klgen's gather and
    deferred_argmax, if it gathers over the TP group; returns it."""
    if not processor.do_tensor_parallel_all_gather or processor.use_attn_tp_group:
        log.debug("klgen: a LogitsProcessor that does not gather over the TP group is left as is")
        return processor
    gathers = Gathers(backend, get_tp_group().device_group, log, "sglang",
                      vocab_size=processor.vocab_size)
    processor.klgen = gathers
    processor._logits_gatherer = LogitsGatherer(processor.vocab_size, gathers,
                                                processor._logits_gatherer)
    processor.deferred_argmax = types.MethodType(_deferred_argmax(processor.deferred_argmax),
                                                 processor)
    processor._gather_softcap_fused = types.MethodType(
        _gather_softcap_fused(processor._gather_softcap_fused), processor)
    processor._tp_lm_head_all_to_all = _counted(
        gathers, "the LM-head all-to-all: each rank's own rows, not a gather",
        processor._tp_lm_head_all_to_all)
    return processor


def stats():
    """One entry per live installed LogitsProcessor that has been built: its
    vocabulary, the calls klgen served and those left to SGLang, by use, and
    each of its gathers' stats()."""
    return _gathers.stats("sglang")


def _unfit(gathers, logits):
    if logits.dim() != 2:
        return f"logits of shape {tuple(logits.shape)}, not [rows, local]"
    return gathers.unfit(logits.shape[0], logits.device)


class LogitsGatherer:
    """A LogitsProcessor's _logits_gatherer on klgen: [rows, local] ->
    [rows, vocab_size] in fp32; what does not fit goes to `fallback`, the
    gatherer it replaces ([rows, tp * local] in the logits' dtype: SGLang
    slices and casts that itself)."""

    def __init__(self, vocab_size, gathers, fallback):
        self.vocab_size, self.gathers, self.fallback = vocab_size, gathers, fallback

    def __call__(self, logits):
        reason = _unfit(self.gathers, logits)
        if reason is not None:
            self.gathers.decline("gather", reason)
            return self.fallback(logits)
        vocab = min(self.vocab_size, self.gathers.tp * logits.shape[-1])
        return self.gathers.get("gather", logits, vocab_size=vocab, out_dtype=torch.float32)(logits)


def _deferred_argmax(sglangs):
    """deferred_argmax on kl_argmax, `sglangs` (the bound method it replaces)
    for what does not fit."""

    def deferred_argmax(self, logits):
        reason = _unfit(self.klgen, logits)
        if reason is not None:
            self.klgen.decline("argmax", reason)
            return sglangs(logits)
        vocab = min(self.vocab_size, self.klgen.tp * logits.shape[-1])
        g = self.klgen.get("argmax", logits, vocab_size=vocab,
                           softcap=self.final_logit_softcapping)
        return g.argmax(logits)

    return deferred_argmax


def _gather_softcap_fused(sglangs):
    """_gather_softcap_fused (SGLang's gather of fp32 shards with the
    soft-cap in one Triton pass, into the logits buffer where its shape
    fits) on klgen: the gather, the slice and the cap (x / cap, tanh, * cap
    in fp32) in one step; `sglangs` (the bound method it replaces) for what
    does not fit."""

    def gather_softcap_fused(self, logits, logits_metadata, use_buffer):
        reason = _unfit(self.klgen, logits)
        if reason is not None:
            self.klgen.decline("softcap gather", reason)
            return sglangs(logits, logits_metadata, use_buffer)
        vocab = min(self.vocab_size, self.klgen.tp * logits.shape[-1])
        g = self.klgen.get("softcap gather", logits, vocab_size=vocab,
                           softcap=self.final_logit_softcapping, out_dtype=torch.float32)
        out = logits_metadata.next_token_logits_buffer if use_buffer else None
        if out is None or tuple(out.shape) != (logits.shape[0], vocab):
            return g(logits)
        return g(logits, out=out)

    return gather_softcap_fused


def _counted(gathers, reason, sglangs):
    """`sglangs` (a bound method of SGLang's that klgen does not serve), each
    call counted as a declined "gather" with `reason`."""

    def call(*args, **kwargs):
        gathers.decline("gather", reason)
        return sglangs(*args, **kwargs)

    return call
