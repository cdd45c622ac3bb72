"""vLLM: its LogitsProcessor on klgen, through vLLM's own extension points.

Turn it on with KLGEN_VLLM=1 in the environment vLLM starts with. klgen's
package declares a `vllm.general_plugins` entry point (klgen.integrations:
vllm_plugin) that vLLM runs in every process it starts; with the variable set
it calls enable(), which registers KlgenLogitsProcessor as the out-of-tree LogitsProcessor
(PluggableLayer.register_oot), so every LogitsProcessor a model builds from
then on -- target, draft, MTP heads, each with its own vocabulary -- is one.
In a process of your own, enable() does the same.

Each instance makes its klgen gathers from itself on first use (vocab,
org vocab, shard width, TP group, logits dtype, soft_cap, scale) and keeps
vLLM's contracts:

- _gather_logits: the unsliced all-gather [..., tp * shard] (LoRA's
  LogitsProcessorWithLoRA re-indexes it);
- _get_logits: that gather and the slice to org_vocab_size, in one step;
- forward: gather, slice, soft-cap and scale in one step (forward applies
  them nowhere else);
- get_top_tokens: kl_argmax over the soft-capped, scaled row;
- get_top_k_tokens: kl_topk, with return_log_probs its log-sum-exp of the row.

What does not fit stays with vLLM's own code: a platform that gathers to one
rank, the gathers at TP 1 (nothing to gather; the selections and the sample
take klgen there too, from the whole row), an LM head split over another
group, an empty batch, logits off the GPU, and for the selections a
vocabulary with added (LoRA) tokens, k > 64, a scale <= 0 (vLLM's error). stats() and vLLM's debug log
(VLLM_LOGGING_LEVEL=DEBUG, logger "vllm.klgen") say which calls klgen served.

Sampling without the gather: the same switch wraps the v2 model runner's
GPUModelRunner.sample (its step that computes the logits and samples them),
when vLLM has imported the runner and before the model is built. A decode
step whose requests kl_sample serves draws each logits row's token from the
shards, with the parameters vLLM's v2 Sampler keeps per request
(sampling_args), and returns the SamplerOutput vLLM's sampler would (with
logprobs in vLLM's raw_logprobs or raw_logits mode: the token's, its rank and
the top n, which gather the step's rows); any other step is vLLM's own
(batch-sharded sampling, draft tokens, processed logprobs and the rest:
KlgenLogitsProcessor.sample and sampling_args say which), counted as a
declined "sample". The wrapper
checks first that GPUModelRunner.sample and Sampler.__call__ are vLLM
0.33.0's code; where they are not, every step keeps vLLM's path, counted
and logged once. A runner of your own calls sample(model, hidden_states,
sampler, input_batch, grammar_output): the tokens, or None for vLLM's path
(logprobs=True: the tokens and the step's LogprobsTensors).

KLGEN_VLLM=torch (or enable("torch")) runs the same glue on TorchGather, the
torch implementation of klgen's contract: for CPUs and tests.
"""

import dis
import functools
import logging
import sys
import types
from typing import NamedTuple

import torch
from vllm.distributed import get_tp_group
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.logits_processor import LogitsProcessor

from . import _gathers, check_backend, unknown_code
from ._gathers import MAX_TOPK, Gathers

# Under vLLM's "vllm" logger: its handler, and its level (VLLM_LOGGING_LEVEL).
log = logging.getLogger("vllm.klgen")


def enable(backend="klgen"):
    """Makes every LogitsProcessor this process builds from now on a
    KlgenLogitsProcessor on `backend` ("klgen", or "torch" for CPUs)."""
    KlgenLogitsProcessor.backend = check_backend(backend, "enable")
    _hook_runner()
    registered = op_registry_oot.get("LogitsProcessor")
    if registered is KlgenLogitsProcessor:
        return
    if registered is not None:
        raise RuntimeError(f"vLLM's LogitsProcessor is already replaced by {registered!r}")
    PluggableLayer.register_oot(KlgenLogitsProcessor, name="LogitsProcessor")
    log.debug("klgen: LogitsProcessor replaced (backend %s)", backend)


def stats():
    """One entry per live KlgenLogitsProcessor that has been called: its
    vocabulary, the calls klgen served and those left to vLLM, by use, and
    each of its gathers' stats()."""
    return _gathers.stats("vllm")


def sample(model, hidden_states, sampler, input_batch, grammar_output, logprobs=False):
    """The token of each logits row of `input_batch`, drawn by kl_sample from
    the shards, as int64 [rows]; None where the step needs vLLM's own
    compute_logits and sampler, as a step whose requests ask for logprobs
    does unless logprobs=True: then (tokens, vLLM's LogprobsTensors of the
    step or None where no request asks). `model` is the runner's model: its logits
    must be its KlgenLogitsProcessor's alone, so a step is vLLM's where the
    processor is wrapped (LoRA's LogitsProcessorWithLoRA adds the adapter's
    logits) or the model's compute_logits does more than call it (a norm, a
    scale, masked columns), as far as _logits_source can tell. A model whose
    compute_logits only calls its language model's is followed there. The
    rest is KlgenLogitsProcessor.sample's."""
    drawn = _sample_model(model, hidden_states, None, sampler, input_batch, grammar_output,
                          logprobs=logprobs)
    return drawn if drawn is None or logprobs else drawn[0]


