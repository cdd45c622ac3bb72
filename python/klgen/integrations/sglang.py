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

Sampling on the shards: the target model's processor (not a draft's, not
with speculative decoding) leaves a decode step's logits ungathered (SGLang's
own deferred-gather idea, is_deferred_shard, taken to decode): forward
returns the shard [rows, local] (in the head's dtype, or fp32 where SGLang
soft-caps it), scaled and capped as SGLang does, in and out of CUDA graphs.
ModelRunner.sample, wrapped, draws the tokens from the shards with kl_sample
(kl_argmax when every row is greedy; an xgrammar grammar's bitmask applied
by kl_sample, grammar_bitmask), or finishes the gather and runs SGLang's
own sample where the step needs it: penalties, logit bias, grammars of
other backends, logprobs, custom logit processors, deterministic sampling,
sampling masks, watermarks, observers, top_k above 64, top-p with top-k or
min-p (SGLang measures top-p otherwise). A beam-search batch gets its
gathered row before SGLang captures it. Nothing is deferred where the code
the hooks rely on is not SGLang 0.5.23's (compared by the sha256 of its
source), another plugin hooks it, or the model's own code works on the
gathered logits: every step is SGLang's there, counted.
"""

import hashlib
import inspect
import logging
import types

import torch
from sglang.srt.distributed.parallel_state import get_tp_group
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.sampler import Sampler
from sglang.srt.plugins import hook_registry
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import _gathers, check_backend, unknown_code
from ._gathers import MAX_TOPK, Gathers

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
        _register_sampling()
        if hook_registry._current_plugin_source.get() is None:
            # outside SGLang's load_plugins, which applies every plugin's
            # hooks itself after the last one (a target applied early
            # would skip the later plugins' hooks)
            HookRegistry.apply_hooks()
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
    processor._get_logits = types.MethodType(_get_logits(processor._get_logits), processor)
    processor._copy_logits_to_buffer = types.MethodType(
        _copy_logits_to_buffer(processor._copy_logits_to_buffer), processor)
    processor.klgen_defer = False  # a ModelRunner's load_model turns it on (_loaded)
    processor.klgen_cap = None  # the soft-cap a deferred shard still needs
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

    defer = False  # _get_logits sets it for a decode step whose gather waits
    deferred_width = None  # the shard width a deferred step leaves

    def __call__(self, logits):
        if self.defer:
            self.deferred_width = logits.shape[-1]
            return logits
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
        if self._logits_gatherer.defer:
            self.klgen_cap = self.final_logit_softcapping
            self._logits_gatherer.deferred_width = logits.shape[-1]
            return logits
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


def _get_logits(sglangs):
    """_get_logits, its gather left to the sampler in a decode step of a
    processor whose ModelRunner samples on the shards (klgen_defer)."""

    def get_logits(self, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        self._logits_gatherer.defer = (self.klgen_defer
                                       and logits_metadata.forward_mode.is_decode())
        try:
            return sglangs(hidden_states, lm_head, logits_metadata, *args, **kwargs)
        finally:
            self._logits_gatherer.defer = False

    return get_logits


def _copy_logits_to_buffer(sglangs):
    """_copy_logits_to_buffer, which keeps a deferred shard in its dtype
    where no soft-cap follows (the sampler reads half the bytes); SGLang's
    fp32 copy otherwise, for its cap to work on."""

    def copy_logits_to_buffer(self, logits, *args, **kwargs):
        if self._logits_gatherer.defer and not self.final_logit_softcapping:
            return logits
        return sglangs(logits, *args, **kwargs)

    return copy_logits_to_buffer


# What the sampling hooks stand in for, as SGLang 0.5.23 writes it: the
# sha256 of the source of ModelRunner.sample (whose steps the hook replays:
# the preprocessing it declines, the n-gram update it keeps), Sampler.forward
# (whose choices it makes) and LogitsProcessor._get_logits (whose gatherer
# output it defers). Any other text is another SGLang, whose steps keep its
# path.
_KNOWN = {
    "ModelRunner.sample": "ee4f0890d19d3f44027eef3341b9b590848ddbefb291999a2ce2d091644fc938",
    "Sampler.forward": "f8d795ab811a696112153ed7b9b51d44c954ee10b547bb349a49744ca756ae0c",
    "LogitsProcessor._get_logits":
        "565c058034e5f7e225dec0613d65b592cb5b32dcff1dea39e65b4b919516358e"}
_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_INFO = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
_CAPTURE = "sglang.srt.beam_search.logits_capture.capture_pre_sample_logits"
# Environment switches under which SGLang's sampler reads the gathered row
# itself (its NaN probes and sanitizer).
_NAN_SWITCHES = ("SGLANG_SANITIZE_NAN_LOGITS", "SGLANG_ENABLE_NAN_LOGITS_CHECK",
                 "SGLANG_ENABLE_ASYNC_ASSERT")
_unknown_code = None  # why the hooks cannot serve this SGLang, or None


def _register_sampling():
    global _unknown_code
    from sglang.srt.model_executor.model_runner import ModelRunner

    _unknown_code = unknown_code("SGLang", "0.5.23", _KNOWN,
                                 ("ModelRunner.sample", ModelRunner.sample),
                                 ("Sampler.forward", Sampler.forward),
                                 ("LogitsProcessor._get_logits", LogitsProcessor._get_logits),
                                 unwrap=True)
    for target, hook, kind in _SAMPLING_HOOKS:
        HookRegistry.register(target, hook, kind)


def _foreign_hooks():
    """Why another plugin's hooks change what the sampling hooks rely on, or
    None (unknown_code sees through a wrapper, so it cannot)."""
    ours = {hook for _, hook, _ in _SAMPLING_HOOKS} | {_built}
    for target in _RELIED_ON:
        if any(hook not in ours for _, hook, _ in HookRegistry._hooks.get(target, ())):
            return f"another plugin hooks {target.rsplit('.', 2)[-2]}.{target.rsplit('.', 1)[1]}"
    return None


def _model_declines(model):
    """Why `model`'s own code would see a deferred shard, or None: a class
    of SGLang's models that reads or changes next_token_logits itself (as
    Gemma 4's unified model masks vocabulary ids after its processor)."""
    for cls in type(model).__mro__:
        if not cls.__module__.startswith("sglang.srt.models."):
            continue
        try:
            text = inspect.getsource(cls)
        except (OSError, TypeError):
            return f"{cls.__name__}'s source cannot be read"
        if "next_token_logits" in text:
            return f"{cls.__name__} works on the gathered logits itself"
    return None


