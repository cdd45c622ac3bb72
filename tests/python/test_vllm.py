"""vLLM's own LogitsProcessor (the installed vllm, 0.33.0 in CI: .ci/engines.sh)
with klgen's drop-in off and on, on CPU: two gloo processes, the drop-in
turned on the way a user does it (KLGEN_VLLM, read by klgen's
vllm.general_plugins entry point), on the torch backend (TorchGather, klgen's
contract in torch ops: there is no GPU). Equal outputs, and the drop-in's
stats show that klgen served each call. Skipped without vLLM."""

import contextlib
import functools
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
import engine_util as data  # noqa: E402
from engine_util import TP  # noqa: E402


@contextlib.contextmanager
def _setup(rank, port, tp=TP):
    """Rank `rank` of `tp` over gloo, as the engine sets it up."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                                 destroy_model_parallel)

    # no GPU: vLLM cannot infer the device, so it is told
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(tensor_model_parallel_size=tp)
        yield
        data.leave_together(destroy_model_parallel, destroy_distributed_environment)


def _head(vocab, rows, dtype, logits):
    """vLLM's ParallelLMHead and hidden states for which it computes exactly
    `logits` [rows, padded vocab] (engine_util's recipe)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(vocab, rows, params_dtype=dtype)
    shard = head.num_embeddings_per_partition
    head.weight.copy_(data.head_weight(logits)[head.tp_rank * shard:][:shard])
    return head, data.hidden(rows, dtype)


def _turn_on():
    """The user's step: KLGEN_VLLM in the environment, which klgen's entry
    point reads when vLLM loads its general plugins."""
    from vllm.plugins import load_general_plugins

    os.environ["KLGEN_VLLM"] = "torch"
    load_general_plugins()


def _served(layer, use):
    """The calls of `use` that klgen served on `layer` (a KlgenLogitsProcessor)."""
    from klgen.integrations import vllm as kv

    assert type(layer) is kv.KlgenLogitsProcessor, f"not the drop-in: {type(layer)}"
    return layer.klgen.stats()["calls"].get(use, 0) if layer.klgen else 0


# (vocab, org vocab, dtype, soft_cap, scale, head_dtype): GPT-2 (padded), a
# Gemma-like soft-cap, a scaled fp16 head, an EAGLE-like draft head of another
# vocab, an fp32 head over bf16 weights (--hf-overrides head_dtype)
HEADS = [
    (50257, None, torch.bfloat16, None, 1.0, None),
    (50257, None, torch.bfloat16, 30.0, 1.0, None),
    (50257, None, torch.float16, 50.0, 0.75, None),
    (32000, None, torch.float16, None, 1.0, None),
    (50257, None, torch.bfloat16, 30.0, 1.0, torch.float32),
]


def _heads(rows=12, ranked=0):
    """An LM head per HEADS, with hostile logits, or with `ranked` distinct
    largest values (vLLM's torch.topk orders ties as it may)."""
    heads = []
    for i, (vocab, _, dtype, *_) in enumerate(HEADS):
        width = data.padded(vocab, TP)
        logits = (data.ranked_rows(rows, width, vocab, dtype, ranked, seed=i) if ranked else
                  data.hostile_rows(rows, width, vocab, dtype, seed=i))
        heads.append(_head(vocab, rows, dtype, logits))
    return heads


def _processors():
    """vLLM's LogitsProcessors of HEADS, as they are and with the drop-in on."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    def made():
        processors = []
        for vocab, org, _, cap, scale, head_dtype in HEADS:
            processors.append(LogitsProcessor(vocab, org, scale=scale, soft_cap=cap))
            processors[-1].head_dtype = head_dtype  # what vLLM reads from the model config
        return processors

    stock = made()
    _turn_on()
    return stock, made()


def _forward_and_logits(rank):
    lines = data.debug_lines("vllm.klgen")
    heads, (stock, ours) = _heads(), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        for n in (1, 5, 12):
            h = hidden[:n]
            data.assert_same(on(head, h), off(head, h), f"forward {spec} rows {n}")
            data.assert_same(on._get_logits(h, head, None), off._get_logits(h, head, None),
                             f"_get_logits {spec} rows {n}")
            shard = off._apply_head(head, h, None)
            data.assert_same(on._gather_logits(shard), off._gather_logits(shard),
                             f"_gather_logits {spec} rows {n}")
        assert _served(on, "forward") == 3 and _served(on, "logits") == 3
        assert _served(on, "gather") == 3
        # 3-D hidden states: the rows are flattened for the gather
        h3 = hidden[:12].reshape(3, 4, -1)
        data.assert_same(on(head, h3), off(head, h3), f"forward {spec} [3, 4, hidden]")
    # the debug line that says it took effect
    assert any("torch gather vllm_v32000_s16000" in line for line in lines), lines


def test_forward_get_logits_and_gather_logits():
    data.spawn(_setup, _forward_and_logits)


def _top_tokens(rank):
    heads, (stock, ours) = _heads(), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        for n in (1, 12):
            h = hidden[:n]
            got, want = on.get_top_tokens(head, h), off.get_top_tokens(head, h)
            assert got.dtype == want.dtype and torch.equal(got, want), (spec, n, got, want)
        assert _served(on, "argmax") == 2


def test_get_top_tokens():
    data.spawn(_setup, _top_tokens)


def _top_k_tokens(rank):
    k = 5
    heads, (stock, ours) = _heads(rows=10, ranked=k + 1), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        ids, values = on.get_top_k_tokens(head, hidden, k)
        want_ids, want_values = off.get_top_k_tokens(head, hidden, k)
        assert torch.equal(ids, want_ids), (spec, ids, want_ids)
        data.assert_same(values, want_values, f"top-k values {spec}")
        ids, logp = on.get_top_k_tokens(head, hidden, k, return_log_probs=True)
        want_ids, want_logp = off.get_top_k_tokens(head, hidden, k, return_log_probs=True)
        assert torch.equal(ids, want_ids), (spec, ids, want_ids)
        # one log-sum-exp of the row against vLLM's of the ranks' ones: float
        # rounding apart (kl_topk's is within 1e-5 of float64)
        torch.testing.assert_close(logp, want_logp, rtol=1e-5, atol=1e-5)
        assert _served(on, "topk") == 2
        # k past kl_topk's 64: vLLM's own code, and said so
        ids, _ = on.get_top_k_tokens(head, hidden, 65)
        assert torch.equal(ids, off.get_top_k_tokens(head, hidden, 65)[0])
        assert on.klgen.stats()["declined"] == {"topk": 1}


def test_get_top_k_tokens():
    data.spawn(_setup, _top_k_tokens)


def _v2_sampler(vocab, params):
    """vLLM's v2 Sampler with a request per SamplingParams in `params`, in
    slots 0, 1, ... Its per-request state lives in pinned (UVA) buffers that
    need a GPU: here CPU tensors (vLLM's own NonUvaBuffer). Each rank seeds
    numpy alike, as vLLM's workers do, so unseeded requests draw one seed."""
    import numpy as np
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.worker.gpu.buffer_utils as buffers
    from vllm.config import get_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.states import RequestState

    current_platform.device_type = "cpu"
    buffers.is_uva_available = lambda: False
    buffers.UvaBuffer = buffers.NonUvaBuffer
    torch_utils.PIN_MEMORY = False
    np.random.seed(11)
    cpu, slots = torch.device("cpu"), max(16, len(params))
    sampler = Sampler(get_current_vllm_config(), slots, vocab, cpu,
                      RequestState(slots, 64, 64, 0, vocab, cpu))
    for slot, p in enumerate(params):
        sampler.add_request(slot, p)
    sampler.sampling_states.apply_staged_writes()  # (the processors' need Triton)
    return sampler


def _batch(slots, draft=0, seed=0):
    """The InputBatch fields the glue reads, for logits rows of the request
    slots `slots` (row i is slots[i]), each the last token of a prefill of
    its own length at a position of its own, as vLLM lays a batch out."""
    import types

    import numpy as np

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (len(slots),), generator=gen)
    ends = lengths.cumsum(0)
    return types.SimpleNamespace(
        idx_mapping_np=np.array(slots), expanded_idx_mapping=torch.tensor(slots),
        positions=torch.randint(0, 2**20, (int(ends[-1]),), generator=gen),
        logits_indices=ends - 1, num_draft_tokens=draft, req_ids=[f"r{s}" for s in slots])


def _bad_words(token_ids, **params):
    """SamplingParams with bad words as vLLM's frontend leaves them: tokenized."""
    from vllm.sampling_params import SamplingParams

    params = SamplingParams(**{"temperature": 1.0, **params})
    params._bad_words_token_ids = token_ids
    return params


def _sample(rank):
    import torch.distributed as dist
    from vllm.sampling_params import SamplingParams

    from klgen import reference
    from klgen.integrations.vllm import GREEDY, sampling_args

    kinds = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=5,
             top_p=0.9, seed=3), SamplingParams(temperature=1.0, min_p=0.1),
             SamplingParams(temperature=1.3, top_p=0.5), SamplingParams(temperature=1.0),
             SamplingParams(temperature=0.5, top_k=64, seed=-7)]
    rows = 12
    heads, (stock, ours) = _heads(rows=rows), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        sampler = _v2_sampler(spec[0], [kinds[i % len(kinds)] for i in range(rows)])
        # the batch's rows in another order than the slots, rows of a prefix of the slots
        for slots in ([4], list(range(rows))[::-1], [7, 0, 9, 2, 5, 11, 1]):
            n, batch = len(slots), _batch(slots, seed=len(slots))
            got = on.sample(head, hidden[:n], sampler, batch, None)
            states, asked = sampler.sampling_states, [kinds[i % len(kinds)] for i in slots]
            # vLLM's tables as they are, read through its idx_mapping; and,
            # where its vocabulary for "off" is below the spec's, rows gathered
            tables = sampling_args(sampler, batch, 64, spec[0])
            assert tables["temperature"] is states.temperature.gpu
            assert tables["state_rows"] is batch.expanded_idx_mapping
            gathered = sampling_args(sampler, batch, 64, states.vocab_size + 1)
            assert "state_rows" not in gathered
            for args in (tables, gathered):
                def per_row(name):
                    arg = args[name]
                    return arg if arg is None or "state_rows" not in args else \
                        arg[args["state_rows"]]
                assert per_row("temperature").tolist() == \
                    pytest.approx([p.temperature for p in asked])
                # a filter no request uses is None (kl_sample's shards then draw)
                for name, unset in (("top_p", 1.0), ("min_p", 0.0)):
                    values, arg = [getattr(p, name) for p in asked], per_row(name)
                    assert (arg is None) == all(v == unset for v in values), (name, values)
                    assert arg is None or arg.tolist() == pytest.approx(values)
                # vLLM's "off" top_k (its vocabulary) is off (0, or the table's
                # vocabulary); a row's seed is its request's
                want_k = [max(p.top_k, 0) for p in asked]
                assert (args["top_k"] is None) == (not any(want_k)), want_k
                k = per_row("top_k")
                assert k is None or k.masked_fill(k >= states.vocab_size, 0).tolist() == want_k
                assert per_row("seed").tolist() == states.seeds.np[slots].tolist()
                assert [s for s, p in zip(per_row("seed").tolist(), asked) if p.seed is not None] \
                    == [p.seed for p in asked if p.seed is not None]
                # each row's position, read by kl_sample through the batch's logits_indices
                assert args["offset"] is batch.positions
                assert args["offset_rows"] is batch.logits_indices
                want = reference.sample(off(head, hidden[:n]), **args, noise="vllm").tokens
                assert torch.equal(got, want), (spec, slots, got, want)
            ranks = [torch.empty_like(got) for _ in range(TP)]
            dist.all_gather(ranks, got)
            assert all(torch.equal(r, got) for r in ranks), (spec, ranks)
        # requests all greedy: temperature 0.0 alone, and kl_argmax's token
        batch = _batch([0, 6], seed=2)
        got = on.sample(head, hidden[:2], sampler, batch, None)
        assert sampling_args(sampler, batch, 64) is GREEDY
        logits = off(head, hidden[:2])
        assert torch.equal(got, reference.sample(logits, **GREEDY).tokens), (spec, got)
        assert torch.equal(got, logits.argmax(dim=-1)), (spec, got)
        assert _served(on, "sample") == 4
    # what kl_sample does not do stays with vLLM's sampler, and says why
    head, hidden = heads[0]
    on, vocab = ours[0], HEADS[0][0]
    declined = [(SamplingParams(temperature=1.0, logprob_token_ids=[3]), "logprob_token_ids"),
                (SamplingParams(temperature=1.0, logprobs=65), "65 top logprobs"),
                (SamplingParams(temperature=1.0, top_k=65), "top_k 65:")]
    for params, why in declined:
        sampler = _v2_sampler(vocab, [kinds[1], params])
        reason = sampling_args(sampler, _batch([0, 1]), 64)
        assert isinstance(reason, str) and why in reason, (why, reason)
        assert on.sample(head, hidden[:2], sampler, _batch([0, 1]), None) is None
        # a step without that request is klgen's
        args = sampling_args(sampler, _batch([0]), 64)
        assert args["temperature"][args["state_rows"]].tolist() == [pytest.approx(0.7)]
    sampler = _v2_sampler(vocab, kinds)
    assert on.sample(head, hidden[:2], sampler, _batch([0, 1], draft=1), None) is None
    # logprobs: served where the caller takes them (the runner's hook does)
    asks = _v2_sampler(vocab, [kinds[1], SamplingParams(temperature=1.0, logprobs=2)])
    assert on.sample(head, hidden[:2], asks, _batch([0, 1]), None) is None
    tokens, lp = on.sample(head, hidden[:2], asks, _batch([0, 1]), None, logprobs=True)
    logits = stock[0](head, hidden[:2]).float()
    assert lp.logprob_token_ids.shape == (2, 3) and torch.equal(lp.logprob_token_ids[:, 0], tokens)
    chosen = logits.gather(1, tokens[:, None])
    assert torch.equal(lp.selected_token_ranks, (logits >= chosen).sum(1))
    want_lp = torch.log_softmax(logits.double(), 1).gather(1, tokens[:, None])[:, 0].float()
    assert torch.allclose(lp.logprobs[:, 0], want_lp, rtol=1e-5, atol=1e-6), (lp.logprobs, want_lp)
    _grammar_steps(on, stock[0], head, hidden, vocab, sampler)
    _penalty_steps(on, stock[0], head, hidden, vocab)
    _list_steps(on, stock[0], head, hidden, vocab)
    _bad_word_steps(on, stock[0], head, hidden, vocab)
    # what the user asked of vLLM's sampler that klgen's draws would skip
    for flag, why in (("compute_nans", "NaNs"), ("use_fp64_gumbel", "fp64")):
        setattr(sampler, flag, True)
        assert why in sampling_args(sampler, _batch([0, 1]), 64)
        setattr(sampler, flag, False)
    watermarked = type("GPUWatermarkSampler", (type(sampler),), {})
    sampler.__class__ = watermarked  # a subclass samples its own way: vLLM's
    assert "GPUWatermarkSampler" in sampling_args(sampler, _batch([0, 1]), 64)
    # one more than before for the logprobs step of a caller that takes
    # tokens alone
    assert on.klgen.stats()["declined"] == {"sample": len(declined) + 4}
    _sample_models(on, head, hidden, vocab, kinds)


