"""SGLang's own LogitsProcessor (the installed sglang, 0.5.23 in CI:
.ci/engines.sh) with klgen's drop-in off and on, on CPU: two gloo processes,
the drop-in turned on the way a user does it (KLGEN_SGLANG, read by klgen's
sglang.srt.plugins entry point), on the torch backend (TorchGather, klgen's contract in torch ops:
there is no GPU). Equal outputs, and the drop-in's stats show that klgen
served each call. Skipped without SGLang.

Three things make SGLang run here without a GPU, none of them in the code
under test: the TP group is built without PyNccl and custom all-reduce (both
need CUDA); SGLang's CPU soft-cap (torch ops) is selected, as
SGLANG_USE_CPU_ENGINE would, which cannot be set itself (it loads the CPU
build of sgl-kernel, which PyPI does not have); the config is ServerArgs'
"dummy" model."""

import contextlib
import functools
import hashlib
import os
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
import engine_util as data  # noqa: E402
from engine_util import TP  # noqa: E402


@contextlib.contextmanager
def _setup(rank, port):
    """Rank `rank` of TP over gloo, as the engine sets it up."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import logits_processor
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy", tp_size=TP, device="cpu", skip_tokenizer_init=True,
                       sampling_backend="pytorch"),
            role="scheduler", ranks=SpawnRanks(world_rank=rank))
    parallel_state.init_model_parallel_group = functools.partial(
        parallel_state.init_model_parallel_group, use_pynccl=False)
    parallel_state.set_custom_all_reduce(False)
    parallel_state.init_distributed_environment(
        world_size=TP, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}")
    parallel_state.initialize_model_parallel()
    logits_processor._is_cpu = True
    yield
    data.leave_together(parallel_state.destroy_model_parallel,
                        parallel_state.destroy_distributed_environment)


def _head(vocab, rows, dtype, logits):
    """SGLang's ParallelLMHead and hidden states for which it computes exactly
    `logits` [rows, padded vocab] (engine_util's recipe)."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(vocab, rows, params_dtype=dtype)
    shard = head.num_embeddings_per_partition
    rank = torch.distributed.get_rank()  # the world is the TP group
    head.weight.copy_(data.head_weight(logits)[rank * shard:][:shard])
    return head, data.hidden(rows, dtype)


# (vocab, dtype, final_logit_softcapping, logit_scale, fp32 LM head)
HEADS = [
    (50257, torch.bfloat16, None, None, False),
    (50257, torch.bfloat16, 30.0, 0.5, False),
    (32000, torch.float16, None, 0.75, False),
    (50257, torch.bfloat16, 30.0, None, True),
]


def _processor(vocab, cap, scale, fp32):
    from sglang.srt.layers.logits_processor import LogitsProcessor

    config = types.SimpleNamespace(vocab_size=vocab, final_logit_softcapping=cap,
                                   enable_lm_head_fp32=fp32)
    return LogitsProcessor(config, logit_scale=scale)


def _heads(rows=12, nan_column=None):
    return [_head(vocab, rows, dtype,
                  data.hostile_rows(rows, data.padded(vocab, TP), vocab, dtype, seed=i,
                                    nan_column=nan_column))
            for i, (vocab, dtype, *_) in enumerate(HEADS)]


def _turn_on():
    """The user's step: KLGEN_SGLANG in the environment, which klgen's entry
    point reads when SGLang loads its plugins (in every process it starts)."""
    from sglang.srt.plugins import load_plugins

    os.environ["KLGEN_SGLANG"] = "torch"
    load_plugins()


def _processors():
    """SGLang's processors of HEADS, as they are and with the drop-in on."""
    stock = [_processor(vocab, cap, scale, fp32) for vocab, _, cap, scale, fp32 in HEADS]
    _turn_on()
    ours = [_processor(vocab, cap, scale, fp32) for vocab, _, cap, scale, fp32 in HEADS]
    return stock, ours


def _metadata(buffer=None):
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return LogitsMetadata(forward_mode=ForwardMode.DECODE, next_token_logits_buffer=buffer)


def _served(layer, use):
    assert getattr(layer, "klgen", None) is not None, "not the drop-in"
    return layer.klgen.stats()["calls"].get(use, 0)


def _get_logits_and_forward(rank):
    lines = data.debug_lines("sglang.klgen")
    heads, (stock, ours) = _heads(), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        for n in (1, 5, 12):
            h = hidden[:n]
            # logit_scale works in place on the shard: each side its own copy
            data.assert_same(on._get_logits(h.clone(), head, _metadata()),
                             off._get_logits(h.clone(), head, _metadata()),
                             f"_get_logits {spec} rows {n}")
            buffers = [torch.full((n, spec[0]), 7.0) for _ in range(2)]
            got = on._get_logits(h.clone(), head, _metadata(buffers[0]))
            want = off._get_logits(h.clone(), head, _metadata(buffers[1]))
            data.assert_same(got, want, f"_get_logits into the buffer {spec} rows {n}")
            data.assert_same(buffers[0], buffers[1], f"the buffer {spec} rows {n}")
            ids = torch.zeros(n, dtype=torch.long)
            data.assert_same(on(ids, h.clone(), head, _metadata()).next_token_logits,
                             off(ids, h.clone(), head, _metadata()).next_token_logits,
                             f"forward {spec} rows {n}")
        assert _served(on, "gather") == 9
    # the debug line that says it took effect
    assert any("torch gather sglang_v32000_s16000" in line for line in lines), lines


def test_get_logits_and_forward():
    data.spawn(_setup, _get_logits_and_forward)


def _deferred_argmax(rank):
    """SGLang's own deferred_argmax is a Triton kernel (no GPU here); its
    contract, in its docstring, is torch.argmax over the soft-capped row that
    the gather gives, which SGLang's _get_logits computes here."""
    stock, ours = _processors()
    off, on = stock[3], ours[3]  # the fp32 head
    for nan_column in (None, 30000):
        head, hidden = _heads(nan_column=nan_column)[3]
        shard = on._compute_lm_head(hidden, head)
        want = off._get_logits(hidden, head, _metadata()).argmax(dim=-1)
        got = on.deferred_argmax(shard)
        assert torch.equal(got, want), (nan_column, got, want)
    assert _served(on, "argmax") == 2


def test_deferred_argmax():
    data.spawn(_setup, _deferred_argmax)


def _softcap_gather_and_all_to_all(rank):
    """SGLang's fp32 soft-cap fused gather is klgen's, into the logits buffer
    where it fits; its LM-head all-to-all stays SGLang's, counted. SGLang
    takes both on the GPU only, through collectives registered for CUDA
    alone (and the fused kernel's tanh is not in Triton's interpreter): here
    _gather_softcap_fused is called as _get_logits calls it and compared
    with SGLang's unfused path on the CPU, the gather then cap * tanh(x /
    cap) in fp32, which the fused kernel computes in one pass."""
    stock, ours = _processors()
    off, on, vocab = stock[3], ours[3], HEADS[3][0]  # the soft-capped fp32 head
    head, hidden = _heads()[3]
    shard = on._compute_lm_head(hidden, head)
    assert shard.dtype == torch.float32
    want = off._get_logits(hidden, head, _metadata())
    for buffered in (False, True):
        buffer = torch.full((shard.shape[0], vocab), 7.0)
        got = on._gather_softcap_fused(shard, _metadata(buffer), buffered)
        data.assert_same(got, want, f"the soft-cap gather, buffered {buffered}")
        assert (got.data_ptr() == buffer.data_ptr()) == buffered
    assert _served(on, "softcap gather") == 2
    # SGLang's own all-to-all: its CUDA-only collective is what fails here
    for layer in (stock[3], on):
        with pytest.raises(NotImplementedError, match="reg_all_to_all_single"):
            layer._tp_lm_head_all_to_all(torch.zeros(2 * TP, shard.shape[1]))
    assert on.klgen.stats()["declined"] == {"gather": 1}


def test_softcap_gather_and_all_to_all():
    data.spawn(_setup, _softcap_gather_and_all_to_all)


class _Runner:
    """What SGLang's ModelRunner.sample reads of its runner, around a real
    Sampler; the runner's __init__ and load_model need a GPU and a
    checkpoint, so the load hook is called as load_model would call it."""

    def __init__(self, processor=None, model=None):
        from sglang.srt.layers.sampler import create_sampler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        if model is None:
            model = torch.nn.Module()
            model.logits_processor = processor
        self.model = model
        self.is_draft_worker, self.spec_algorithm = False, SpeculativeAlgorithm.from_string(None)
        self.sampler, self.sampling_observer, self.watermark_state = create_sampler(), None, None
        self.decoded = []
        self.ngram_embedding_manager = types.SimpleNamespace(
            update_after_decode=lambda next_token_ids, forward_batch:
                self.decoded.append(next_token_ids))

    def sample(self, logits_output, forward_batch):
        from sglang.srt.model_executor.model_runner import ModelRunner

        return ModelRunner.sample(self, logits_output, forward_batch)

    def _preprocess_logits(self, *args, **kwargs):
        from sglang.srt.model_executor.model_runner import ModelRunner

        return ModelRunner._preprocess_logits(self, *args, **kwargs)


def _requests(params):
    """A ScheduleBatch's part that SamplingBatchInfo reads: requests with
    SGLang's own SamplingParams (normalized as the tokenizer manager does)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i, kw in enumerate(params):
        sp = SamplingParams(**kw)
        sp.normalize(None)
        reqs.append(types.SimpleNamespace(rid=f"request {i}", sampling_params=sp,
                                          custom_logit_processor=None,
                                          return_sampling_mask=False,
                                          sampling_logprobs_mode=None))
    return _Batch(reqs=reqs, device="cpu", batch_is_full=False)


class _Batch(types.SimpleNamespace):
    """A ScheduleBatch stand-in SGLang's penalizers can hold a weak reference to."""


def _step(runner, reqs, vocab, return_logprob=False):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    info = SamplingBatchInfo.from_schedule_batch(reqs, vocab)
    n = len(reqs.reqs)
    return types.SimpleNamespace(forward_mode=ForwardMode.DECODE, return_logprob=return_logprob,
                                 top_logprobs_nums=[0] * n if return_logprob else None,
                                 token_ids_logprobs=[None] * n if return_logprob else None,
                                 sampling_info=info,
                                 positions=torch.arange(n) * 7 + 1000)


# Request mixes of SGLang's parameters: served on the shards, and not.
SERVED = [
    [dict(temperature=0.0)] * 3,
    [dict(temperature=0.7), dict(temperature=0.0), dict(temperature=1.0, top_p=0.9),
     dict(temperature=0.5, top_k=64)],
    [dict(temperature=1.3, min_p=0.05), dict(temperature=0.0), dict(temperature=0.8, top_k=5)],
]
DECLINED = [
    ([dict(temperature=0.7, frequency_penalty=0.5), dict(temperature=0.0)], "penalties"),
    ([dict(temperature=0.7, logit_bias={"3": 5.0})], "logit bias"),
    ([dict(temperature=0.7, top_k=100)], "top_k 100"),
    ([dict(temperature=0.7, top_p=0.9), dict(temperature=0.7, min_p=0.1)], "top-p with min-p"),
    ([dict(temperature=1.0, top_k=20, top_p=0.9)], "top-p with top-k"),
]


def _sample_on_shards(rank):
    """SGLang's decode step with the drop-in: forward leaves the logits on
    the shards and the real ModelRunner.sample draws from them with klgen
    (checked against klgen.reference on the gathered row, with the
    parameters SGLang's requests ask for, and greedy rows against SGLang's
    own sampler), or gathers them and runs SGLang's own sampler (the same
    tokens as SGLang alone, same RNG), counted by reason."""
    import klgen.reference as ref
    from klgen.integrations import sglang as glue
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    lines = data.debug_lines("sglang.klgen")
    stock, ours = _processors()
    for i in (0, 1):  # bf16 (in SGLang's own Llama); bf16 soft-capped and scaled
        vocab = HEADS[i][0]
        gen = torch.Generator().manual_seed(i)
        head, hidden = _head(vocab, 4, HEADS[i][1],
                             (torch.randn(4, data.padded(vocab, TP), generator=gen) * 3)
                             .to(HEADS[i][1]))
        on, off = ours[i], stock[i]
        runner, sglangs = _Runner(on), _Runner(off)
        if i == 0:
            model = _tiny_llama(vocab, head)
            on, head, runner = model.logits_processor, model.lm_head, _Runner(model=model)
        glue._loaded(None, runner)
        assert on.klgen_defer and runner.klgen_sampling is not None
        ids = torch.zeros(4, dtype=torch.long)
        for mix in SERVED + [m for m, _ in DECLINED]:
            n = len(mix)
            out = on(ids[:n], hidden[:n].clone(), head, _metadata())
            row = off(ids[:n], hidden[:n].clone(), head, _metadata())
            shard = out.next_token_logits
            local = shard.shape[1]
            # in the head's dtype unless SGLang soft-caps it (in fp32)
            assert shard.dtype == (torch.float32 if HEADS[i][2] else HEADS[i][1])
            assert local < vocab, shard.shape
            data.assert_same(shard.float()[:, :vocab - rank * local][:, :local],
                             row.next_token_logits[:, rank * local:][:, :local],
                             f"the deferred shard {HEADS[i]}")
            gathered = row.next_token_logits.clone()  # SGLang's sampler works in place
            declined = dict(on.klgen.stats()["declined"])
            torch.manual_seed(5)
            got = runner.sample(out, _step(runner, _requests(mix), vocab))
            torch.manual_seed(5)
            want_sglang = sglangs.sample(row, _step(sglangs, _requests(mix), vocab))
            if mix in SERVED:
                temperature = torch.tensor([1.0 if m.get("temperature", 1.0) == 0 else
                                            m.get("temperature", 1.0) for m in mix])
                top_k = torch.tensor([1 if m.get("temperature", 1.0) == 0 else
                                      m.get("top_k", TOP_K_ALL) for m in mix])
                top_k = torch.where(top_k >= vocab, 0, top_k)
                top_p = torch.tensor([m.get("top_p", 1.0) for m in mix])
                min_p = torch.tensor([m.get("min_p", 0.0) for m in mix])
                # each request's seed a hash of its id; its position the offset
                seed = torch.tensor([int.from_bytes(hashlib.blake2b(
                    f"request {r}".encode(), digest_size=8).digest(), "little", signed=True)
                    for r in range(n)])
                want = ref.sample(gathered, temperature, top_k, top_p, min_p, seed=seed,
                                  offset=torch.arange(n) * 7 + 1000).tokens
                assert torch.equal(got.long(), want.long()), (mix, got, want)
                greedy = torch.tensor([m.get("temperature", 1.0) == 0 for m in mix])
                # SGLang's greedy rows in a mixed step take any of the tied
                # largest (its sort is not stable); klgen's the lowest column
                best = gathered[greedy].max(dim=-1).values
                assert torch.equal(gathered[greedy].gather(1, want_sglang[greedy].long()[:, None])
                                   .view(-1), best), mix
                assert on.klgen.stats()["declined"] == declined, mix
                assert runner.decoded[-1] is got
            else:
                assert torch.equal(got, want_sglang), (mix, got, want_sglang)
                assert sum(on.klgen.stats()["declined"].values()) == sum(declined.values()) + 1
        stats = on.klgen.stats()
        assert stats["calls"]["sample"] == len(SERVED) and stats["declined"]["sample"] == \
            len(DECLINED), stats
        _grammar_steps(runner, sglangs, on, off, head, hidden, vocab)
        _beam_capture(on, off, head, hidden, vocab)
        _other_steps(runner, sglangs, on, off, head, hidden, vocab)
    _hooks_applied()
    for _, reason in DECLINED:
        assert any(reason in line for line in lines), (reason, lines)


def _grammar(vocab, cls=None):
    """An xgrammar grammar of SGLang's (XGrammarGrammar, or the subclass
    cls) for the regex [ab]+ over a vocabulary whose tokens 5, 9 and 17 are
    "a", "b" and "ab": those three its first tokens."""
    import xgrammar as xgr
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    words = [f"t{i}" for i in range(vocab)]
    words[5], words[9], words[17] = "a", "b", "ab"
    info = xgr.TokenizerInfo(words, vocab_size=vocab, stop_token_ids=[0])
    ctx = xgr.GrammarCompiler(info).compile_regex("[ab]+")
    return (cls or XGrammarGrammar)(xgr.GrammarMatcher(ctx), vocab, ctx, None,
                                    ("regex", "[ab]+"), None)


def _grammar_steps(runner, sglangs, on, off, head, hidden, vocab):
    """Structured output (xgrammar) on kl_sample: each grammar row masked by
    its matcher's bitmask, the rows without one as they are, sampled and
    greedy alike; SGLang's own greedy rows agree. A grammar of another
    backend is SGLang's, counted."""
    import klgen.reference as ref
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    mixes = [[dict(temperature=0.7), dict(temperature=0.0), dict(temperature=1.0, top_p=0.9)],
             [dict(temperature=0.0)] * 3]
    ids = torch.zeros(3, dtype=torch.long)
    for mix in mixes:
        out = on(ids, hidden[:3].clone(), head, _metadata())
        row = off(ids, hidden[:3].clone(), head, _metadata())
        gathered = row.next_token_logits.clone()
        grammars = [_grammar(vocab), _grammar(vocab), None]
        grammars[1].accept_token(5)  # "a": then "a", "b", "ab" or the stop token 0
        step, theirs = (_step(r, _requests(mix), vocab) for r in (runner, sglangs))
        step.sampling_info.grammars = theirs.sampling_info.grammars = grammars
        served = on.klgen.stats()["calls"]["sample"]
        got = runner.sample(out, step)
        want_sglang = sglangs.sample(row, theirs)
        assert on.klgen.stats()["calls"]["sample"] == served + 1, mix
        assert step.sampling_info.grammar_mask is None  # dropped once applied, as SGLang does
        mask = grammars[0].allocate_vocab_mask(vocab, 3, "cpu")
        for r in (0, 1):
            grammars[r].fill_vocab_mask(mask, r)
        temperature = torch.tensor([m.get("temperature", 1.0) for m in mix])
        top_p = torch.tensor([m.get("top_p", 1.0) for m in mix])
        seed = torch.tensor([int.from_bytes(hashlib.blake2b(
            f"request {r}".encode(), digest_size=8).digest(), "little", signed=True)
            for r in range(3)])
        want = ref.sample(gathered, temperature, top_p=top_p, seed=seed,
                          offset=torch.arange(3) * 7 + 1000, bitmask=mask).tokens
        assert torch.equal(got.long(), want.long()), (mix, got, want)
        assert got[0].item() in (5, 9, 17) and got[1].item() in (0, 5, 9, 17), got
        greedy = torch.tensor([m.get("temperature", 1.0) == 0 for m in mix])
        assert torch.equal(got[greedy].long(), want_sglang[greedy].long()), (got, want_sglang)
    # another backend's grammar: SGLang's sample, the reason said
    other = type("OtherGrammar", (XGrammarGrammar,), {})
    out = on(ids, hidden[:3].clone(), head, _metadata())
    step = _step(runner, _requests(mixes[0]), vocab)
    step.sampling_info.grammars = [_grammar(vocab, other), None, None]
    declined = on.klgen.stats()["declined"].get("sample", 0)
    got = runner.sample(out, step)
    assert got[0].item() in (5, 9, 17), got
    assert on.klgen.stats()["declined"]["sample"] == declined + 1


def _tiny_llama(vocab, head):
    """SGLang's LlamaForCausalLM built from a config (no download), its LM
    head `head`'s weights; its decoder layers left out (they need CUDA
    kernels, and the LM head's input is given here)."""
    from sglang.srt.models import llama
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=head.weight.shape[1],
                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, tie_word_embeddings=False)
    layers, dtype = llama.make_pp_layers, torch.get_default_dtype()
    llama.make_pp_layers = lambda *args, **kwargs: (torch.nn.ModuleList(), 0, 0)
    torch.set_default_dtype(head.weight.dtype)
    try:
        model = llama.LlamaForCausalLM(config)
    finally:
        llama.make_pp_layers = layers
        torch.set_default_dtype(dtype)
    model.lm_head.weight.copy_(head.weight)
    return model