def _loaded(result, runner, *args, **kwargs):
    """After ModelRunner.load_model, before its graphs are captured: the
    target model's one installed processor defers its decode gathers to
    runner.klgen_sampling, or runner.klgen_declines says why not."""
    processors = [m for m in runner.model.modules()
                  if isinstance(m, LogitsProcessor) and getattr(m, "klgen", None)]
    reason = (_unknown_code or _foreign_hooks() or _runner_declines(runner, processors)
              or _model_declines(runner.model))
    if reason is not None:
        runner.klgen_declines = (reason, processors[0].klgen if len(processors) == 1 else None)
        log.debug("klgen: SGLang's ModelRunner samples the gathered row: %s", reason)
        return result
    global _deferring
    processors[0].klgen_defer = True
    runner.klgen_sampling = _deferring = Sampling(processors[0])
    log.debug("klgen: SGLang's decode steps sample on the shards")
    return result


def _runner_declines(runner, processors):
    from sglang.srt.environ import envs

    if getattr(runner, "is_draft_worker", False):
        return "a draft model's runner"
    spec = getattr(runner, "spec_algorithm", None)
    if spec is not None and not spec.is_none():
        return "speculative decoding: drafts are verified on the gathered row"
    for name in _NAN_SWITCHES:
        if getattr(envs, name).get():
            return f"{name}: SGLang's sampler probes the gathered row"
    if len(processors) != 1:
        return f"{len(processors)} LogitsProcessors that gather on klgen, not one"
    if processors[0].do_tensor_parallel_all_gather_dp_attn:
        return "data-parallel attention: the logits rows are scattered after the gather"
    return None


