"""LogitsGather.sample's argument layer on the CPU (no GPU, no context):
numbers checked by the definition's rules, per-row tensors by dtype, shape
and device, with messages that name the argument. The draws themselves are
test_gpu.py's and gpu_sample's."""

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
_torch = pytest.importorskip("klgen._torch")

G = SimpleNamespace(k=8, vocab_size=1000, device=torch.device("cpu"))
ROWS = 4


def args(temperature=1.0, top_k=None, top_p=None, min_p=None, seed=0, offset=0, state_rows=None,
         offset_rows=None, logprobs=0):
    """The six arrays, and the two index arrays only where one is given."""
    out = _torch._sampling_args(G, ROWS, temperature, top_k, top_p, min_p, seed, offset,
                                state_rows, offset_rows, logprobs)
    if state_rows is None and offset_rows is None:
        assert out[6:] == [None, None]
        return out[:6]
    return out


def test_numbers_become_rows_of_the_kernels_dtypes():
    t, k, p, mp, s, o = args(0.7, 5, 0.9, 0.05, seed=2**64 - 1, offset=7)
    assert [x.dtype for x in (t, k, p, mp, s, o)] == [torch.float32, torch.int32, torch.float32,
                                                      torch.float32, torch.int64, torch.int64]
    assert all(x.shape == (ROWS,) for x in (t, k, p, mp, s, o))
    assert t[0].item() == pytest.approx(0.7) and k.tolist() == [5] * ROWS
    assert s.tolist() == [-1] * ROWS and o.tolist() == [7] * ROWS  # 2^64 - 1 is int64 -1
    # None and the off numbers are None (NULL to kl_sample: no tensor to fill);
    # top_k at or past the vocabulary is off too
    assert args(1.0, None, None, None)[1:] == [None] * 5
    assert args(1.0, 0, 1.0, 0.0, seed=0, offset=0)[1:] == [None] * 5
    assert args(1.0, 1000)[1] is None and args(1.0, 5000)[1] is None
    # temperature is never off: 0 is greedy, 1 is a row to draw
    assert args(0.0)[0].tolist() == [0.0] * ROWS and args(1.0)[0].tolist() == [1.0] * ROWS


@pytest.mark.parametrize("kw, error, words", [
    (dict(temperature=-0.5), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=math.inf), ValueError, "temperature must be finite"),
    (dict(temperature=1e39), ValueError, "temperature must be finite"),  # inf as a float32
    (dict(temperature=None), TypeError, "temperature is required"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_p=0.0), ValueError, "top_p must be in (0, 1]"),
    (dict(top_p=1.5), ValueError, "top_p must be in (0, 1]"),
    (dict(top_p=1e-50), ValueError, "top_p must be in (0, 1]"),  # 0 as a float32
    (dict(min_p=-0.1), ValueError, "min_p must be in [0, 1]"),
    (dict(top_k=9), ValueError, "top_k must be 0..8 (the spec's topk)"),
    (dict(top_k=-1), ValueError, "top_k must be 0..8"),
    (dict(top_k=2.0), TypeError, "top_k must be an int"),
    (dict(seed=2**64), ValueError, "seed 18446744073709551616 is outside"),
    (dict(offset=True), TypeError, "offset must be an int"),
    (dict(logprobs=9), ValueError, "logprobs must be in [0, 8]"),
    (dict(logprobs=1.0), TypeError, "logprobs must be an int"),
])
def test_bad_numbers(kw, error, words):
    with pytest.raises(error, match=None) as e:
        args(**kw)
    assert words in str(e.value)


@pytest.mark.parametrize("kw, error, words", [
    (dict(temperature=torch.ones(ROWS, dtype=torch.int32)), TypeError,
     "temperature must be a floating-point tensor"),
    (dict(top_k=torch.ones(ROWS)), TypeError, "top_k must be an integer tensor"),
    (dict(seed=torch.ones(ROWS, dtype=torch.int32)), TypeError, "seed must be an int64 tensor"),
    (dict(top_p=torch.ones(ROWS + 1)), ValueError, "top_p has shape (5,), expected [4]"),
    (dict(min_p=torch.zeros(ROWS, 1)), ValueError, "min_p has shape (4, 1)"),
    (dict(offset=torch.zeros(ROWS, dtype=torch.int64, device="meta")), ValueError,
     "offset is on meta, expected cpu"),
])
def test_bad_tensors(kw, error, words):
    with pytest.raises(error) as e:
        args(**kw)
    assert words in str(e.value)