def _sample_model(model, hidden_states, rows, sampler, input_batch, grammar_output,
                  reason=None, logprobs=True):
    """_draw() of hidden_states[rows] (rows None: all of them): the tokens
    and their LogprobsTensors or None; None where the step is declined,
    decided before the rows are indexed (`reason` declines it; so does
    logprobs=False a step with logprobs)."""
    source, where = _source(model)
    if isinstance(source, str):
        _decline(where, source)
        return None
    processor, lm_head = source
    if reason is not None:
        processor._gathers().decline("sample", reason)
        return None
    count = _rows(hidden_states) if rows is None else rows.shape[0]
    args = processor._sample_args(count, hidden_states.device, lm_head, sampler, input_batch,
                                  grammar_output, logprobs)
    if args is None:
        return None
    return processor._draw(lm_head, hidden_states if rows is None else hidden_states[rows], args)


def _source(model):
    """_logits_source(model), worked out on the model's first step and kept
    on it: what a loaded model's compute_logits calls does not change."""
    found = model.__dict__.get("_klgen_logits_source")
    if found is None:
        found = model.__dict__["_klgen_logits_source"] = _logits_source(model)
    return found


_told = set()


def _decline(model, reason):
    """Counts a step left to vLLM on `model`'s processor where it is klgen's
    (LoRA's wrapper: its base layer), else logs the reason once."""
    processor = getattr(model, "logits_processor", None)
    base = getattr(processor, "base_layer", processor)
    if isinstance(base, KlgenLogitsProcessor):
        base._gathers().decline("sample", reason)
    elif reason not in _told:
        _told.add(reason)
        log.debug("klgen: sample stays with vLLM: %s", reason)


# The v2 model runner's module; vLLM imports it in a worker before it builds
# the model.
_RUNNER = "vllm.v1.worker.gpu.model_runner"
# What the runner hook stands in for, as vLLM 0.33.0 writes it: the sha256 of
# the source of GPUModelRunner.sample (whose non-sharded, single-sampler
# branch the hook takes), of Sampler.__call__ (whose SamplerOutput the hook
# builds) and of StructuredOutputsWorker.apply_grammar_bitmask (whose rows
# grammar_bitmask maps). Any other text is another vLLM, whose steps keep
# its path.
_KNOWN = {
    "GPUModelRunner.sample": "78982d0f9f603fccb2deeb49466213c5c045fa30c72db0582ec528a023ba2db0",
    "Sampler.__call__": "8b2c419eca0ec79cbfd937b3de0c2c66a24cae99743d016a60980036322bd9b1",
    "StructuredOutputsWorker.apply_grammar_bitmask":
        "c71541b704803a3f8b231243fe94376935a0bf0cc47a86ffff43881d1e86c105"}


def _hook_runner():
    """Wraps GPUModelRunner.sample (the v2 runner's step that computes the
    logits and samples them) once vLLM has imported it, checking first that
    it and Sampler.__call__ are the code klgen knows: where they are not,
    the wrapper keeps vLLM's path for every step, counted as a declined
    "sample" and logged once. Runs from enable() and from each
    KlgenLogitsProcessor built (in a worker, while the runner loads its
    model); wraps once."""
    runner = getattr(sys.modules.get(_RUNNER), "GPUModelRunner", None)
    if runner is None or hasattr(runner.sample, "klgen_wraps"):
        return
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    vllms = runner.sample
    unknown = unknown_code("vLLM", "0.33.0", _KNOWN, ("GPUModelRunner.sample", vllms),
                           ("Sampler.__call__", Sampler.__call__),
                           ("StructuredOutputsWorker.apply_grammar_bitmask",
                            StructuredOutputsWorker.apply_grammar_bitmask))

    def sample(self, hidden_states, input_batch, grammar_output):
        reason = unknown
        if reason is None and self.batch_sharder is not None:
            reason = "batch-sharded sampling"
        drawn = _sample_model(self.model, hidden_states, input_batch.logits_indices,
                              self.sampler, input_batch, grammar_output, reason)
        if drawn is None:
            return vllms(self, hidden_states, input_batch, grammar_output)
        tokens, logprobs = drawn
        # as Sampler.__call__ counts a step of one logits row per request
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            input_batch.seq_lens.new_ones(input_batch.num_reqs), input_batch.seq_lens,
            input_batch.cu_num_logits, input_batch.idx_mapping,
            self.sampler.req_states.prefill_len.gpu)
        out = SamplerOutput(sampled_token_ids=tokens.view(-1, 1), logprobs_tensors=logprobs,
                            num_nans=None, num_sampled=num_sampled, num_rejected=num_rejected,
                            sampling_mask_tensors=None)
        return out, num_sampled, num_rejected

    sample.klgen_wraps = vllms
    runner.sample = sample
    log.debug("klgen: GPUModelRunner.sample wrapped%s",
              f"; every step stays with vLLM: {unknown}" if unknown else "")


# What a plain compute_logits does -- `return self.logits_processor(self.lm_head,
# hidden_states)`, maybe through a local -- in bytecode: loads, the call, the
# return. Anything else (arithmetic, a subscript store, a branch, another
# attribute) is a model's own step after the processor. The names it reads
# say where its LM head is: lm_head, the tied embedding (Gemma's), or
# InternLM2's output.
_PLAIN_HEADS = {frozenset(("logits_processor", "lm_head")): ("lm_head",),
                frozenset(("logits_processor", "model", "embed_tokens")): ("model", "embed_tokens"),
                frozenset(("logits_processor", "output")): ("output",)}
# By name, as CPython 3.10 to 3.14 spell them.
_PLAIN_OPS = frozenset((
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "NOT_TAKEN", "COPY_FREE_VARS", "MAKE_CELL",
    "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW",
    "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "LOAD_ATTR", "LOAD_METHOD", "LOAD_CONST", "PUSH_NULL",
    "PRECALL", "KW_NAMES", "CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD",
    "STORE_FAST", "STORE_FAST_LOAD_FAST", "POP_TOP", "RETURN_VALUE", "RETURN_CONST"))