def _sample(sglangs, runner, logits_output, forward_batch, *args, **kwargs):
    """ModelRunner.sample: a deferred decode step's tokens from the shards,
    or its gather finished and SGLang's own sample."""
    sampling = getattr(runner, "klgen_sampling", None)
    if sampling is None:
        reason, gathers = getattr(runner, "klgen_declines", (None, None))
        if gathers is not None:
            gathers.decline("sample", reason)
        return sglangs(runner, logits_output, forward_batch, *args, **kwargs)
    shard = logits_output.next_token_logits
    if not sampling.deferred(shard, forward_batch):
        return sglangs(runner, logits_output, forward_batch, *args, **kwargs)
    tokens = sampling.sample(runner, shard, forward_batch)
    if tokens is None:
        logits_output.next_token_logits = sampling.gather(shard)
        return sglangs(runner, logits_output, forward_batch, *args, **kwargs)
    # what ModelRunner.sample does besides the sampler's work
    logits_output.auxiliary_device_output = None
    runner.ngram_embedding_manager.update_after_decode(next_token_ids=tokens,
                                                       forward_batch=forward_batch)
    return tokens


def _capture(batch, forward_batch, logits_output, *args, **kwargs):
    """Before capture_pre_sample_logits: a beam-search batch reads its rows'
    logits, so a deferred shard is gathered first."""
    if batch is not None and getattr(batch, "beam_tail", None) is not None \
            and logits_output is not None:
        sampling = _deferring
        if sampling is not None and sampling.deferred(logits_output.next_token_logits,
                                                      forward_batch):
            sampling.decline("beam search: SGLang captures the rows' logits")
            logits_output.next_token_logits = sampling.gather(logits_output.next_token_logits)
    return None


# The Sampling of the runner that defers, for _capture: a TP worker process
# runs one target model, the last one loaded.
_deferring = None


class Sampling:
    """The shard sampler of one ModelRunner's deferring LogitsProcessor."""

    def __init__(self, processor):
        self.processor, self.gathers = processor, processor.klgen
        self.vocab_size = processor.vocab_size

    def deferred(self, logits, forward_batch):
        """Whether `logits` of forward_batch's step are a deferred shard: a
        decode step (its processor defers every one, in and out of graphs)
        whose logits have the width the deferred step left."""
        return (forward_batch.forward_mode.is_decode() and logits is not None
                and logits.dim() == 2
                and logits.shape[-1] == self.processor._logits_gatherer.deferred_width)

    def decline(self, reason):
        self.gathers.decline("sample", reason)

    def vocab(self, shard):
        return min(self.vocab_size, self.gathers.tp * shard.shape[-1])

    def gather(self, shard):
        """The fp32 row SGLang's processor would have returned."""
        cap = self.processor.klgen_cap
        use = "softcap gather" if cap is not None else "gather"
        return self.gathers.get(use, shard, vocab_size=self.vocab(shard), softcap=cap,
                                out_dtype=torch.float32)(shard)

    def sample(self, runner, shard, forward_batch):
        """The step's tokens from the shards, or None (counted) for SGLang's
        sample."""
        args = sampling_args(runner, forward_batch, shard)
        if not isinstance(args, str):
            # before the mask is made: a step declined after it would make it twice
            args = _unfit(self.gathers, shard) or args
        if not isinstance(args, str):
            mask = grammar_bitmask(forward_batch.sampling_info, shard.shape[0],
                                   self.vocab(shard), shard.device)
            if isinstance(mask, str):
                args = mask
            elif mask is not None:  # greedy rows too: kl_sample at T 0
                args = dict(args or dict(temperature=0.0), bitmask=mask)
        if isinstance(args, str):
            self.decline(args)
            return None
        g = self.gathers.get("sample", shard, vocab_size=self.vocab(shard),
                             softcap=self.processor.klgen_cap, topk=MAX_TOPK)
        if args is GREEDY:
            return g.argmax(shard)
        # each row's position, as SGLang's seeded sampler keys its noise
        return g.sample(shard, **args, offset=forward_batch.positions[:shard.shape[0]],
                        token_logprobs=False).tokens


GREEDY = types.MappingProxyType({})  # every row top_k 1: kl_argmax