def test_tensors_are_taken_per_row_in_the_kernels_dtypes():
    t, k, p, _, s, _ = args(torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64),
                            torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                            torch.full((ROWS,), 0.9, dtype=torch.bfloat16),
                            seed=torch.arange(ROWS))
    assert (t.dtype, k.dtype, p.dtype, s.dtype) == (torch.float32, torch.int32, torch.float32,
                                                    torch.int64)
    assert t.tolist() == [0.0, 0.5, 1.0, 2.0] and k.tolist() == [0, 1, 2, 3]
    # values are the device's to check (a row outside the domain draws -1)
    assert args(torch.full((ROWS,), -1.0))[0].tolist() == [-1.0] * ROWS
    # an int64 k beyond int32 keeps its meaning: negative stays negative, past
    # the vocabulary stays off
    big = torch.tensor([-2**40, -1, 2**40, 7], dtype=torch.int64)
    assert args(1.0, big)[1].tolist() == [-1, -1, 1000, 7]
    # an int32 k is taken as it is, not copied
    k32 = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    assert args(1.0, k32)[1].data_ptr() == k32.data_ptr()


def test_tables_through_state_rows_and_offset_rows():
    rows, at = torch.tensor([2, 0, 2, 1]), torch.tensor([5, 4, 3, 2])
    t, k, p, mp, s, o, sr, orows = args(torch.tensor([0.5, 1.0, 2.0]), 5, None, 0.1,
                                        seed=torch.tensor([7, 8, 9]), offset=torch.arange(6),
                                        state_rows=rows, offset_rows=at)
    # the tables as given; a number fills a table of the same length
    assert t.tolist() == [0.5, 1.0, 2.0] and k.tolist() == [5] * 3 and p is None
    assert mp.shape == (3,) and s.tolist() == [7, 8, 9] and o.tolist() == list(range(6))
    assert sr is rows and orows is at
    # offset_rows alone: per-row parameters, the offsets a table
    assert args(1.0, offset=torch.arange(9), offset_rows=at)[5].shape == (9,)
    # int32 index arrays, as vLLM's logits_indices may be, are taken as they are
    at32 = at.int()
    assert args(1.0, offset=torch.arange(9), offset_rows=at32)[7] is at32


@pytest.mark.parametrize("kw, error, words", [
    (dict(state_rows=torch.tensor([0, 1, 2, 3], dtype=torch.int16)), TypeError,
     "state_rows must be an int32 or int64 tensor, not torch.int16"),
    (dict(state_rows=[0, 1, 2, 3]), TypeError,
     "state_rows must be an int32 or int64 tensor, not list"),
    (dict(state_rows=torch.zeros(ROWS + 1, dtype=torch.int64)), ValueError,
     "state_rows has shape (5,), expected [4]"),
    (dict(state_rows=torch.zeros(ROWS, dtype=torch.int64)), ValueError,
     "state_rows indexes tables: pass temperature, top_k, top_p, min_p or seed as a tensor"),
    (dict(temperature=torch.ones(3), top_p=torch.ones(2), state_rows=torch.zeros(ROWS, dtype=torch.int64)),
     ValueError, "with state_rows, temperature, top_p must be 1-D tables of one length"),
    (dict(temperature=torch.ones(0), state_rows=torch.zeros(ROWS, dtype=torch.int64)),
     ValueError, "of one length >= 1"),
    (dict(offset=3, offset_rows=torch.zeros(ROWS, dtype=torch.int64)), ValueError,
     "offset_rows indexes tables: pass offset as a tensor"),
    (dict(offset=torch.zeros(2, 2, dtype=torch.int64), offset_rows=torch.zeros(ROWS, dtype=torch.int64)),
     ValueError, "must be 1-D tables"),
    (dict(offset_rows=torch.zeros(ROWS, dtype=torch.int64, device="meta"), offset=torch.arange(3)),
     ValueError, "offset_rows is on meta, expected cpu"),
])
def test_bad_tables(kw, error, words):
    with pytest.raises(error) as e:
        args(**kw)
    assert words in str(e.value)