def _grammar_steps(on, off, head, hidden, vocab, sampler):
    """Structured output on kl_sample: each grammar request's row masked by
    the first of its mask_stride bitmask rows (GrammarOutput's layout), the
    other rows as they are, sampled and greedy alike (request 0 is greedy)."""
    import types

    import numpy as np

    from klgen import reference
    from klgen.integrations.vllm import grammar_bitmask, sampling_args

    words = (vocab + 31) // 32
    masks = np.random.default_rng(3).integers(-2**31, 2**31, (3 * 2, words)).astype(np.int32)
    masks[2] = 0
    masks[2, 0] = 1 << 5  # request r1's first row: column 5 alone
    # requests 1 and 0 have grammars, 9 is not in the step: mask_stride 2
    grammar = types.SimpleNamespace(structured_output_request_ids=["r9", "r1", "r0"],
                                    grammar_bitmask=masks, num_acceptable_drafts=None)
    for slots in ([0, 1], [1, 2], [0]):  # the last all greedy
        n, batch = len(slots), _batch(slots, seed=4)
        args = sampling_args(sampler, batch, 64)
        dense = torch.full((n, words), -1, dtype=torch.int32)
        for row, slot in enumerate(slots):
            if slot in (0, 1):
                dense[row] = torch.from_numpy(masks[4 if slot == 0 else 2])
        got = on.sample(head, hidden[:n], sampler, batch, grammar)
        want = reference.sample(off(head, hidden[:n]), **args, bitmask=dense, noise="vllm").tokens
        assert torch.equal(got, want), (slots, got, want)
        if 1 in slots:
            assert got[slots.index(1)].item() == 5, got
    # no request of the step has a grammar: as without one
    batch = _batch([0, 1], seed=4)
    none = types.SimpleNamespace(structured_output_request_ids=["r9"], grammar_bitmask=masks[:2],
                                 num_acceptable_drafts=None)
    assert torch.equal(on.sample(head, hidden[:2], sampler, batch, none),
                       on.sample(head, hidden[:2], sampler, batch, None))
    # a bitmask of another layout: vLLM's step, the reason said
    odd = types.SimpleNamespace(structured_output_request_ids=["r1"],
                                grammar_bitmask=masks[:1, :-1], num_acceptable_drafts=None)
    assert on.sample(head, hidden[:2], sampler, batch, odd) is None
    assert "structured output: a bitmask of shape" in str(
        grammar_bitmask(odd, batch, 2, vocab, torch.device("cpu")))