def sampling_args(runner, forward_batch, shard):
    """kl_sample's parameters for a step of SGLang's (forward_batch's
    SamplingBatchInfo, runner's sampler): a dict, GREEDY, or why the step
    needs SGLang's sample. Host state only: nothing waits on the device."""
    info = forward_batch.sampling_info
    reason = _step_declines(runner, forward_batch, info)
    if reason is not None:
        return reason
    return _composition_args(info, shard.shape[0])


# The last composition's (flags, tensors, args): SGLang makes its tensors
# anew whenever requests join or leave. Kept here, not on the tensors: the
# views in args would keep those alive for ever.
_kept = None


def _composition_args(info, rows):
    """sampling_args' verdict and views of info's tensors for `rows` rows,
    made once per batch composition."""
    global _kept
    tensors = (info.temperatures, info.top_ks, info.top_ps, info.min_ps)
    flags = (rows, info.is_all_greedy, info.need_top_k_sampling, info.need_top_p_sampling,
             info.need_min_p_sampling)
    if _kept is not None and _kept[0] == flags and all(a is b for a, b in zip(_kept[1], tensors)):
        return _kept[2]
    args = _args(info, rows)
    _kept = (flags, tensors, args)
    return args


def _args(info, rows):
    """The parameters of `rows` rows, GREEDY, or why SGLang's sample."""
    if info.is_all_greedy:
        return GREEDY
    if info.need_top_p_sampling and info.need_min_p_sampling:
        return "top-p with min-p: SGLang filters top-p before min-p"
    host = getattr(info.top_ks, "klgen_host", None)
    if host is None:
        return "the requests' parameters and seeds are not known on the host"
    top_k = None
    if info.need_top_k_sampling:
        cut = [k for k, _, _ in host if 1 < k < info.vocab_size]
        if cut and max(cut) > MAX_TOPK:
            return f"top_k {max(cut)}: above kl_sample's {MAX_TOPK}"
        if any(1 < k < info.vocab_size and p < 1 for k, p, _ in host):
            return "top-p with top-k: SGLang measures top-p over the whole row"
        top_k = info.top_ks[:rows]
    device = info.temperatures.device
    seed = torch.tensor([seed for _, _, seed in host[:rows]], dtype=torch.int64,
                        pin_memory=device.type == "cuda").to(device, non_blocking=True)
    return dict(temperature=info.temperatures.view(-1)[:rows], top_k=top_k,
                top_p=info.top_ps[:rows] if info.need_top_p_sampling else None,
                min_p=info.min_ps[:rows] if info.need_min_p_sampling else None, seed=seed)


def _step_declines(runner, forward_batch, info):
    if not forward_batch.forward_mode.is_decode():
        return "not a decode step"
    if forward_batch.return_logprob:
        return "logprobs"
    if forward_batch.positions.dtype != torch.int64:
        return f"positions of {forward_batch.positions.dtype}, not int64"
    if info is None:
        return "no sampling info"
    sampler = runner.sampler
    if type(sampler) is not Sampler:
        return f"a sampler of class {type(sampler).__name__}, not SGLang's Sampler"
    if sampler.rl_on_policy_target is not None or sampler.enable_deterministic:
        return "deterministic inference"
    if sampler.use_ascend_backend:
        return "the Ascend sampling backend"
    observer = runner.sampling_observer
    if observer is not None and observer.is_active(info):
        return "a sampling observer"
    checks = (
        (info.has_custom_logit_processor, "a custom logit processor"),
        (info.logit_bias is not None, "logit bias"),
        (_penalized(info), "penalties"),
        (info.sampling_seed is not None, "sampling_seed"),
        (info.sampling_mask_batch_indices is not None, "a sampling mask"),
        (info.has_watermark_candidates, "a watermark"))
    for on, reason in checks:
        if on:
            return reason
    return None