def test_torch_backend_samples_as_the_definition(tmp_path):
    """TorchGather.sample (the torch backend engines' glue is tested on) is
    klgen.reference.sample of its gathered values, top_k held to its k."""
    import torch.distributed as dist
    from klgen import reference
    from klgen.integrations import _gathers

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                           world_size=1)
    try:
        g = _gathers.TorchGather(vocab_size=100, padded_vocab=128, dtype=torch.float32,
                                 max_tokens=4, name="torch_sample", topk=8)
        x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1)) * 3
        seed = torch.tensor([1, 2, 3])
        got = g.sample(x, 0.7, top_k=5, top_p=0.9, seed=seed, offset=4, logprobs=2)
        want = reference.sample(x[:, :100], 0.7, top_k=5, top_p=0.9, seed=seed, offset=4,
                                logprobs=2)
        assert torch.equal(got.tokens, want.tokens)
        assert torch.equal(got.top_logprobs.indices, want.top_indices)
        # per-request tables and positions, read through state_rows and offset_rows
        temp, pos = torch.tensor([0.0, 0.7, 1.3]), torch.arange(10, 20)
        rows, at = torch.tensor([1, 2, 1]), torch.tensor([9, 0, 4], dtype=torch.int32)
        got = g.sample(x, temp, seed=seed, offset=pos, state_rows=rows, offset_rows=at)
        want = reference.sample(x[:, :100], temp[rows], seed=seed[rows], offset=pos[at])
        assert torch.equal(got.tokens, want.tokens)
        assert g.sample(x, 1.0).top_logprobs is None
        with pytest.raises(ValueError, match="top_k must be at most 8"):
            g.sample(x, 1.0, top_k=9)
        with pytest.raises(ValueError, match="logprobs must be in"):
            g.sample(x, 1.0, logprobs=9)
        # the logits themselves for logprobs (vLLM's raw_logits): kl_sample's
        # two raw modes, the processed ones the reference's alone
        got = g.sample(x, 0.7, seed=seed, logprobs=2, ranks=True, logprobs_mode="raw_logits")
        want = reference.sample(x[:, :100], 0.7, seed=seed, logprobs=2, logprobs_mode="raw_logits")
        assert torch.equal(got.logprobs, x[torch.arange(3), got.tokens])
        assert torch.equal(got.top_logprobs.values, want.top_logprobs)
        assert torch.equal(got.ranks, want.rank)
        for mode, words in (("processed_logprobs", "not kl_sample's"), ("raw", "must be")):
            with pytest.raises(ValueError, match=f"logprobs_mode .*{words}"):
                g.sample(x, 1.0, logprobs_mode=mode)
    finally:
        dist.destroy_process_group()


def test_bitmask_is_an_int32_row_of_words_a_token():
    words = (G.vocab_size + 31) // 32
    m = torch.zeros((ROWS, words), dtype=torch.int32)
    assert _torch._bitmask(None, ROWS, G) is None
    assert _torch._bitmask(m, ROWS, G) is m
    # a transposed view is taken as a contiguous copy of the same values
    t = torch.arange(words * ROWS, dtype=torch.int32).view(words, ROWS).t()
    got = _torch._bitmask(t, ROWS, G)
    assert got.is_contiguous() and torch.equal(got, t)


@pytest.mark.parametrize("value, error, words", [
    ([[-1] * 32] * ROWS, TypeError, "bitmask must be an int32 tensor, not list"),
    (torch.zeros((ROWS, 32), dtype=torch.int64), TypeError, "not torch.int64"),
    (torch.zeros((ROWS, 31), dtype=torch.int32), ValueError, "expected [4, 32]"),
    (torch.zeros((ROWS + 1, 32), dtype=torch.int32), ValueError, "expected [4, 32]"),
    (torch.zeros((ROWS * 32,), dtype=torch.int32), ValueError, "ceil(1000 / 32) words"),
    (torch.zeros((ROWS, 32), dtype=torch.int32, device="meta"), ValueError, "is on meta"),
])
def test_bad_bitmask(value, error, words):
    with pytest.raises(error) as e:
        _torch._bitmask(value, ROWS, G)
    assert words in str(e.value)


PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")


def penalties(*values, prompt=True, counts=True, n=ROWS):
    words = (G.vocab_size + 31) // 32
    return _torch._penalties(G, n, values,
                             torch.zeros((n, words), dtype=torch.int32) if prompt else None,
                             torch.zeros((n, G.vocab_size), dtype=torch.int32) if counts else None)


def test_penalties_are_off_as_none_or_their_off_value():
    assert _torch._penalties(G, ROWS, (None, None, None), None, None) == [None] * 5
    rep, freq, pres, prompt, counts = penalties(1, 0.0, 0)
    assert rep is freq is pres is None  # off: no array, kl_sample reads NULL
    assert prompt.shape == (ROWS, 32) and counts.shape == (ROWS, 1000)
    rep, freq, pres, _, _ = penalties(1.2, -0.5, 2)
    assert rep.tolist() == [pytest.approx(1.2)] * ROWS and freq.tolist() == [-0.5] * ROWS
    assert pres.dtype == torch.float32 and pres.tolist() == [2.0] * ROWS
    # a float64 table is read as float32; a table of entries with state_rows
    got = penalties(None, torch.tensor([0.25, 1.5], dtype=torch.float64), None, prompt=False,
                    n=2)[1]
    assert got.dtype == torch.float32 and got.tolist() == [0.25, 1.5]