def _other_steps(runner, sglangs, on, off, head, hidden, vocab):
    """An extend step is gathered in forward (only decode steps defer); a
    decode step asking for logprobs is SGLang's, counted; a composition's
    tensors are freed once SGLang drops them."""
    import gc
    import weakref

    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    extend = LogitsMetadata(forward_mode=ForwardMode.EXTEND)
    data.assert_same(on._get_logits(hidden.clone(), head, extend),
                     off._get_logits(hidden.clone(), head, extend), "an extend step's logits")
    mix = [dict(temperature=0.7), dict(temperature=0.0)]
    ids = torch.zeros(2, dtype=torch.long)
    out, row = (p(ids, hidden[:2].clone(), head, _metadata()) for p in (on, off))
    declined = on.klgen.stats()["declined"]["sample"]
    torch.manual_seed(9)
    got = runner.sample(out, _step(runner, _requests(mix), vocab, return_logprob=True))
    torch.manual_seed(9)
    want = sglangs.sample(row, _step(sglangs, _requests(mix), vocab, return_logprob=True))
    assert torch.equal(got, want) and out.next_token_logprobs is not None
    assert on.klgen.stats()["declined"]["sample"] == declined + 1
    step = _step(runner, _requests(mix), vocab)
    # tensors of SGLang's own making, as its filter_batch makes them (not views)
    step.sampling_info.filter_batch([0, 1], torch.tensor([0, 1]))
    runner.sample(on(ids, hidden[:2].clone(), head, _metadata()), step)
    gone = weakref.ref(step.sampling_info.temperatures)
    runner.sample(on(ids, hidden[:1].clone(), head, _metadata()),
                  _step(runner, _requests(mix[:1]), vocab))  # a new composition
    del step
    gc.collect()
    assert gone() is None, "a composition's tensors outlive it"