def _applied(processor):
    """A logits processor's staged writes applied as vLLM's apply_staged_writes
    would (its kernel needs Triton on a GPU): StagedWriteTensor rows and
    UvaBackedTensor copies, in torch."""
    for table in vars(processor).values():
        if hasattr(table, "_staged_write_indices"):
            contents, start = table._staged_write_contents, 0
            for index, at, end in zip(table._staged_write_indices, table._staged_write_starts,
                                      table._staged_write_cu_lens):
                row = torch.tensor(contents[start:end], dtype=table.gpu.dtype)
                table.gpu[index, at:at + row.numel()] = row
                start = end
            table.clear_staged_writes()
        elif hasattr(table, "copy_to_uva"):
            table.copy_to_uva()


def _list_steps(on, off, head, hidden, vocab):
    """vLLM's LogitBiasState on kl_sample (allowed ids, logit bias,
    min_tokens), from its own tables through the batch's idx_mapping, mixed
    with plain and greedy requests; a grammar's restore of its stop ids
    stays with vLLM's sampler."""
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    from klgen import reference
    from klgen.integrations.vllm import GREEDY, sampling_args

    kinds = [SamplingParams(temperature=0.0, logit_bias={5: 30.0, 9: -2.5}),
             SamplingParams(temperature=0.8, allowed_token_ids=[1, 4, 7, 8], seed=4),
             SamplingParams(temperature=1.0),
             SamplingParams(temperature=0.9, top_k=5, min_tokens=4, stop_token_ids=[2, 3],
                            logit_bias={2: 50.0, 3: 50.0}),
             SamplingParams(temperature=0.0, allowed_token_ids=[6, 11]),
             SamplingParams(temperature=1.0, min_tokens=9, stop_token_ids=[1],
                            structured_outputs=StructuredOutputsParams(regex="a+"))]
    sampler = _v2_sampler(vocab, kinds)
    lists = next(p for p in sampler.logits_processors if type(p).__name__ == "LogitBiasState")
    _applied(lists)
    changed = 0
    for slots in ([0, 1, 2, 3, 4], [2], [0], [4, 3, 1], [2, 4]):
        n, batch = len(slots), _batch(slots, seed=9)
        logits = off(head, hidden[:n])
        args = sampling_args(sampler, batch, 64, vocab)
        served = slots != [2]  # request 2 uses none of the lists
        assert (args is not GREEDY and "logit_bias" in args) == served, (slots, args)
        if served:
            assert args["logit_bias"][1] is lists.logit_bias_token_ids.gpu
        got = on.sample(head, hidden[:n], sampler, batch, None)
        want = reference.sample(logits, **args, noise="vllm").tokens
        assert torch.equal(got, want), (slots, got, want)
        plain = {k: v for k, v in args.items()
                 if k not in ("allowed_token_ids", "logit_bias", "min_tokens")}
        changed += int((reference.sample(logits, **plain, noise="vllm").tokens != want).sum())
    assert changed > 0  # the lists took effect
    reason = sampling_args(sampler, _batch([2, 5]), 64, vocab)
    assert isinstance(reason, str) and "restored" in reason, reason
    assert on.sample(head, hidden[:2], sampler, _batch([2, 5]), None) is None


