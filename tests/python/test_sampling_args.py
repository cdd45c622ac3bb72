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


def args(temperature=1.0, top_k=None, top_p=None, min_p=None, seed=0, offset=0, logprobs=0):
    return _torch._sampling_args(G, ROWS, temperature, top_k, top_p, min_p, seed, offset, logprobs)


def test_numbers_become_rows_of_the_kernels_dtypes():
    t, k, p, mp, s, o = args(0.7, 5, 0.9, 0.05, seed=2**64 - 1, offset=7)
    assert [x.dtype for x in (t, k, p, mp, s, o)] == [torch.float32, torch.int64, torch.float32,
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
    assert (t.dtype, k.dtype, p.dtype, s.dtype) == (torch.float32, torch.int64, torch.float32,
                                                    torch.int64)
    assert t.tolist() == [0.0, 0.5, 1.0, 2.0] and k.tolist() == [0, 1, 2, 3]
    # values are the device's to check (a row outside the domain draws -1)
    assert args(torch.full((ROWS,), -1.0))[0].tolist() == [-1.0] * ROWS


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
        assert g.sample(x, 1.0).top_logprobs is None
        with pytest.raises(ValueError, match="top_k must be at most 8"):
            g.sample(x, 1.0, top_k=9)
        with pytest.raises(ValueError, match="logprobs must be in"):
            g.sample(x, 1.0, logprobs=9)
    finally:
        dist.destroy_process_group()