def _hooks_applied():
    """Every hook the sampling needs is in place (a wrong target would only
    be logged by SGLang)."""
    from klgen.integrations import sglang as glue
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target, _, _ in glue._SAMPLING_HOOKS:
        assert target in HookRegistry._patched, target


def _beam_capture(on, off, head, hidden, vocab):
    """A beam-search step's rows are captured by SGLang's own
    capture_pre_sample_logits (as the TP worker calls it) from the gathered
    row, not the shard."""
    from sglang.srt.beam_search.batch_tail import BeamTail, BeamTailEntry
    from sglang.srt.managers import tp_worker

    ids = torch.zeros(4, dtype=torch.long)
    out = on(ids, hidden.clone(), head, _metadata())
    row = off(ids, hidden.clone(), head, _metadata()).next_token_logits
    batch = types.SimpleNamespace(beam_tail=BeamTail(num_base_rows=2, entries=[
        BeamTailEntry(group=None, leader_idx=1, start=0, end=2)]))
    step = types.SimpleNamespace(positions=torch.arange(4),
                                 forward_mode=_step(on, _requests([{}]), vocab).forward_mode)
    declined = on.klgen.stats()["declined"]["sample"]
    tp_worker.capture_pre_sample_logits(batch, step, out)
    data.assert_same(out.next_token_logits, row[:2], "the base rows SGLang samples")
    data.assert_same(out.beam.leader_logits, row[[1]], "the beam leaders' logits")
    data.assert_same(out.beam.tail_logits, row[2:], "the beam tail's logits")
    assert on.klgen.stats()["declined"]["sample"] == declined + 1