def _bad_word_steps(on, off, head, hidden, vocab):
    """vLLM's BadWordsState on kl_sample: each step's bans worked out from
    its tables and the requests' tokens (vLLM's RequestState), checked
    against the rule written out here, and the tokens against the
    reference's; a greedy request whose argmax a one-token word bans draws
    another token."""
    from vllm.sampling_params import SamplingParams

    from klgen import reference
    from klgen.integrations.vllm import sampling_args

    slots = [0, 1, 2, 3, 4]
    logits = off(head, hidden[:len(slots)])
    top = int(logits[0].argmax())
    words = [[[top], [7, 8], [3, 9, 5]], None, [[11, 12], [40]], [[11, 12]], [[5, 6, 7, 8]]]
    kinds = [_bad_words(words[0], temperature=0.0), SamplingParams(temperature=0.7, seed=2),
             _bad_words(words[2], temperature=0.8, seed=6), _bad_words(words[3]),
             _bad_words(words[4], temperature=0.0)]
    # each request's prompt, then its output: slot 0's ends 3, 9; slot 2's
    # ends 11; slot 3 has none (its prompt ends 11: no ban); slot 4's ends
    # 5, 6, 1
    prompts = [[1, 2], [4], [9, 9, 9], [10, 11], [5]]
    outputs = [[7, 3, 9], [2, 2], [30, 11], [], [5, 6, 1]]
    sampler = _v2_sampler(vocab, kinds)
    bad = next(p for p in sampler.logits_processors if type(p).__name__ == "BadWordsState")
    _applied(bad)
    req = bad.req_states
    for slot, (prompt, output) in enumerate(zip(prompts, outputs)):
        tokens = prompt + output
        req.all_token_ids.gpu[slot, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        req.prompt_len.np[slot] = len(prompt)
        req.total_len.gpu[slot] = len(tokens)
    req.prompt_len.copy_to_uva()

    def bans(slot):
        out = outputs[slot]
        return sorted({w[-1] for w in words[slot] or [] if len(w) - 1 <= len(out)
                       and out[len(out) - len(w) + 1:] == w[:-1]})

    assert [bans(s) for s in slots] == [sorted({top, 5}), [], [12, 40], [], []]
    changed = 0
    for step in (slots, [1], [3, 0], [4, 2, 1]):
        n, batch = len(step), _batch(step, seed=5)
        batch_logits = off(head, hidden[:n])
        args = sampling_args(sampler, batch, 64, vocab)
        assert not isinstance(args, str), (step, args)
        assert ("banned" in args) == any(words[s] for s in step), (step, args.keys())
        if "banned" not in args:
            continue
        assert [sorted(set(row) - {-1}) for row in args["banned"].tolist()] == \
            [bans(s) for s in step], (step, args["banned"])
        got = on.sample(head, hidden[:n], sampler, batch, None)
        want = reference.sample(batch_logits, **args, noise="vllm").tokens
        assert torch.equal(got, want), (step, got, want)
        plain = {k: v for k, v in args.items() if k != "banned"}
        changed += int((reference.sample(batch_logits, **plain, noise="vllm").tokens
                        != want).sum())
        if step == slots:
            banned = torch.isin(torch.arange(vocab), torch.tensor(bans(0)))
            assert int(got[0]) != top and int(want[0]) == int(
                logits[0].masked_fill(banned, -float("inf")).argmax())
    assert changed > 0  # the bans took effect


def _penalty_steps(on, off, head, hidden, vocab):
    """vLLM's penalties on kl_sample, from its PenaltiesState's own tables
    (per request, read through the batch's idx_mapping): greedy and sampled
    requests with and without them, mixed within a step."""
    from vllm.sampling_params import SamplingParams

    from klgen import reference
    from klgen.integrations.vllm import sampling_args

    kinds = [SamplingParams(temperature=0.0, frequency_penalty=2.0),
             SamplingParams(temperature=0.7, frequency_penalty=0.5, presence_penalty=-0.3, seed=5),
             SamplingParams(temperature=1.0),
             SamplingParams(temperature=0.9, top_k=5, repetition_penalty=0.8, presence_penalty=1.5),
             SamplingParams(temperature=0.0, repetition_penalty=1.7)]
    sampler = _v2_sampler(vocab, kinds)
    pen = sampler.penalties_state
    for table in (pen.repetition_penalty, pen.frequency_penalty, pen.presence_penalty):
        table.copy_to_uva()  # (apply_staged_writes' bincount needs Triton)
    gen = torch.Generator().manual_seed(5)
    counts = torch.randint(1, 6, pen.output_bin_counts.shape, generator=gen, dtype=torch.int32)
    pen.output_bin_counts.copy_(torch.where(torch.rand(counts.shape, generator=gen) < 0.3,
                                            counts, 0))
    pen.prompt_bin_mask.copy_(torch.randint(-2**31, 2**31, pen.prompt_bin_mask.shape,
                                            generator=gen, dtype=torch.int32))
    changed = 0
    for slots in ([0, 1, 2, 3, 4], [2], [0], [4, 3, 1]):
        n, batch = len(slots), _batch(slots, seed=7)
        logits = off(head, hidden[:n])
        if slots == [0]:  # its argmax seen 50 times: the penalty moves its token
            pen.output_bin_counts[0, logits[0].argmax()] = 50
        args = sampling_args(sampler, batch, 64, vocab)
        served = any(kinds[s].frequency_penalty or kinds[s].presence_penalty
                     or kinds[s].repetition_penalty != 1.0 for s in slots)
        assert ("output_counts" in args) == served, (slots, args.keys())
        if served:
            assert args["output_counts"] is pen.output_bin_counts
            assert args["prompt_mask"] is pen.prompt_bin_mask
            assert args["repetition_penalty"] is pen.repetition_penalty.gpu
        got = on.sample(head, hidden[:n], sampler, batch, None)
        want = reference.sample(logits, **args, noise="vllm").tokens
        assert torch.equal(got, want), (slots, got, want)
        plain = {k: v for k, v in args.items() if k not in (
            "repetition_penalty", "frequency_penalty", "presence_penalty", "prompt_mask",
            "output_counts")}
        changed += int((reference.sample(logits, **plain, noise="vllm").tokens != want).sum())
    assert changed > 0  # the penalties took effect
    # vLLM's vocabulary and the spec's differ: the counts' rows do not fit
    reason = sampling_args(sampler, _batch([0, 1]), 64, vocab + 1)
    assert "logits processors over vLLM's vocabulary" in reason, reason


def _model(compute_logits, **attrs):
    """An object with vLLM's compute_logits `compute_logits` and `attrs`."""
    model = type("Model", (), {"compute_logits": compute_logits})()
    model.__dict__.update(attrs)
    return model


def _sample_models(on, head, hidden, vocab, kinds):
    """klgen.integrations.vllm.sample: served through models whose logits are
    their processor's alone (vLLM's own compute_logits), vLLM's where the
    model does more or LoRA wraps the processor."""
    import types

    from vllm.lora.layers import LogitsProcessorWithLoRA
    from vllm.model_executor.models import (dory, gemma2, internlm2, kimi_k25, llama, mimo,
                                            step3p5)

    from klgen.integrations.vllm import sample

    sampler, batch = _v2_sampler(vocab, kinds), _batch([3, 1, 2], seed=5)
    want = on.sample(head, hidden[:3], sampler, batch, None)
    served, declined = _served(on, "sample"), on.klgen.stats()["declined"]["sample"]
    plain = _model(llama.LlamaForCausalLM.compute_logits, logits_processor=on, lm_head=head)
    tied = _model(gemma2.Gemma2ForCausalLM.compute_logits, logits_processor=on,
                  model=types.SimpleNamespace(embed_tokens=head))
    named = _model(internlm2.InternLM2ForCausalLM.compute_logits, logits_processor=on,
                   output=head)
    wrapped = _model(kimi_k25.KimiK25ForConditionalGeneration.compute_logits,
                     language_model=plain)
    for model in (plain, tied, named, wrapped):
        assert torch.equal(sample(model, hidden[:3], sampler, batch, None), want)
    assert _served(on, "sample") == served + 4
    lora = LogitsProcessorWithLoRA(on, 12, hidden.dtype, "cpu", head.get_sharded_to_full_mapping())
    norm = torch.nn.Identity()  # MiMo normalizes the hidden states in its compute_logits
    more = [_model(llama.LlamaForCausalLM.compute_logits, logits_processor=lora, lm_head=head),
            _model(mimo.MiMoForCausalLM.compute_logits, logits_processor=on, lm_head=head,
                   model=types.SimpleNamespace(norm=norm)),
            _model(step3p5.Step3p5ForCausalLM.compute_logits, logits_processor=on,
                   lm_head=head, model=types.SimpleNamespace(norm=norm)),
            _model(dory.DoryForCausalLM.compute_logits, logits_processor=on, lm_head=head)]
    # a hand-off to a model that does more: counted on the inner model's processor
    more.append(_model(kimi_k25.KimiK25ForConditionalGeneration.compute_logits,
                       language_model=more[1]))
    for model in more:
        assert sample(model, hidden[:3], sampler, batch, None) is None
    assert _served(on, "sample") == served + 4
    assert on.klgen.stats()["declined"]["sample"] == declined + len(more)


def test_sample_from_vllm_sampling_states():
    data.spawn(_setup, _sample)


def _tp1(rank):
    """At TP 1 the gathers stay vLLM's (nothing to gather); the selections
    and the sample take klgen, from the whole row."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.sampling_params import SamplingParams

    from klgen import reference
    from klgen.integrations.vllm import GREEDY, sampling_args

    vocab, rows, dtype = 32000, 6, torch.float16
    head, hidden = _head(vocab, rows, dtype, data.hostile_rows(rows, data.padded(vocab, 1), vocab,
                                                               dtype, seed=5))
    off = LogitsProcessor(vocab)
    _turn_on()
    on = LogitsProcessor(vocab)
    assert torch.equal(on(head, hidden), off(head, hidden))
    assert on.klgen.stats()["declined"] == {"logits": 1}
    assert torch.equal(on.get_top_tokens(head, hidden), off.get_top_tokens(head, hidden))
    kinds = [SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3),
             SamplingParams(temperature=1.0, min_p=0.1), SamplingParams(temperature=0.0)]
    sampler = _v2_sampler(vocab, kinds * 2)
    for slots in ([0, 1, 2, 3], [2, 5]):
        n, batch = len(slots), _batch(slots, seed=len(slots))
        got = on.sample(head, hidden[:n], sampler, batch, None)
        args = sampling_args(sampler, batch, 64)
        assert (args is GREEDY) == (slots == [2, 5])
        want = reference.sample(off(head, hidden[:n]), **args, noise="vllm").tokens
        assert torch.equal(got, want), (slots, got, want)
    assert (_served(on, "argmax"), _served(on, "sample")) == (1, 2)
    assert on.klgen.stats()["declined"] == {"logits": 1}


def test_tp1_selections_and_sample():
    data.spawn(functools.partial(_setup, tp=1), _tp1, ranks=1)


def _plans_per_composition(rank):
    """sampling_args works a composition out once and again after the
    sampler adds a request (which rewrites its slot's state)."""
    from vllm.sampling_params import SamplingParams

    from klgen.integrations import vllm as kv

    made, plan = [], kv._plan
    kv._plan = lambda *args: made.append(args[1].idx_mapping_np.tolist()) or plan(*args)
    sampler = _v2_sampler(1000, [SamplingParams(temperature=0.7, seed=3)] * 3)
    for slots in ([0, 1], [0, 1], [1, 0], [0, 1]):
        args = kv.sampling_args(sampler, _batch(slots), 64)
        assert args["seed"][args["state_rows"]].tolist() == [3, 3]
    assert made == [[0, 1], [1, 0]]
    sampler.add_request(1, SamplingParams(temperature=1.0, logprob_token_ids=[2]))
    sampler.sampling_states.apply_staged_writes()  # (the processors' need Triton)
    assert "logprob_token_ids" in kv.sampling_args(sampler, _batch([0, 1]), 64)
    args = kv.sampling_args(sampler, _batch([0]), 64)
    assert args["seed"][args["state_rows"]].tolist() == [3]
    assert made == [[0, 1], [1, 0], [0, 1], [0]]


def test_sampling_args_once_per_composition():
    data.spawn(_setup, _plans_per_composition)


def _tiny_llama(vocab, rows, dtype, logits):
    """vLLM's LlamaForCausalLM built from a config (no layers, no download)
    whose LM head computes exactly `logits` from data.hidden(rows)."""
    import json
    import tempfile

    from vllm.config import ModelConfig, get_current_vllm_config
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=rows,
                  intermediate_size=2 * rows, num_attention_heads=TP, num_key_value_heads=TP,
                  num_hidden_layers=0, vocab_size=vocab, max_position_embeddings=4096,
                  torch_dtype=str(dtype).removeprefix("torch."))
    vllm_config = get_current_vllm_config()
    with tempfile.TemporaryDirectory() as where:
        with open(os.path.join(where, "config.json"), "w") as f:
            json.dump(config, f)
        vllm_config.model_config = ModelConfig(model=where, skip_tokenizer_init=True,
                                               dtype=dtype)
    with set_default_torch_dtype(dtype):  # as vLLM's model loader builds it
        model = LlamaForCausalLM(vllm_config=vllm_config)
    shard = model.lm_head.num_embeddings_per_partition
    rank = model.lm_head.tp_rank
    model.lm_head.weight.copy_(data.head_weight(logits)[rank * shard:][:shard])
    return model


def _runner(model, sampler):
    """vLLM's v2 GPUModelRunner as its load_model leaves it on the last
    pipeline rank for a model without drafts or batch-sharded sampling: the
    attributes its sample() reads. Its __init__ needs CUDA streams, so the
    instance is made without it; sample() is the class's own."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.model, runner.sampler = model, sampler
    runner.batch_sharder = runner.rejection_sampler = runner.speculator = None
    runner.structured_outputs_worker = None
    return runner


def _decode_batch(slots, seed):
    """vLLM's own InputBatch of a decode step (one token per request) of the
    request slots `slots`, at random positions."""
    import numpy as np
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    n = len(slots)
    batch = InputBatch.make_dummy(n, n, InputBuffers(64, 64, torch.device("cpu")),
                                  is_padding=False)
    batch.idx_mapping_np = np.array(slots, dtype=np.intp)
    batch.idx_mapping = batch.expanded_idx_mapping = torch.tensor(slots)
    gen = torch.Generator().manual_seed(seed)
    batch.positions.copy_(torch.randint(0, 2**20, (n,), generator=gen))
    return batch


_KINDS = (dict(temperature=0.0), dict(temperature=0.7, top_k=5, top_p=0.9, seed=3),
          dict(temperature=1.0, min_p=0.1), dict(temperature=1.3, top_p=0.5),
          dict(temperature=1.0))


def _runner_step(rank, replace=None):
    """GPUModelRunner.sample with the plugin on: a decode step is klgen's
    (kl_sample's draws of the shards, SamplerOutput as vLLM's), a step that
    needs vLLM's sampler is vLLM's, token for token. replace ("sample" or
    "__call__"): that method of vLLM's (the runner's sample, the Sampler's
    __call__) is replaced by another before klgen loads, and every step is
    vLLM's, counted, logged once."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    from klgen import reference
    from klgen.integrations.vllm import sampling_args

    lines = data.debug_lines("vllm.klgen")
    vllms = {"sample": GPUModelRunner.sample, "__call__": Sampler.__call__}
    if replace is not None:
        owner = GPUModelRunner if replace == "sample" else Sampler
        setattr(owner, replace, lambda self, *args: vllms[replace](self, *args))
    _turn_on()
    vocab, rows, dtype = 50257, 8, torch.bfloat16
    logits = data.hostile_rows(rows, data.padded(vocab, TP), vocab, dtype, seed=5)
    model = _tiny_llama(vocab, rows, dtype, logits)
    from vllm.sampling_params import SamplingParams

    runner = _runner(model, _v2_sampler(vocab, [SamplingParams(**k) for k in _KINDS * 2]))
    # klgen's steps take every kind; vLLM's top-k / top-p are a Triton kernel
    # that asks the platform for its compute units, which a CPU has not: its
    # steps here take the kinds without (greedy, min-p, temperature)
    slots = [9, 2, 4, 0, 7, 1, 3] if replace is None else [9, 2, 4, 0, 7, 5]
    batch, hidden = _decode_batch(slots, seed=1), data.hidden(rows, dtype)[:len(slots)]
    stock = GPUModelRunner.sample.klgen_wraps  # vLLM's own, as the plugin found it
    for step in range(2):
        out, num_sampled, num_rejected = runner.sample(hidden, batch, None)
        assert num_sampled.tolist() == [1] * len(slots)
        assert num_rejected.tolist() == [0] * len(slots)
        tokens = out.sampled_token_ids
        assert tokens.shape == (len(slots), 1) and tokens.dtype == torch.int64
        if replace is None:
            args = sampling_args(runner.sampler, batch, 64)
            want = reference.sample(logits[:len(slots), :vocab], **args, noise="vllm").tokens
        else:
            want = stock(runner, hidden, batch, None)[0].sampled_token_ids[:, 0]
        assert torch.equal(tokens[:, 0], want), (replace, step, tokens, want)
    stats = model.logits_processor.klgen.stats()
    if replace is None:
        assert stats["calls"].get("sample") == 2 and not stats["declined"], stats
        # vLLM's noise: klgen's steps draw vLLM's own tokens, seeded or not
        batch = _decode_batch([9, 2, 4, 0, 7, 5], seed=3)
        mine = runner.sample(hidden[:6], batch, None)[0].sampled_token_ids
        assert torch.equal(mine, stock(runner, hidden[:6], batch, None)[0].sampled_token_ids)
        # what needs vLLM's sampler: vLLM's path, the same tokens as its own
        runner.sampler.use_fp64_gumbel = True
        batch = _decode_batch([9, 2, 4, 0, 7, 5], seed=2)
        hidden = hidden[:6]
        got = runner.sample(hidden, batch, None)[0].sampled_token_ids
        assert torch.equal(got, stock(runner, hidden, batch, None)[0].sampled_token_ids)
        assert model.logits_processor.klgen.stats()["declined"] == {"sample": 1}
    else:
        assert "sample" not in stats["calls"] and stats["declined"] == {"sample": 2}, stats
        said = [line for line in lines if "stays with the engine" in line]
        assert len(said) == 1 and f".{replace} is not vLLM 0.33.0's" in said[0], lines