def grammar_bitmask(info, rows, vocab_size, device):
    """The step's grammar mask as kl_sample takes it, int32 [rows,
    ceil(vocab_size / 32)] on device: xgrammar's bitmask, which SGLang makes
    as _preprocess_logits would (update_regex_vocab_mask: a grammar
    request's row its matcher's next-token mask, every other row all ones)
    and then drops (applied, as SGLang drops it); None when no row has a
    grammar; why SGLang's sample, for another backend's mask or a mask of
    another width."""
    grammars = [g for g in info.grammars or () if g]
    if not grammars:
        return None
    try:  # imported here: the glue needs no grammar backend to load
        from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar
    except ImportError as e:
        return f"structured output: xgrammar's backend does not import ({e})"
    if type(grammars[0]) is not XGrammarGrammar:
        return (f"structured output by {type(grammars[0]).__name__} (klgen takes "
                f"XGrammarGrammar's masks)")
    words = (vocab_size + 31) // 32
    if (info.vocab_size + 31) // 32 != words:
        return (f"structured output over a vocabulary of {info.vocab_size}, the logits' "
                f"{vocab_size}")
    info.update_regex_vocab_mask()
    held, info.grammar_mask = info.grammar_mask, None
    if held is None:
        return None
    mask = held.vocab_mask
    if mask.dtype != torch.int32 or mask.dim() != 2 or mask.shape[0] < rows or \
            mask.shape[1] != words:
        return f"structured output: a mask of {mask.dtype} {tuple(mask.shape)}"
    return mask[:rows].to(device, non_blocking=True)


def _penalized(info):
    orchestrator = info.penalizer_orchestrator
    if orchestrator is not None and orchestrator.is_required:
        return True
    # copy_for_forward (overlap scheduling) folds them into these
    return info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None


# Each request's (top_k, top_p, seed) on the host, kept on
# SamplingBatchInfo's top_ks tensor (a list of numbers: no reference back) as
# it is made, filtered and merged: SGLang's own max_top_k is None as soon as
# one request samples from the whole vocabulary, and it keeps no per-request
# seed unless deterministic inference is on.
def request_seed(rid):
    """The noise seed of SGLang's request `rid`: a hash of its id, the same
    on every rank (Python's own str hash is not), different for the
    parallel samples of one prompt, and the same again for a request of
    the same id."""
    digest = hashlib.blake2b(str(rid).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _info_made(info, cls, batch, *args, **kwargs):
    reqs = batch.reqs
    if all(getattr(r, "rid", None) is not None for r in reqs):
        info.top_ks.klgen_host = [(r.sampling_params.top_k, r.sampling_params.top_p,
                                   request_seed(r.rid)) for r in reqs]
    return info


def _info_filtered(sglangs, info, keep_indices, *args, **kwargs):
    host = getattr(info.top_ks, "klgen_host", None)
    result = sglangs(info, keep_indices, *args, **kwargs)
    if host is not None:
        info.top_ks.klgen_host = [host[i] for i in keep_indices]
    return result


def _info_merged(sglangs, info, other, *args, **kwargs):
    mine = getattr(info.top_ks, "klgen_host", None)
    theirs = getattr(other.top_ks, "klgen_host", None)
    result = sglangs(info, other, *args, **kwargs)
    if mine is not None and theirs is not None:
        info.top_ks.klgen_host = mine + theirs
    return result


# Every hook the sampling needs, and the targets whose code it relies on
# (another plugin's hook on one of them keeps SGLang's path).
_SAMPLING_HOOKS = (
    (f"{_RUNNER}.load_model", _loaded, HookType.AFTER),
    (f"{_RUNNER}.sample", _sample, HookType.AROUND),
    (_CAPTURE, _capture, HookType.BEFORE),
    (f"{_INFO}.from_schedule_batch", _info_made, HookType.AFTER),
    (f"{_INFO}.filter_batch", _info_filtered, HookType.AROUND),
    (f"{_INFO}.merge_batch", _info_merged, HookType.AROUND))
_PROCESSOR = f"{LogitsProcessor.__module__}.LogitsProcessor"
_RELIED_ON = (f"{_RUNNER}.sample", f"{_RUNNER}._preprocess_logits",
              f"{Sampler.__module__}.Sampler.forward", f"{_PROCESSOR}.forward",
              f"{_PROCESSOR}._get_logits", f"{_PROCESSOR}._copy_logits_to_buffer",
              f"{_INFO}.from_schedule_batch", f"{_INFO}.filter_batch", f"{_INFO}.merge_batch")