# Attributes a model's compute_logits may hand the whole job to (vision and
# audio models: their language model's).
_DELEGATES = ("language_model", "model", "llm")


@functools.cache
def _plain_names(code):
    """The names a compute_logits' code reads, or None where it does more
    than loads, the call and the return; once per code object, not per step."""
    if not all(i.opname in _PLAIN_OPS for i in dis.get_instructions(code)):
        return None
    return frozenset(code.co_names)


def _logits_source(model):
    """((processor, lm_head), model) where model.compute_logits' logits are
    that processor's on that head, or (a str saying why that cannot be
    known, the model that said it: a hand-off's inner one)."""
    for _ in range(4):
        fn = getattr(type(model), "compute_logits", None)
        code = getattr(fn, "__code__", None)
        if code is None:
            return f"{type(model).__name__} has no compute_logits of its own", model
        names = _plain_names(code)
        if names is None:
            return f"{type(model).__name__}.compute_logits does more than its LogitsProcessor", model
        inner = [a for a in _DELEGATES if names == {"compute_logits", a}]
        if inner:
            model = getattr(model, inner[0], None)
            continue
        head = _PLAIN_HEADS.get(names)
        if head is None:
            return f"{type(model).__name__}.compute_logits does more than its LogitsProcessor", model
        processor = getattr(model, "logits_processor", None)
        if type(processor) is not KlgenLogitsProcessor:
            what = type(processor).__name__
            return f"the model's logits processor is {what}" + (
                ", which adds LoRA's logits" if "LoRA" in what else ", not klgen's"), model
        lm_head = model
        for name in head:
            lm_head = getattr(lm_head, name, None)
        if lm_head is None:
            return "the model has no LM head", model
        return (processor, lm_head), model
    return f"{type(model).__name__}.compute_logits: too many models deep", model


# The v2 Sampler's own per-request processors, with the flags that say a
# request uses one; any other processor makes every step vLLM's. kl_sample
# applies each: the penalties and the logit bias state's lists (allowed ids,
# bias, min_tokens) from vLLM's own tables, the bad words as the columns
# they ban in the step (bad_words_banned).
_PROCESSOR_FLAGS = {"LogitBiasState": "use_logit_bias", "PenaltiesState": "use_penalty",
                    "BadWordsState": "num_bad_words"}
_SERVED = ("PenaltiesState", "LogitBiasState", "BadWordsState")
# What the glue reads of LogitBiasState, of BadWordsState, and of the
# request state BadWordsState reads.
_LIST_PARTS = ("num_allowed_token_ids", "allowed_token_ids", "num_logit_bias",
               "logit_bias_token_ids", "logit_bias", "min_lens", "num_stop_token_ids",
               "stop_token_ids", "restore_when_all_masked")
_BAD_WORD_PARTS = ("bad_word_token_ids", "bad_word_offsets", "num_bad_words", "req_states")
_REQUEST_PARTS = ("all_token_ids", "prompt_len", "total_len")


def sampling_args(sampler, input_batch, max_top_k, vocab_size=None):
    """LogitsGather.sample's parameters for the logits rows of `input_batch`
    (vLLM's InputBatch) from `sampler` (vLLM's v2 Sampler,
    vllm.v1.worker.gpu.sample.sampler): each row's temperature, top_k,
    top_p, min_p, its request's seed (vLLM draws one for a request without)
    and its position as the offset, so a request's draws differ step by step
    and repeat with its seed. A filter no request of the step uses is None,
    as vLLM's sampler skips it (read from its host copies): a step without
    filters is sampled from the shards, never gathered. A str instead says
    why the step needs vLLM's own sampler; max_top_k is the spec's topk,
    vocab_size its vocabulary.

    kl_sample reads vLLM's own tables where they are: the sampling states
    through the batch's expanded_idx_mapping (state_rows), the positions
    through its logits_indices (offset_rows). What a step's requests ask for
    changes only when a request is added, so it is worked out once per batch
    composition (the request slots of the rows, in order) and kept until the
    sampler adds a request: a step of a known composition reads no request
    state and launches no kernel of its own but where a request has bad
    words (below). Where vLLM's top_k for off (its
    vocabulary) is not at least vocab_size (kl_sample's off), the rows'
    parameters are gathered once per composition instead. A step whose
    requests are all greedy is temperature 0.0 for every row and nothing
    else (GREEDY): its token is the argmax, which the glue takes with
    kl_argmax.

    kl_sample also applies vLLM's penalties, reading its PenaltiesState's
    tables where they are (its per-request penalties, prompt_bin_mask and
    output_bin_counts, through state_rows), where a request of the step
    uses one; and LogitBiasState's allowed ids, logit bias and min_tokens
    the same way (min_tokens' position: the rows' offsets, vLLM's
    positions), but for a structured-output request's restore of its stop
    ids (vLLM's restore_when_all_masked), a function of the whole row; and
    BadWordsState's bad words, as the columns they ban in the step
    (bad_words_banned, from its tables and the requests' tokens, over the
    step's words' width where the glue saw their requests added: where a
    request of the step has bad words, about seventy torch operations on a
    composition's first step, which lays its words out, and thirty on each
    step after, which compares them with the outputs)."""
    reason = _step_declines(sampler, input_batch)
    if reason is not None:
        return reason
    plans = _plans(sampler)
    key = (max_top_k, vocab_size, input_batch.idx_mapping_np.tobytes())
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plan = plans[key] = _plan(sampler, input_batch, max_top_k, vocab_size)
    if isinstance(plan, str) or plan is GREEDY:
        return plan
    step = dict(offset=input_batch.positions, offset_rows=input_batch.logits_indices)
    if isinstance(plan, _Tables):
        # read each step: vLLM moves its tables between buffers as it writes them
        states = sampler.sampling_states
        step.update(temperature=states.temperature.gpu, seed=states.seeds.gpu,
                    state_rows=input_batch.expanded_idx_mapping,
                    top_k=states.top_k.gpu if plan.top_k else None,
                    top_p=states.top_p.gpu if plan.top_p else None,
                    min_p=states.min_p.gpu if plan.min_p else None)
        if plan.penalties is not None:
            pen = plan.penalties
            step.update(repetition_penalty=pen.repetition_penalty.gpu,
                        frequency_penalty=pen.frequency_penalty.gpu,
                        presence_penalty=pen.presence_penalty.gpu,
                        prompt_mask=pen.prompt_bin_mask, output_counts=pen.output_bin_counts)
        if plan.lists is not None:
            lb = plan.lists
            step.update(allowed_token_ids=(lb.num_allowed_token_ids.gpu, lb.allowed_token_ids.gpu),
                        logit_bias=(lb.num_logit_bias.gpu, lb.logit_bias_token_ids.gpu,
                                    lb.logit_bias.gpu),
                        min_tokens=(lb.min_lens.gpu, lb.num_stop_token_ids.gpu,
                                    lb.stop_token_ids.gpu, None))
        step.update(_logprobs_args(plan.logprobs, sampler))
        if plan.bad_words is not None:
            bw, req = plan.bad_words, plan.bad_words.req_states
            rows = input_batch.expanded_idx_mapping
            if not plan.bad_layout:  # the words' places: a composition's first step
                plan.bad_layout.append(bad_words_layout(
                    bw.bad_word_token_ids.gpu[:, :plan.bad_tokens], bw.bad_word_offsets.gpu,
                    bw.num_bad_words.gpu, rows, plan.bad_width))
            step["banned"] = bad_words_step(plan.bad_layout[0], req.all_token_ids.gpu,
                                            req.prompt_len.gpu, req.total_len.gpu, rows)
        return step
    return dict(plan, **step)