def test_sample_on_shards():
    data.spawn(_setup, _sample_on_shards)


def test_served_filters_are_sglangs():
    """For each filter the glue serves, kl_sample's kept columns
    (klgen.reference.keep_mask) are the columns SGLang's pytorch sampler
    can draw; top-p with top-k, which the glue declines, differs (SGLang
    measures top-p over the whole row)."""
    from klgen import reference as ref
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(4)) * 2
    rows, t = logits.shape[0], 0.8

    def kept(top_k, top_p, min_p):
        full = lambda v, dtype=torch.float32: torch.full((rows,), v, dtype=dtype)
        probs = torch.softmax(logits / t, dim=-1)
        _, weights, columns, _ = top_k_top_p_min_p_sampling_from_probs_torch(
            probs, full(top_k, torch.int32), full(top_p), full(min_p), min_p > 0, None, None,
            return_filtered_probs=True)
        theirs = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, columns.long(),
                                                                    weights > 0)
        ours = ref.keep_mask(logits, full(t), full(0 if top_k >= 300 else top_k, torch.int64),
                             full(top_p), full(min_p))
        return ours, theirs

    for top_k, top_p, min_p in ((5, 1.0, 0.0), (TOP_K_ALL, 0.7, 0.0), (TOP_K_ALL, 1.0, 0.1),
                                (20, 1.0, 0.1), (1, 1.0, 0.0)):
        ours, theirs = kept(top_k, top_p, min_p)
        assert torch.equal(ours, theirs), (top_k, top_p, min_p)
    # no filter: kl_sample keeps every column; SGLang's top-p of 1.0 still
    # drops a column whose float32 cumulative sum before it rounds above 1
    # (torch's cumsum order decides which): only such a negligible tail
    ours, theirs = kept(TOP_K_ALL, 1.0, 0.0)
    probs = torch.softmax(logits / t, dim=-1)
    assert ours.all() and probs[ours & ~theirs].sum() < 1e-6
    ours, theirs = kept(20, 0.7, 0.0)
    assert not torch.equal(ours, theirs)