@pytest.mark.parametrize("replace", [None, "sample", "__call__"])
def test_model_runner_sample(replace, monkeypatch):
    # vLLM's sampler and step counts are Triton kernels: on the CPU, Triton's
    # interpreter (vLLM keeps Triton with no GPU visible)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    data.spawn(_setup, functools.partial(_runner_step, replace=replace))


def _lora(rank):
    """LogitsProcessorWithLoRA over each: it re-indexes the unsliced gather
    (get_sharded_to_full_mapping), adds the adapter's logits, then slices."""
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers import LogitsProcessorWithLoRA
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
    from vllm.utils import torch_utils

    torch_utils.PIN_MEMORY = False  # vLLM's platform guess says yes; there is no GPU
    heads, (stock, ours) = _heads(), _processors()
    rows, rank_r = 12, 8
    gen = torch.Generator().manual_seed(7)
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        config = LoRAConfig(max_lora_rank=rank_r, max_loras=1, lora_dtype=hidden.dtype)
        a = torch.randn(rank_r, rows, generator=gen).to(hidden.dtype)
        b = torch.randn(off.vocab_size, rank_r, generator=gen).to(hidden.dtype)
        punica = PunicaWrapperCPU(64, 4, "cpu")
        punica.update_metadata(LoRAMapping([1] * rows, [1] * rows, is_prefill=False), [1], 1,
                               off.vocab_size)
        wrapped = []
        for base in (off, on):
            layer = LogitsProcessorWithLoRA(base, rows, hidden.dtype, "cpu",
                                            head.get_sharded_to_full_mapping())
            layer.create_lora_weights(1, config)
            layer.set_lora(0, a, b)
            layer.set_mapping(punica)
            wrapped.append(layer)
        data.assert_same(wrapped[1](head, hidden), wrapped[0](head, hidden), f"LoRA {spec}")
        assert _served(on, "gather") == 1


def test_lora_wrapper():
    data.spawn(_setup, _lora)


def _device_error(rank):
    """A DeviceError from the gather reaches forward's caller."""
    import klgen
    from klgen.integrations import _gathers

    (head, hidden), on = _heads()[0], _processors()[1][0]
    on(head, hidden)

    def fail(self, shard):
        raise klgen.DeviceError("rank 1 timed out at step 7")

    _gathers.TorchGather.__call__ = fail
    with pytest.raises(klgen.DeviceError, match="timed out"):
        on(head, hidden)
    with pytest.raises(klgen.DeviceError):
        on.get_top_tokens(head, hidden)


def test_device_error_propagates():
    data.spawn(_setup, _device_error)


def _off(rank):
    """Without KLGEN_VLLM the entry point changes nothing."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.plugins import load_general_plugins

    os.environ.pop("KLGEN_VLLM", None)
    load_general_plugins()
    assert type(LogitsProcessor(50257)) is LogitsProcessor


def test_entry_point_does_nothing_unasked():
    data.spawn(_setup, _off)