def logprobs_tensors(drawn):
    """vLLM's LogprobsTensors of a klgen Sample with logprobs and ranks, as
    its compute_topk_scores returns them for one logits row a request: each
    row's token then its top n (ids int64, logprobs float32 [rows, n + 1]),
    and the token's rank."""
    from vllm.v1.outputs import LogprobsTensors

    ids, values = drawn.tokens[:, None], drawn.logprobs[:, None]
    if drawn.top_logprobs is not None:
        ids = torch.cat((ids, drawn.top_logprobs.indices), dim=1)
        values = torch.cat((values, drawn.top_logprobs.values), dim=1)
    return LogprobsTensors(logprob_token_ids=ids, logprobs=values,
                           selected_token_ranks=drawn.ranks)


def bad_words_banned(token_ids, offsets, count, all_token_ids, prompt_len, total_len, rows,
                     width, local_pos=None, input_ids=None):
    """The columns vLLM's BadWordsState sets to -inf in each logits row, as
    kl_sample's banned: int32 [rows, width], -1 where a word bans nothing.
    The tables are vLLM's, per request state: token_ids [states, K] (each
    state's words end to end), offsets [states, >= width + 1] (where each
    starts, then where the last ends), count [states] (its words),
    all_token_ids [states, max_model_len], prompt_len and total_len
    [states]; rows: each row's state (expanded_idx_mapping); width: the most
    words a request of the step has. Word w of a row bans its last token
    where the tokens before that end the row's output (its drafts before the
    row included: local_pos, the row's place among its request's rows, and
    input_ids, each row's input token, as vLLM's kernel reads them; None:
    no drafts). A word of no tokens bans nothing (vLLM's frontend stores
    none; its kernel would read the token before). Torch operations on the
    tables' device, no host read: a step's rows are worked out at once.
    bad_words_layout then bad_words_step: the glue keeps the layout of a
    composition's rows, which only an added request changes."""
    if width < 1:
        return torch.full((rows.shape[0], 0), -1, dtype=torch.int32, device=rows.device)
    layout = bad_words_layout(token_ids, offsets, count, rows, width)
    return bad_words_step(layout, all_token_ids, prompt_len, total_len, rows, local_pos,
                          input_ids)


class BadWordsLayout(NamedTuple):
    """What bad_words_banned reads of the words' tables for a step's rows:
    each flat position's word, its place in that word and whether it is in
    the word's prefix, each word's prefix length, whether it bans, and its
    last token. None of it changes until a request is added."""

    tokens: torch.Tensor  # [n, K] the rows' words end to end
    word: torch.Tensor  # [n, K]
    at: torch.Tensor  # [n, K]
    word_prefix: torch.Tensor  # [n, K]
    in_prefix: torch.Tensor  # [n, K]
    valid: torch.Tensor  # [n, width]
    last: torch.Tensor  # [n, width]


def bad_words_layout(token_ids, offsets, count, rows, width):
    """bad_words_banned's reading of the words' tables for `rows` (width
    >= 1): a BadWordsLayout."""
    rows = rows.long()
    n, device = rows.shape[0], rows.device
    tokens = token_ids[rows]  # [n, K]
    k_max = tokens.shape[1]
    start = offsets[rows, :width].long().clamp(0, k_max)
    end = offsets[rows, 1:width + 1].long().clamp(0, k_max)
    listed = torch.arange(width, device=device) < count[rows, None].long()
    valid = listed & (end > start)
    # each flat position's word: how many of the row's words end at or before it
    ends = torch.zeros(n, k_max + 1, dtype=torch.long, device=device)
    ends.scatter_add_(1, torch.where(listed, end, k_max), listed.long())
    word = ends[:, :k_max].cumsum(1).clamp(max=width - 1)
    at = torch.arange(k_max, device=device) - start.gather(1, word)  # place in its word
    word_prefix = (end - start - 1).gather(1, word)
    in_prefix = valid.gather(1, word) & (at >= 0) & (at < word_prefix)
    last = tokens.gather(1, (end - 1).clamp(0, max(k_max - 1, 0)))
    return BadWordsLayout(tokens, word, at, word_prefix, in_prefix, valid, last)