def test_models_that_read_the_logits_keep_them_gathered():
    """A model whose own code works on next_token_logits (Gemma 4's unified
    model masks vocabulary ids after its processor) is not deferred; a
    plain one (Llama) is."""
    from klgen.integrations import sglang as glue
    from sglang.srt.models.gemma4_unified import Gemma4UnifiedForConditionalGeneration as gemma
    from sglang.srt.models.llama import LlamaForCausalLM as llama

    assert glue._model_declines(gemma.__new__(gemma)) == \
        "Gemma4UnifiedForConditionalGeneration works on the gathered logits itself"
    assert glue._model_declines(llama.__new__(llama)) is None


def _sampling_tables(rank):
    """The requests' top_k follow SamplingBatchInfo as SGLang filters and
    merges it (finished requests leave, new ones join), so a step whose
    largest top_k drops to 64 or below is served again."""
    from klgen.integrations import sglang as glue
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    _turn_on()
    runner = _Runner(_processors()[1][0])
    glue._loaded(None, runner)
    shard = torch.zeros(3, 25152)
    first = SamplingBatchInfo.from_schedule_batch(
        _requests([dict(top_k=100), dict(temperature=0.5), dict(top_k=7)]), 50257)
    step = types.SimpleNamespace(forward_mode=_step(runner, _requests([{}]), 50257).forward_mode,
                                 return_logprob=False, sampling_info=first,
                                 positions=torch.arange(3))
    assert glue.sampling_args(runner, step, shard) == "top_k 100: above kl_sample's 64"
    first.filter_batch([1, 2], torch.tensor([1, 2]))
    seeds = [glue.request_seed(f"request {i}") for i in range(3)]
    assert first.top_ks.klgen_host == [(glue_all(), 1.0, seeds[1]), (7, 1.0, seeds[2])]
    assert isinstance(glue.sampling_args(runner, step, shard[:2]), dict)
    first.merge_batch(SamplingBatchInfo.from_schedule_batch(_requests([dict(top_k=64)]), 50257))
    assert first.top_ks.klgen_host == [(glue_all(), 1.0, seeds[1]), (7, 1.0, seeds[2]),
                                       (64, 1.0, seeds[0])]
    args = glue.sampling_args(runner, step, shard)
    assert torch.equal(args["top_k"], torch.tensor([glue_all(), 7, 64], dtype=torch.int32))
    assert torch.equal(args["seed"], torch.tensor([seeds[1], seeds[2], seeds[0]]))
    # a SamplingBatchInfo whose top_ks were set some other way: unknown
    first.top_ks = first.top_ks.clone()
    assert glue.sampling_args(runner, step, shard) == \
        "the requests' parameters and seeds are not known on the host"