@pytest.mark.parametrize("values, kw, error, words", [
    ((0.0, None, None), {}, ValueError, "repetition_penalty must be finite and > 0"),
    ((-1, None, None), {}, ValueError, "repetition_penalty must be finite and > 0"),
    ((None, math.inf, None), {}, ValueError, "frequency_penalty must be finite"),
    ((None, None, math.nan), {}, ValueError, "presence_penalty must be finite"),
    ((None, None, 1e39), {}, ValueError, "presence_penalty must be finite (as a float32)"),
    ((None, "1", None), {}, TypeError, "frequency_penalty must be a number"),
    ((True, None, None), {}, TypeError, "repetition_penalty must be a number"),
    ((None, torch.zeros(ROWS, dtype=torch.int32), None), {}, TypeError,
     "frequency_penalty must be a floating-point tensor"),
    ((None, torch.zeros(ROWS + 1), None), {}, ValueError, "expected [4]"),
    ((None, 0.5, None), {"counts": False}, ValueError, "the penalties need output_counts"),
    ((1.1, None, None), {"prompt": False}, ValueError,
     "repetition_penalty needs prompt_mask"),
    ((None, None, None), {}, ValueError, "prompt_mask and output_counts are the penalties'"),
])
def test_bad_penalties(values, kw, error, words):
    with pytest.raises(error) as e:
        penalties(*values, **kw)
    assert words in str(e.value)


@pytest.mark.parametrize("which, value, error, words", [
    ("prompt", torch.zeros((ROWS, 31), dtype=torch.int32), ValueError,
     "prompt_mask has shape (4, 31), expected [4, 32]"),
    ("prompt", torch.zeros((ROWS, 32), dtype=torch.int64), TypeError,
     "prompt_mask must be a torch.int32 tensor, not torch.int64"),
    ("counts", torch.zeros((ROWS, 999), dtype=torch.int32), ValueError,
     "output_counts has shape (4, 999), expected [4, 1000]"),
    ("counts", [[0] * 1000] * ROWS, TypeError, "output_counts must be a torch.int32 tensor, not list"),
    ("counts", torch.zeros((ROWS, 1000), dtype=torch.int32, device="meta"), ValueError,
     "is on meta"),
])
def test_bad_penalty_tables(which, value, error, words):
    tables = {"prompt": torch.zeros((ROWS, 32), dtype=torch.int32),
              "counts": torch.zeros((ROWS, 1000), dtype=torch.int32)}
    tables[which] = value
    with pytest.raises(error) as e:
        _torch._penalties(G, ROWS, (1.5, None, None), tables["prompt"], tables["counts"])
    assert words in str(e.value)


# ---- vLLM's lists: allowed ids, logit bias, min_tokens, banned ids ----

def lists(**kw):
    return _torch._lists(G, ROWS, ROWS, kw.get("allowed_token_ids"), kw.get("logit_bias"),
                         kw.get("min_tokens"), kw.get("position"), kw.get("banned"))


def i32(*shape):
    return torch.zeros(shape, dtype=torch.int32)


def test_lists_become_the_structs_arrays():
    assert lists() == [None] * 10
    count, ids, values = i32(ROWS), i32(ROWS, 5), torch.zeros((ROWS, 5))
    got = lists(allowed_token_ids=(count, ids), logit_bias=(count, ids, values),
                min_tokens=(count, count, i32(ROWS, 2), None),
                position=torch.zeros(ROWS, dtype=torch.int64), banned=i32(ROWS, 3))
    assert got[0] is count and got[1] is ids and got[4] is values
    assert got[5] is count and got[7].shape == (ROWS, 2) and got[9].shape == (ROWS, 3)


@pytest.mark.parametrize("kw, error, words", [
    (dict(allowed_token_ids=(i32(ROWS),)), TypeError, "allowed_token_ids must be a tuple"),
    (dict(allowed_token_ids=(i32(ROWS), i32(ROWS, 0))), ValueError,
     "allowed_token_ids ids has shape (4, 0), expected [4, width >= 1]"),
    (dict(allowed_token_ids=(i32(ROWS + 1), i32(ROWS, 2))), ValueError,
     "allowed_token_ids count has shape (5,)"),
    (dict(logit_bias=(i32(ROWS), i32(ROWS, 2), i32(ROWS, 2))), TypeError,
     "logit_bias values must be a torch.float32 tensor"),
    (dict(logit_bias=(i32(ROWS), i32(ROWS, 2), torch.zeros(ROWS, 3))), ValueError,
     "logit_bias values has shape (4, 3), expected [4, 2]"),
    (dict(min_tokens=(i32(ROWS), i32(ROWS), i32(ROWS, 2), i32(ROWS))), ValueError,
     "restore_when_all_masked"),
    (dict(min_tokens=(i32(ROWS), i32(ROWS), i32(ROWS, 2))), TypeError, "min_tokens must be a tuple"),
    (dict(position=torch.zeros(ROWS, dtype=torch.int64)), ValueError,
     "position is used by min_tokens only"),
    (dict(banned=torch.zeros((ROWS, 2), dtype=torch.int64)), TypeError,
     "banned must be a torch.int32 tensor"),
])
def test_bad_lists(kw, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        lists(**kw)