def bad_words_step(layout, all_token_ids, prompt_len, total_len, rows, local_pos=None,
                   input_ids=None):
    """bad_words_banned from a layout of the same rows: each word's prefix
    against the end of its row's output, this step's."""
    rows = rows.long()
    n, width = rows.shape[0], layout.valid.shape[1]
    out_len = (total_len[rows] - prompt_len[rows]).long()
    drafts = 0 if local_pos is None else local_pos.long()
    seen = (out_len + drafts)[:, None] - layout.word_prefix + layout.at  # the output position
    column = (prompt_len[rows].long()[:, None] + seen).clamp(0, all_token_ids.shape[1] - 1)
    actual = all_token_ids[rows[:, None], column]
    if local_pos is not None and input_ids is not None:
        # past the committed output: the row's request's input ids (its drafts)
        first = torch.arange(n, device=rows.device) - drafts
        spec = (first[:, None] + seen - out_len[:, None] + 1).clamp(0, n - 1)
        actual = torch.where(seen >= out_len[:, None], input_ids.to(actual.dtype)[spec], actual)
    wrong = layout.in_prefix & ((seen < 0) | (actual != layout.tokens))
    misses = torch.zeros(n, width + 1, dtype=torch.long, device=rows.device)
    misses.scatter_add_(1, torch.where(layout.in_prefix, layout.word, width), wrong.long())
    return torch.where(layout.valid & (misses[:, :width] == 0), layout.last, -1).to(torch.int32)


class _Tables(NamedTuple):
    """A composition's plan that reads vLLM's tables each step: which
    filters its requests use, vLLM's PenaltiesState where one uses a
    penalty, its LogitBiasState where one uses a list, its BadWordsState
    where one has bad words (else None), the most words a request has and
    the most tokens its words take (None: not known, their table's width),
    the top logprobs its steps return (None: no logprobs), and where it has
    bad words a list that keeps their BadWordsLayout from its first step."""

    top_k: bool
    top_p: bool
    min_p: bool
    penalties: object = None
    lists: object = None
    bad_words: object = None
    bad_width: int = 0
    bad_tokens: object = None
    logprobs: object = None
    bad_layout: object = None


# sampling_args of a step whose requests are all greedy: every filter, the
# seed and the offset change nothing of an argmax.
GREEDY = types.MappingProxyType(dict(temperature=0.0, top_k=None, top_p=None, min_p=None,
                                     seed=0))


# Compositions a sampler keeps plans for between two added requests (requests
# that finish make new ones without an add).
_MAX_PLANS = 256


def _plans(sampler):
    """`sampler`'s plans by composition, emptied whenever it adds a request
    (which rewrites that slot's state): its add_request is wrapped on first
    sight, on the instance, and notes the tokens of each slot's bad words
    (_bad_tokens)."""
    plans = sampler.__dict__.get("_klgen_plans")
    if plans is None:
        plans = sampler.__dict__["_klgen_plans"] = {}
        tokens = sampler.__dict__["_klgen_bad_tokens"] = {}
        add = sampler.add_request

        def add_request(req_idx, sampling_params):
            try:
                return add(req_idx, sampling_params)
            finally:
                plans.clear()
                words = getattr(sampling_params, "bad_words_token_ids", None) or ()
                tokens[int(req_idx)] = sum(map(len, words))

        sampler.add_request = add_request
    return plans


def _plan(sampler, input_batch, max_top_k, vocab_size):
    """_Tables, or the per-row parameters but the offset, on the device, of
    the rows of `input_batch`, or why its requests need vLLM's sampler."""
    reason = _requests_decline(sampler, input_batch.idx_mapping_np, max_top_k)
    if reason is not None:
        return reason
    rows, states = input_batch.expanded_idx_mapping, sampler.sampling_states
    requests = input_batch.idx_mapping_np
    penalties = _processor_used(sampler, requests, "PenaltiesState")
    lists = _processor_used(sampler, requests, "LogitBiasState")
    if lists is not None:
        missing = _missing(lists, _LIST_PARTS)
        if missing:
            return f"vLLM's LogitBiasState has no {missing} (another vLLM)"
        if lists.restore_when_all_masked.np[requests].any():
            return "min_tokens' stop ids restored where nothing else is left (a grammar's)"
    bad = _processor_used(sampler, requests, "BadWordsState")
    if bad is not None:
        missing = _missing(bad, _BAD_WORD_PARTS) or _missing(bad.req_states, _REQUEST_PARTS)
        if missing:
            return f"vLLM's BadWordsState has no {missing} (another vLLM)"
    used_any = penalties is not None or lists is not None or bad is not None
    if used_any and vocab_size is not None and states.vocab_size != vocab_size:
        return (f"logits processors over vLLM's vocabulary of {states.vocab_size}, not the "
                f"spec's {vocab_size}")
    n = _logprobs_count(sampler, requests)
    # vLLM's greedy rows: temperature 0 (an argmax, but of processed logits)
    if not states.temperature.np[requests].any() and not used_any and n is None:
        return GREEDY
    used = _Tables(_used(states.top_k, requests, states.vocab_size),  # vLLM's off: its vocabulary
                   _used(states.top_p, requests, 1.0), _used(states.min_p, requests, 0.0),
                   penalties, lists, bad,
                   0 if bad is None else int(bad.num_bad_words.np[requests].max()),
                   None if bad is None else _bad_tokens(sampler, bad, requests), n,
                   None if bad is None else [])
    if vocab_size is None or states.vocab_size >= vocab_size:
        return used
    top_k = top_p = min_p = None
    if used.top_k:
        top_k = states.top_k.gpu[rows]  # int32, as kl_sample reads it
        top_k = top_k.masked_fill(top_k >= states.vocab_size, 0)  # klgen's off: 0
    if used.top_p:
        top_p = states.top_p.gpu[rows]
    if used.min_p:
        min_p = states.min_p.gpu[rows]
    return dict(temperature=states.temperature.gpu[rows], top_k=top_k, top_p=top_p,
                min_p=min_p, seed=states.seeds.gpu[rows], **_logprobs_args(n, sampler))