def glue_all():
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    return TOP_K_ALL


def test_sampling_tables():
    data.spawn(_setup, _sampling_tables)


def _other_sglang(rank, how):
    """Where SGLang's Sampler.forward is not 0.5.23's (here another function
    put in its place before the plugin loads), or another plugin hooks
    ModelRunner.sample, nothing is deferred: every decode step gathers in
    forward and samples on SGLang's path, counted as a declined "sample"."""
    from sglang.srt.layers.sampler import Sampler
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    sglangs = Sampler.forward

    def forward(self, *args, **kwargs):
        return sglangs(self, *args, **kwargs)

    if how == "replaced":
        Sampler.forward = forward
        said = "Sampler.forward is not SGLang 0.5.23's"
    else:  # as another plugin would, before klgen's entry point runs
        HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.sample",
                              lambda original, *args, **kwargs: original(*args, **kwargs),
                              HookType.AROUND)
        said = "another plugin hooks ModelRunner.sample"
    from klgen.integrations import sglang as glue

    lines = data.debug_lines("sglang.klgen")
    stock, ours = _processors()
    on, off, vocab = ours[0], stock[0], HEADS[0][0]
    runner, theirs = _Runner(on), _Runner(off)
    glue._loaded(None, runner)
    assert not on.klgen_defer and not hasattr(runner, "klgen_sampling")
    gen = torch.Generator().manual_seed(0)
    head, hidden = _head(vocab, 2, HEADS[0][1], (torch.randn(2, data.padded(vocab, TP),
                                                            generator=gen) * 3).to(HEADS[0][1]))
    ids = torch.zeros(2, dtype=torch.long)
    mix = [dict(temperature=0.7), dict(temperature=0.0)]
    out, row = on(ids, hidden, head, _metadata()), off(ids, hidden, head, _metadata())
    assert out.next_token_logits.shape == (2, vocab)
    torch.manual_seed(3)
    got = runner.sample(out, _step(runner, _requests(mix), vocab))
    torch.manual_seed(3)
    assert torch.equal(got, theirs.sample(row, _step(theirs, _requests(mix), vocab)))
    assert on.klgen.stats()["declined"] == {"sample": 1}
    assert any(said in line for line in lines), lines


@pytest.mark.parametrize("how", ["replaced", "hooked"])
def test_other_sglang_keeps_its_path(how):
    data.spawn(_setup, functools.partial(_other_sglang, how=how))


def _device_error(rank):
    """A DeviceError from the gather reaches the caller."""
    import klgen
    from klgen.integrations import _gathers

    (head, hidden), on = _heads()[0], _processors()[1][0]

    def fail(self, shard):
        raise klgen.DeviceError("rank 1 timed out at step 7")

    _gathers.TorchGather.__call__ = fail
    with pytest.raises(klgen.DeviceError, match="timed out"):
        on._get_logits(hidden, head, _metadata())


def test_device_error_propagates():
    data.spawn(_setup, _device_error)


def _off(rank):
    """Without KLGEN_SGLANG the entry point changes nothing."""
    from sglang.srt.plugins import load_plugins

    os.environ.pop("KLGEN_SGLANG", None)
    load_plugins()
    layer = _processor(50257, None, None, False)
    assert not hasattr(layer, "klgen") and type(layer._logits_gatherer).__name__ != "LogitsGatherer"


def test_entry_point_does_nothing_unasked():
    data.spawn(_setup, _off)