def _logprobs_args(n, sampler):
    """LogitsGather.sample's keywords for a step returning n top logprobs
    (None: none): the tokens' logprobs and ranks, and the top n, in the
    sampler's logprobs_mode (raw_logprobs or raw_logits)."""
    if n is None:
        return {}
    return dict(logprobs=n, ranks=True, token_logprobs=True, logprobs_mode=sampler.logprobs_mode)


def _bad_tokens(sampler, bad, requests):
    """The most tokens the bad words of a request of the slots `requests`
    take, where the glue saw each such request added; else None."""
    noted = sampler.__dict__.get("_klgen_bad_tokens", {})
    counts = [noted.get(int(r)) for r in requests[bad.num_bad_words.np[requests] > 0]]
    return None if None in counts else max(max(counts), 1)


def _missing(obj, parts):
    """The first of `parts` that obj lacks (another vLLM), or None."""
    return next((part for part in parts if not hasattr(obj, part)), None)


def _processor_used(sampler, requests, name):
    """vLLM's processor of class `name` (PenaltiesState, LogitBiasState,
    BadWordsState) where a request of the slots `requests` uses it, else
    None."""
    for processor in sampler.logits_processors:
        if type(processor).__name__ == name:
            used = getattr(processor, _PROCESSOR_FLAGS[name])
            return processor if getattr(used, "np", used)[requests].any() else None
    return None


def _used(buffer, requests, off):
    """Whether a request of the step sets a filter, from vLLM's host copy of
    it (as its sampler decides whether to apply the filter at all)."""
    return bool((buffer.np[requests] != off).any())


# What the glue reads of vLLM's v2 Sampler. A vLLM without one of them is
# another vLLM: its steps stay with its sampler (a missing part never reads
# as a feature turned off).
_SAMPLER_PARTS = ("sampling_states", "logits_processors", "thinking_budget_state",
                  "trace_replay_state", "return_sampling_mask", "get_logprobs_dims",
                  "compute_nans", "use_fp64_gumbel", "add_request")
_sampler_class = []  # vLLM's v2 Sampler, imported on first use


def grammar_bitmask(grammar_output, input_batch, rows, vocab_size, device):
    """The runner's grammar bitmask as kl_sample takes it, int32 [rows,
    ceil(vocab_size / 32)] on device: the row of each structured-output
    request its mask (GrammarOutput.grammar_bitmask holds mask_stride rows a
    request, in structured_output_request_ids' order, of which a step
    without drafts uses the first), every other row all ones; None when no
    request of the batch has a grammar; a reason to decline for a mask of
    another layout."""
    ids = list(grammar_output.structured_output_request_ids)
    masks = grammar_output.grammar_bitmask
    words = (vocab_size + 31) // 32
    if not ids:
        return None
    if rows != len(input_batch.req_ids):  # a request's row is its index in req_ids
        return (f"structured output: {rows} logits rows for {len(input_batch.req_ids)} "
                f"requests")
    if (getattr(masks, "ndim", 0) != 2 or masks.shape[1] != words
            or masks.shape[0] % len(ids) or str(masks.dtype) != "int32"):
        return (f"structured output: a bitmask of shape {getattr(masks, 'shape', None)}, not "
                f"int32 [requests x k, {words}]")
    where = {req: i for i, req in enumerate(input_batch.req_ids)}
    found = [(where[req], i) for i, req in enumerate(ids) if where.get(req, rows) < rows]
    if not found:
        return None
    at, picked = zip(*found)
    stride = masks.shape[0] // len(ids)
    out = torch.full((rows, words), -1, dtype=torch.int32, device=device)
    own = torch.from_numpy(masks[[i * stride for i in picked]]).to(device, non_blocking=True)
    out[torch.tensor(at, device=device)] = own
    return out


def _step_declines(sampler, input_batch):
    """Why vLLM must sample this step itself, from what can change between
    two steps of one composition (the sampler's own settings), or None."""
    if not _sampler_class:
        from vllm.v1.worker.gpu.sample.sampler import Sampler

        _sampler_class.append(Sampler)
    if type(sampler) is not _sampler_class[0]:  # a subclass samples its own way (watermarks)
        return f"sampler {type(sampler).__name__}, not vLLM's v2 Sampler"
    if "_klgen_plans" not in sampler.__dict__:
        missing = _missing(sampler, _SAMPLER_PARTS)
        if missing:
            return f"vLLM's Sampler has no {missing} (another vLLM)"
    if input_batch.num_draft_tokens:
        return "draft tokens: rejection sampling"
    if sampler.trace_replay_state is not None:
        return "trace replay"
    if sampler.return_sampling_mask:
        return "the sampling mask is asked for"
    if sampler.compute_nans:  # VLLM_COMPUTE_NANS_IN_LOGITS: a count of the gathered logits
        return "NaNs in the logits are counted"
    if sampler.use_fp64_gumbel:
        return "fp64 Gumbel noise is asked for"
    return None


def _requests_decline(sampler, requests, max_top_k):
    """Why a request of the slots `requests` needs vLLM's sampler, or None."""
    reason = _logprobs_declines(sampler, requests, max_top_k)
    if reason is not None:
        return reason
    for processor in sampler.logits_processors:
        flag = _PROCESSOR_FLAGS.get(type(processor).__name__)
        if flag is None or not hasattr(processor, flag):
            return f"logits processor {type(processor).__name__}"
        used = getattr(processor, flag)
        if type(processor).__name__ not in _SERVED and getattr(used, "np", used)[requests].any():
            return f"a request uses {type(processor).__name__}"
    budget = sampler.thinking_budget_state
    if not hasattr(budget, "enabled") or (
            budget.enabled and (not hasattr(budget, "use_thinking_budget") or
                                budget.use_thinking_budget[requests].any())):
        return "a thinking budget"
    return _params_declines(sampler.sampling_states, requests, max_top_k)


def _logprobs_count(sampler, requests):
    """The top logprobs a step of the slots `requests` returns (vLLM's
    num_logprobs: the most a request asks for, 0 for the token's alone), or
    None where no request asks for logprobs."""
    dims = sampler.get_logprobs_dims(requests)
    return None if dims is None else dims[0]


def _logprobs_declines(sampler, requests, max_top_k):
    """Why the slots' logprobs need vLLM's sampler, or None. kl_sample
    returns vLLM's raw_logprobs or raw_logits (of the logits the grammar
    leaves), the token's rank and the top n up to its spec's topk; not the
    processed modes, nor a request's own logprob_token_ids."""
    dims = sampler.get_logprobs_dims(requests)
    if dims is None:
        return None
    mode = getattr(sampler, "logprobs_mode", None)
    if mode not in ("raw_logprobs", "raw_logits"):
        return f"logprobs in vLLM's {mode} mode"
    if dims[1]:
        return "a request's own logprob_token_ids"
    if dims[0] > max_top_k:
        return f"{dims[0]} top logprobs, beyond the spec's {max_top_k}"
    return None


def _params_declines(states, requests, max_top_k):
    """Why a request's parameters are outside kl_sample's domain (its row
    would get token -1), or None; vLLM's own checks make that rare."""
    t, p, mp = (states.temperature.np[requests], states.top_p.np[requests],
                states.min_p.np[requests])
    k = states.top_k.np[requests]
    if not ((t >= 0) & (t < float("inf"))).all():
        return "a temperature outside [0, inf)"
    if not ((p > 0) & (p <= 1) & (mp >= 0) & (mp <= 1)).all():
        return "a top_p outside (0, 1] or a min_p outside [0, 1]"
    bad = (k < 0) | ((k > max_top_k) & (k < states.vocab_size))
    if bad.any():
        return f"top_k {int(k[bad][0])}: kl_sample takes 0 ... {max_top_k}, or off"
    return None


def _rows(hidden_states):
    return hidden_states.shape[:-1].numel()


def _gathered(g, logits):
    """g over logits [..., shard]: the rows flattened, the result shaped back."""
    out = g(logits.reshape(-1, logits.shape[-1]))
    return out.view(*logits.shape[:-1], out.shape[-1])


class KlgenLogitsProcessor(LogitsProcessor):
    """vLLM's LogitsProcessor with its gathers and vocab-parallel selections
    on klgen where the instance fits (the module's docstring says when)."""

    backend = "klgen"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.klgen = None  # Gathers, made on first use: the shard is known then
        _hook_runner()

    def _gathers(self):
        if self.klgen is None:
            self.klgen = Gathers(self.backend, get_tp_group().device_group, log, "vllm",
                                 vocab_size=self.vocab_size, org_vocab_size=self.org_vocab_size)
        return self.klgen

    def _declines(self, rows, device, lm_head=None, gather=True):
        """Why a call on `rows` rows on `device` stays with vLLM, or None
        (gather=False: a selection's or a sample's, served at TP 1 too)."""
        tp = self._gathers().tp
        if not self.use_all_gather:
            return "the platform gathers to one rank"
        if lm_head is not None and lm_head.tp_size != tp:
            return f"the LM head is split {lm_head.tp_size} ways, the TP group has {tp} ranks"
        if lm_head is not None and lm_head.num_embeddings_padded < self.org_vocab_size:
            return "the LM head is narrower than org_vocab_size"
        return self._gathers().unfit(rows, device, gather)

    def _select_declines(self, rows, device, lm_head, k=1):
        """_declines for the selections (get_top_tokens, get_top_k_tokens,
        sample), which also need gathered columns that are token ids and a k
        kl_topk has."""
        if self.scale <= 0.0 and self.scale != 1.0:
            return "a scale <= 0 (vLLM refuses it)"
        if lm_head.num_added_embeddings:
            return "added vocabulary: gathered columns are not token ids"
        if not 0 < k <= min(MAX_TOPK, self.org_vocab_size):
            return f"k {k} beyond kl_topk's 1 ... {MAX_TOPK}"
        return self._declines(rows, device, lm_head, gather=False)

    def _spec(self, epilogue=True, **fields):
        """The fields of this instance's spec: the org vocabulary, and with
        epilogue forward's soft-cap and scale."""
        if epilogue:
            fields["softcap"] = self.soft_cap
            fields["scale"] = self.scale if self.scale != 1.0 else None
        return dict(vocab_size=self.org_vocab_size, **fields)

    def _gather_logits(self, logits):
        # vLLM's contract: only the gather; the slice is _get_logits'.
        reason = self._declines(logits.shape[:-1].numel(), logits.device)
        if reason is not None:
            self._gathers().decline("gather", reason)
            return super()._gather_logits(logits)
        g = self._gathers().get("gather", logits, vocab_size=self._gathers().tp * logits.shape[-1])
        return _gathered(g, logits)

    def _get_logits(self, hidden_states, lm_head, embedding_bias, skip_gather=False):
        reason = self._declines(_rows(hidden_states), hidden_states.device, lm_head)
        if skip_gather or reason is not None:
            if reason is not None:
                self._gathers().decline("logits", reason)
            return super()._get_logits(hidden_states, lm_head, embedding_bias, skip_gather)
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        g = self._gathers().get("logits", logits, **self._spec(epilogue=False))
        return _gathered(g, logits)

    def forward(self, lm_head, hidden_states, embedding_bias=None, skip_gather=False):
        # LogitsProcessorWithLoRA runs this forward on itself: vLLM's then.
        if not isinstance(self, KlgenLogitsProcessor) or self.logits_as_input or skip_gather:
            return LogitsProcessor.forward(self, lm_head, hidden_states, embedding_bias,
                                           skip_gather)
        if self._declines(_rows(hidden_states), hidden_states.device, lm_head):
            return super().forward(lm_head, hidden_states, embedding_bias)  # _get_logits counts it
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        return _gathered(self._gathers().get("forward", logits, **self._spec()), logits)

    def get_top_tokens(self, lm_head, hidden_states, embedding_bias=None):
        reason = self._select_declines(_rows(hidden_states), hidden_states.device, lm_head)
        if reason is not None:
            self._gathers().decline("argmax", reason)
            return super().get_top_tokens(lm_head, hidden_states, embedding_bias)
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        return self._gathers().get("argmax", logits, **self._spec()).argmax(logits)

    def sample(self, lm_head, hidden_states, sampler, input_batch, grammar_output,
               embedding_bias=None, logprobs=False):
        """The token of each logits row of `input_batch`, drawn by kl_sample
        from the shards with the parameters `sampler` (vLLM's v2 Sampler)
        keeps (sampling_args), as int64 [rows]; None where the step needs
        vLLM's sampler (counted as a declined "sample", the reason logged),
        as a step whose requests ask for logprobs does unless logprobs=True:
        then (tokens, vLLM's LogprobsTensors or None).
        hidden_states are the rows' ([rows, hidden]: the runner's
        hidden_states[input_batch.logits_indices]); the logits are those
        forward returns (soft-capped, scaled). grammar_output: the runner's,
        None or its GrammarOutput, whose bitmask kl_sample applies
        (grammar_bitmask)."""
        args = self._sample_args(_rows(hidden_states), hidden_states.device, lm_head, sampler,
                                 input_batch, grammar_output, logprobs)
        if args is None:
            return None
        drawn = self._draw(lm_head, hidden_states, args, embedding_bias)
        return drawn if logprobs else drawn[0]

    def _sample_args(self, rows, device, lm_head, sampler, input_batch, grammar_output,
                     logprobs=True):
        """sample's parameters for `rows` rows on `device`, or None with the
        step's decline counted: decided before the hidden rows are indexed.
        logprobs=False: a step whose requests ask for logprobs is declined
        (the caller takes tokens alone)."""
        reason = self._select_declines(rows, device, lm_head)
        if reason is None:
            args = sampling_args(sampler, input_batch, MAX_TOPK, self.vocab_size)
            mask = None
            if not isinstance(args, str) and grammar_output is not None:
                mask = grammar_bitmask(grammar_output, input_batch, rows, self.vocab_size, device)
            if isinstance(mask, str):
                args = mask
            elif mask is not None:  # a grammar's step: kl_sample, greedy rows too
                args = dict(args, bitmask=mask)
            if not isinstance(args, str) and "ranks" in args and not logprobs:
                args = "logprobs, and the caller takes tokens alone (sample(logprobs=True))"
            if not isinstance(args, str):
                return args
            reason = args
        self._gathers().decline("sample", reason)
        return None

    def _draw(self, lm_head, hidden_states, args, embedding_bias=None):
        """The rows' tokens, and vLLM's LogprobsTensors of a step whose
        requests ask for logprobs (args with ranks), else None."""
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        # vLLM's noise: a seeded request draws vLLM's tokens on either path
        g = self._gathers().get("sample", logits, **self._spec(topk=MAX_TOPK, noise="vllm"))
        if args is GREEDY:  # kl_argmax: kl_sample's greedy order, a lighter kernel
            return g.argmax(logits), None
        if "ranks" not in args:
            return g.sample(logits, **args, token_logprobs=False).tokens, None
        drawn = g.sample(logits, **args)
        return drawn.tokens, logprobs_tensors(drawn)

    def get_top_k_tokens(self, lm_head, hidden_states, k, embedding_bias=None, *,
                         return_log_probs=False):
        reason = self._select_declines(_rows(hidden_states), hidden_states.device, lm_head, k)
        if reason is not None:
            self._gathers().decline("topk", reason)
            return super().get_top_k_tokens(lm_head, hidden_states, k, embedding_bias,
                                            return_log_probs=return_log_probs)
        logits = self._apply_head(lm_head, hidden_states, embedding_bias)
        # With log-probs vLLM selects on the soft-capped, scaled row; without,
        # on the raw row, then caps and scales the k values in fp32.
        spec = self._spec(epilogue=return_log_probs, topk=k)
        top = self._gathers().get("topk", logits, **spec).topk(logits)
        if return_log_probs:
            return top.indices, top.values - top.lse[:, None]
        values = top.values
        if self.scale != 1.0:
            values = values * self.scale
        if self.soft_cap is not None:
            values = torch.tanh(values / self.soft_cap) * self.soft_cap
        return top.indices, values
