"""klgen.reference, the sampler's reference (docs/design/sampling.md): its
Philox against Random123's known answers and a scalar Philox written here,
sample() against a slow sampler written here from the definition, row by row
over sorted lists, and the draws' distribution against the filtered softmax.

The scalar Philox and its known answers need no torch; the rest skips
without it.
"""

import ctypes
import math
import os
import random
import shutil
import struct
import subprocess
from fractions import Fraction

import pytest

try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="klgen.reference needs torch")

if torch is not None:
    from klgen import reference

M32 = 0xFFFFFFFF
INF, NAN = math.inf, math.nan

# Random123's tests/kat_vectors, the three philox4x32 10 lines: counter (4
# words), key (2 words), expected output (4 words).
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


# ---- a scalar Philox and the noise's contract, in plain Python ----

def philox_scalar(counter, key, rounds=10):
    """Philox4x32 as Salmon et al. give it, one counter at a time."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r > 0:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def word_scalar(seed, offset, column):
    seed, offset = seed % 2**64, offset % 2**64
    counter = ((column >> 2) & M32, column >> 34, offset & M32, offset >> 32)
    return philox_scalar(counter, (seed & M32, seed >> 32))[column & 3]


def uniform_scalar(seed, offset, column):
    return (2 * (word_scalar(seed, offset, column) >> 9) + 1) * 2.0**-24


def test_scalar_philox_known_answers():
    for counter, key, expected in KAT:
        assert philox_scalar(counter, key) == expected


@needs_torch
def test_philox_known_answers():
    for counter, key, expected in KAT:
        words = reference._philox(*(torch.tensor(w, dtype=torch.int64) for w in counter + key))
        assert tuple(int(w) for w in words) == expected


@needs_torch
def test_bits_and_uniform_match_the_scalar_philox():
    rng = random.Random(1)
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, -1, -(2**63), 2**64 - 1] + [
        rng.randrange(-(2**63), 2**64) for _ in range(24)]
    offsets = [0, 1, 2**32 + 5, -1] + [rng.randrange(-(2**63), 2**64) for _ in range(28)]
    columns = [0, 1, 2, 3, 4, 5, 163839, 2**34 - 1, 2**34, 2**40 + 3, 2**62 - 1] + [
        rng.randrange(2**62) for _ in range(21)]
    as_i64 = [s - 2**64 if s >= 2**63 else s for s in seeds]
    cols = torch.tensor(columns, dtype=torch.int64)
    # per-row int64 tensors (two's complement) and one Python int each
    got = reference.bits(torch.tensor(as_i64), torch.tensor(
        [o - 2**64 if o >= 2**63 else o for o in offsets]), cols)
    u = reference.uniform(torch.tensor(as_i64), torch.tensor(
        [o - 2**64 if o >= 2**63 else o for o in offsets]), cols)
    assert got.shape == (32, 32) and got.dtype == torch.int64 and u.dtype == torch.float32
    for i, (s, o) in enumerate(zip(seeds, offsets)):
        for j, c in enumerate(columns):
            assert int(got[i, j]) == word_scalar(s, o, c), (s, o, c)
            assert float(u[i, j]) == uniform_scalar(s, o, c)
    for s, o in ((seeds[3], offsets[2]), (2**64 - 1, -1), (-1, 2**64 - 1)):
        row = reference.bits(s, o, cols)
        assert row.shape == (32,)
        assert [int(w) for w in row] == [word_scalar(s, o, c) for c in columns]


@needs_torch
def test_uniform_is_inside_the_open_interval_on_its_grid():
    assert float(reference.uniform(0, 0, 1)) == uniform_scalar(0, 0, 0)
    x = torch.tensor([0, 511, 512, M32 - 511, M32], dtype=torch.int64)
    u = ((x >> 9) * 2 + 1).to(torch.float32) * (2.0 ** -24)  # the contract, on its extremes
    assert u.tolist() == [2.0**-24, 2.0**-24, 3 * 2.0**-24, 1 - 2.0**-24, 1 - 2.0**-24]
    g = -torch.log(-torch.log(u))
    assert bool(torch.isfinite(g).all()) and -2.9 < float(g.min()) and float(g.max()) < 16.7
    draws = reference.uniform(torch.arange(64), 7, 4096).flatten()
    assert 0 < float(draws.min()) and float(draws.max()) < 1
    steps = draws.double() * 2**24
    assert bool((steps == steps.round()).all()) and bool((steps.long() % 2 == 1).all())


@needs_torch
def test_noise_is_gumbel_of_the_uniform_in_float32():
    seeds = torch.tensor([i * 0x9E3779B97F4A7C15 % 2**62 for i in range(16)])
    g = reference.noise(seeds, 3, 2048)
    u = reference.uniform(seeds, 3, 2048)
    assert g.dtype == torch.float32
    assert torch.equal(g, -torch.log(-torch.log(u)))
    exact = -torch.log(-torch.log(u.double()))
    assert bool(((g.double() - exact).abs() <= 4 * 2.0**-24 * (1 + exact.abs())).all())
    # Gumbel(0, 1): mean Euler's gamma, variance pi^2 / 6 (32768 draws)
    assert abs(float(g.double().mean()) - 0.5772156649) < 0.03
    assert abs(float(g.double().var()) - math.pi**2 / 6) < 0.06


@needs_torch
def test_noise_of_a_column_does_not_depend_on_the_vocabulary_or_the_split():
    seeds, offsets = torch.tensor([5, -3, 2**40]), torch.tensor([0, 9, 2**33])
    whole = reference.noise(seeds, offsets, 163840)
    assert torch.equal(reference.noise(seeds, offsets, 50257), whole[:, :50257])
    for tp in (2, 4, 8):
        shard = 163840 // tp
        parts = [reference.noise(seeds, offsets, torch.arange(r * shard, (r + 1) * shard))
                 for r in range(tp)]
        assert torch.equal(torch.cat(parts, dim=1), whole)
    scattered = torch.tensor([163839, 7, 0, 40000, 7])
    assert torch.equal(reference.noise(seeds, offsets, scattered), whole[:, scattered])


# ---- a slow sampler, row by row over sorted lists ----

def f32(v):
    """v rounded to float32 (an overflow to infinity included)."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(INF, v)


def first_max(values):
    """torch.argmax's choice: the first NaN, else the first of the largest."""
    for i, v in enumerate(values):
        if v != v:
            return i
    return values.index(max(values))


def slow_keep(t, top_k, top_p, min_p):
    """The columns the filters keep, for a row of float32 values with a finite maximum."""
    m = max(t)
    kept = sorted(range(len(t)), key=lambda c: (-t[c], c))
    if min_p > 0:
        threshold = f32(m + f32(math.log(min_p)))
        kept = [c for c in kept if t[c] >= threshold]
    if 0 < top_k < len(t):
        kept = kept[:top_k]
    if top_p < 1:
        # integer weights of a correctly rounded float32 exp, compared exactly
        # (Fractions); torch's float32 exp may differ in the last bit, which
        # matters only where a cut is that near (none of these rows)
        weights = [math.floor(f32(math.exp(f32(t[c] - m))) * 2**38) for c in kept]
        total = sum(weights)
        out, before = [], 0
        for c, w in zip(kept, weights):
            if not before < Fraction(top_p) * total:
                break
            out.append(c)
            before += w
        kept = out
    return set(kept)


def slow_token(x, temperature, top_k, top_p, min_p, g):
    if temperature == 0:
        return first_max(x)
    t = [f32(v / temperature) for v in x]
    if any(v != v for v in t) or not math.isfinite(max(t)):
        return first_max(t)
    kept = slow_keep(t, top_k, top_p, min_p)
    best, token = -INF, None
    for c in sorted(kept):
        score = f32(t[c] + g[c])
        if token is None or score > best:
            best, token = score, c
    return token


def slow_logprobs(x):
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def hostile_row(rng, vocab):
    kind = rng.randrange(12)
    if kind == 0:
        return [rng.choice([0.0, 1.5, -2.0])] * vocab  # all equal
    if kind == 1:
        return [float(rng.randrange(4)) for _ in range(vocab)]  # many ties
    if kind == 2:
        row = [rng.gauss(0, 3) for _ in range(vocab)]
        for _ in range(rng.randrange(1, vocab + 1)):
            row[rng.randrange(vocab)] = -INF
        return row
    if kind == 3:
        return [-INF] * vocab
    if kind == 4:
        row = [rng.gauss(0, 1) for _ in range(vocab)]
        row[rng.randrange(vocab)] = rng.choice([NAN, INF])
        return row
    if kind == 5:
        return [rng.gauss(0, 1) * 1e38 for _ in range(vocab)]  # t = x / T overflows
    if kind == 6:
        return [rng.gauss(0, 0.01) for _ in range(vocab)]  # nearly flat
    return [rng.gauss(0, rng.choice([1, 4, 20])) for _ in range(vocab)]


def draw_params(rng, vocab):
    return (rng.choice([0.0, 0.0, 1e-3, 0.37, 0.5, 1.0, 1.0, 1.7, 2.0, 9.5]),
            rng.choice([0, 0, 1, 2, 3, max(1, vocab - 1), vocab, vocab + 5]),
            rng.choice([1.0, 1.0, 1e-7, 0.05, 0.3, 0.5, 0.9, 0.99999, 1 - 2**-24]),
            rng.choice([0.0, 0.0, 1e-6, 0.05, 0.3, 0.999, 1.0]))


def random_batch(rng, vocab, rows, dtype, k_dtype=torch.int64 if torch else None,
                 p_dtype=torch.float32 if torch else None):
    """rows hostile rows of logits in dtype, and sample()'s arguments for them
    as per-row tensors (top_k and top_p of the dtypes given)."""
    logits = torch.tensor([hostile_row(rng, vocab) for _ in range(rows)])
    params = [draw_params(rng, vocab) for _ in range(rows)]
    return dict(
        logits=logits.to(getattr(torch, dtype)), params=params,
        temperature=torch.tensor([p[0] for p in params]),
        top_k=torch.tensor([p[1] for p in params], dtype=k_dtype),
        top_p=torch.tensor([p[2] for p in params], dtype=p_dtype),
        min_p=torch.tensor([p[3] for p in params]),
        seed=torch.tensor([rng.randrange(-(2**63), 2**63) for _ in range(rows)]),
        offset=torch.tensor([rng.randrange(2**40) for _ in range(rows)]))


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_sample_matches_the_slow_sampler(dtype):
    rng = random.Random({"float32": 11, "bfloat16": 12, "float16": 13}[dtype])
    for vocab in (1, 2, 5, 33, 300):
        rows = 60
        b = random_batch(rng, vocab, rows, dtype, torch.int32, torch.float64)
        logits, params, temperature, top_k, top_p, min_p, seed, offset = (
            b[k] for k in ("logits", "params", "temperature", "top_k", "top_p", "min_p",
                           "seed", "offset"))
        n = min(vocab, 4)
        out = reference.sample(logits, temperature, top_k, top_p, min_p, seed=seed,
                               offset=offset, logprobs=n)
        g = reference.noise(seed, offset, vocab)
        x = logits.float().tolist()
        for i in range(rows):
            t_, k_, p_, mp_ = (float(temperature[i]), int(top_k[i]), f32(float(top_p[i])),
                               f32(float(min_p[i])))
            want = slow_token(x[i], t_, k_, p_, mp_, g[i].tolist())
            assert int(out.tokens[i]) == want, (dtype, vocab, i, params[i], x[i])
            ordered = sorted(range(vocab), key=lambda c: (not x[i][c] != x[i][c], -x[i][c]
                                                          if x[i][c] == x[i][c] else 0, c))
            assert out.top_indices[i].tolist() == ordered[:n]
            assert int(out.rank[i]) == sum(v >= x[i][want] for v in x[i])
            if all(math.isfinite(v) for v in x[i]):
                lp = slow_logprobs(x[i])
                assert float(out.logprob[i]) == pytest.approx(lp[want], rel=1e-6, abs=1e-6)
                assert out.top_logprobs[i].tolist() == pytest.approx(
                    [lp[c] for c in ordered[:n]], rel=1e-6, abs=1e-6)


@needs_torch
def test_keep_mask_matches_the_slow_filters():
    rng = random.Random(5)
    for vocab in (3, 40, 1000):
        logits = torch.tensor([hostile_row(rng, vocab) for _ in range(40)])
        params = [draw_params(rng, vocab) for _ in range(40)]
        params = [(p[0] or 1.0,) + p[1:] for p in params]
        kept = reference.keep_mask(logits, torch.tensor([p[0] for p in params]),
                                   torch.tensor([p[1] for p in params]),
                                   torch.tensor([p[2] for p in params]),
                                   torch.tensor([p[3] for p in params]))
        for i, (t_, k_, p_, mp_) in enumerate(params):
            t = [f32(v / f32(t_)) for v in logits[i].tolist()]
            if any(v != v for v in t) or not math.isfinite(max(t)):
                want = {first_max(t)}
            else:
                want = slow_keep(t, k_, f32(p_), f32(mp_))
            assert set(kept[i].nonzero().flatten().tolist()) == want, (i, params[i])


@needs_torch
def test_filter_edges():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0]])
    keep = lambda **kw: reference.keep_mask(x, 1.0, **kw)[0].nonzero().flatten().tolist()
    assert keep(top_k=1) == [0] and keep(top_k=2) == [0, 2]  # exactly k, equals by column
    assert keep(min_p=1.0) == [0, 2, 4]  # a value threshold: every equal of the maximum
    assert keep(top_p=1e-7) == [0]
    # three weights of 1, then e^-1 and e^-2
    total = 3 + math.exp(-1) + math.exp(-2)
    assert keep(top_p=2 / total * (1 - 1e-6)) == [0, 2]
    assert keep(top_p=2 / total * (1 + 1e-6)) == [0, 2, 4]
    # a prefix whose mass is exactly p is enough (equal weights: exact sums)
    flat = torch.zeros(1, 4)
    assert reference.keep_mask(flat, 1.0, top_p=0.5)[0].tolist() == [True, True, False, False]
    assert reference.keep_mask(flat, 1.0, top_p=0.75)[0].tolist() == [True, True, True, False]
    assert keep(top_k=0, top_p=1.0, min_p=0.0) == [0, 1, 2, 3, 4]
    assert keep(top_k=5) == keep(top_k=6) == [0, 1, 2, 3, 4]
    margin = lambda y, **kw: reference.top_p_margin(y, 1.0, **kw).tolist()
    assert margin(flat, top_p=0.5) == [0.0] and margin(flat, top_p=0.625) == [0.125]
    assert margin(flat, top_p=1.0) == [INF] and margin(flat, top_k=1, top_p=0.5) == [0.5]
    assert margin(torch.tensor([[NAN, 1.0]]), top_p=0.5) == [INF]
    # top-p after top-k renormalizes over the top k
    assert keep(top_k=2, top_p=0.5) == [0]
    assert keep(top_k=2, top_p=0.5000001) == [0, 2]
    # min-p on the tempered values
    y = torch.tensor([[0.0, -1.0, -2.0]])
    lo = reference.keep_mask(y, 0.5, min_p=math.exp(-2.5))[0].tolist()
    hi = reference.keep_mask(y, 2.0, min_p=math.exp(-2.5))[0].tolist()
    assert lo == [True, True, False] and hi == [True, True, True]


@needs_torch
def test_special_rows():
    x = torch.tensor([[0.0, NAN, 1.0, NAN], [1.0, INF, INF, 2.0], [-INF] * 4,
                      [3e38, 1.0, 3e38, 0.0], [-INF, 2.0, -INF, 1.0]])
    for t in (0.0, 0.5, 1.0):
        out = reference.sample(x, t, top_k=1, top_p=0.1, min_p=0.5, seed=3, logprobs=2)
        want = [1, 1, 0, 0, 1]
        assert out.tokens.tolist() == want, t
    assert math.isnan(reference.sample(x, 1.0).logprob[0])
    # a row whose maximum is finite keeps -inf columns out
    many = reference.sample(x[4:].expand(512, 4), 5.0, seed=torch.arange(512)).tokens
    assert set(many.tolist()) == {1, 3}


@needs_torch
def test_top_logprobs_take_every_nan_alike():
    # NaNs of other bits (a quiet NaN's payload, a negative NaN): all above
    # +Inf, by column, whatever torch.sort would make of their bits
    bits = torch.tensor([[0x3F800000, 0x7FFFFFFF, 0x7F800000, 0x7FC00000, 0xFFC00001 - 2**32,
                          0x40000000]], dtype=torch.int32)
    x = bits.view(torch.float32)
    out = reference.sample(x, 1.0, logprobs=6)
    assert out.top_indices.tolist() == [[1, 3, 4, 2, 5, 0]]
    assert int(out.tokens[0]) == 1


@needs_torch
def test_greedy_is_argmax_whatever_the_filters():
    rng = random.Random(2)
    logits = torch.tensor([hostile_row(rng, 64) for _ in range(200)]).bfloat16()
    out = reference.sample(logits, 0.0, top_k=3, top_p=0.2, min_p=0.9,
                           seed=torch.arange(200), offset=7)
    assert torch.equal(out.tokens, torch.argmax(logits.float(), dim=-1))


@needs_torch
def test_seeds_and_offsets_draw_apart_and_repeat():
    logits = torch.zeros(1, 1000).expand(256, 1000)
    by_seed = reference.sample(logits, 1.0, seed=torch.arange(256), offset=5).tokens
    by_offset = reference.sample(logits, 1.0, seed=5, offset=torch.arange(256)).tokens
    assert len(set(by_seed.tolist())) > 200 and len(set(by_offset.tolist())) > 200
    again = reference.sample(logits, 1.0, seed=torch.arange(256), offset=5).tokens
    assert torch.equal(by_seed, again)
    # 64-bit values: the high words matter, and -1 is 2^64 - 1
    hi = reference.sample(logits[:2], 1.0, seed=torch.tensor([1, 1 + 2**32]), offset=0).tokens
    assert hi[0] != hi[1]
    assert torch.equal(reference.sample(logits[:1], 1.0, seed=-1, offset=-1).tokens,
                       reference.sample(logits[:1], 1.0, seed=2**64 - 1, offset=2**64 - 1).tokens)


@needs_torch
def test_sample_does_not_depend_on_padding_or_the_other_rows():
    rng = random.Random(9)
    logits = torch.tensor([hostile_row(rng, 100) for _ in range(64)])
    finite = torch.isfinite(logits.amax(dim=-1)) & ~logits.isnan().any(dim=-1)
    logits = logits[finite]
    rows = logits.shape[0]
    kw = dict(top_k=torch.randint(0, 20, (rows,)), top_p=0.8, min_p=0.01,
              seed=torch.arange(rows) * 7919, offset=3)
    base = reference.sample(logits, 0.9, **kw).tokens
    padded = torch.cat((logits, torch.full((rows, 28), -INF)), dim=1)
    assert torch.equal(reference.sample(padded, 0.9, **kw).tokens, base)
    one = [int(reference.sample(logits[i:i + 1], 0.9, top_k=int(kw["top_k"][i]), top_p=0.8,
                                min_p=0.01, seed=int(kw["seed"][i]), offset=3).tokens)
           for i in range(rows)]
    assert one == base.tolist()


# ---- the C reference the differential suite holds kl_sample to ----

C_REFERENCE = os.path.join(os.path.dirname(__file__), os.pardir, "diff", "diff_sample.c")


@pytest.fixture(scope="module")
def c_reference(tmp_path_factory):
    """tests/diff/diff_sample.c built into a shared library, through ctypes."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path_factory.mktemp("sample_ref") / "libsample_ref.so"
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-o", str(lib), C_REFERENCE, "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    f32p, i64p = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64)
    so.sample_tempered.argtypes = [f32p, ctypes.c_int64, ctypes.c_float, f32p]
    so.sample_tempered.restype = ctypes.c_float
    so.sample_token.argtypes = [f32p, ctypes.c_float, ctypes.c_int64,
                                ctypes.POINTER(SampleArgs), f32p, f32p, i64p]
    so.sample_token.restype = ctypes.c_int64
    so.sample_logprob.argtypes = [f32p, ctypes.c_int64, ctypes.c_int64, i64p]
    so.sample_logprob.restype = ctypes.c_float
    so.sample_top.argtypes = [f32p, ctypes.c_int64, ctypes.c_int, i64p]
    so.sample_top.restype = ctypes.c_int
    so.sample_penalized.argtypes = [ctypes.c_float, ctypes.c_int32, ctypes.c_int,
                                    ctypes.c_float, ctypes.c_float, ctypes.c_float]
    so.sample_penalized.restype = ctypes.c_float
    return so


class SampleArgs(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int64),
                ("top_p", ctypes.c_float), ("min_p", ctypes.c_float)]


def as_ptr(tensor, ctype):
    """A contiguous CPU tensor's data as a ctypes pointer."""
    assert tensor.is_contiguous() and tensor.device.type == "cpu"
    return ctypes.cast(tensor.data_ptr(), ctypes.POINTER(ctype))


def c_sample_row(so, x, args, g):
    """One row through the C reference; e as the Python reference rounds it
    (torch's exp of the sorted values, put back in column order)."""
    vocab = x.shape[0]
    t = torch.empty(vocab, dtype=torch.float32)
    m = so.sample_tempered(as_ptr(x, ctypes.c_float), vocab, float(args.temperature),
                           as_ptr(t, ctypes.c_float))
    e = torch.zeros(vocab, dtype=torch.float32)
    if math.isfinite(m):
        values, order = torch.sort(t, descending=True, stable=True)
        e[order] = torch.exp(values - torch.tensor(m, dtype=torch.float32))
    kept = ctypes.c_int64()
    token = so.sample_token(as_ptr(t, ctypes.c_float), m, vocab, ctypes.byref(args),
                            as_ptr(e, ctypes.c_float), as_ptr(g, ctypes.c_float),
                            ctypes.byref(kept))
    rank = ctypes.c_int64()
    lp = so.sample_logprob(as_ptr(x, ctypes.c_float), vocab, token, ctypes.byref(rank))
    return token, lp, rank.value


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_c_reference_matches_the_python_one(c_reference, dtype):
    rng = random.Random({"float32": 21, "bfloat16": 22}[dtype])
    for vocab in (1, 2, 7, 64, 1000):
        rows = 80
        b = random_batch(rng, vocab, rows, dtype)
        n = min(vocab, 5)
        out = reference.sample(b["logits"], b["temperature"], b["top_k"], b["top_p"],
                               b["min_p"], seed=b["seed"], offset=b["offset"], logprobs=n)
        g = reference.noise(b["seed"], b["offset"], vocab).contiguous()
        x = b["logits"].float().contiguous()
        for i in range(rows):
            t_, k_, p_, mp_ = b["params"][i]
            args = SampleArgs(t_, 0 if k_ >= vocab else k_, p_, mp_)
            token, lp, rank = c_sample_row(c_reference, x[i], args, g[i])
            where = (dtype, vocab, i, b["params"][i])
            assert token == int(out.tokens[i]), where
            assert rank == int(out.rank[i]), where
            want = float(out.logprob[i])
            # a sum in float64 in another order: 1 ulp of float32, and near
            # log 1 = 0 (a logprob of -8e-12 is 1 - 8e-12 in the sum) 1e-14
            assert (math.isnan(lp) and math.isnan(want)) or lp == pytest.approx(
                want, rel=2**-23, abs=1e-14), where
            top = torch.empty(n, dtype=torch.int64)
            assert c_reference.sample_top(as_ptr(x[i], ctypes.c_float), vocab, n,
                                          as_ptr(top, ctypes.c_int64)) == 0
            assert top.tolist() == out.top_indices[i].tolist(), where


@needs_torch
def test_c_penalties_match_the_python_ones_bit_for_bit(c_reference):
    gen = torch.Generator().manual_seed(23)
    rows, vocab = 64, 97
    x = torch.randn(rows, vocab, generator=gen) * 8
    x[:, :3] = torch.tensor([0.0, -math.inf, math.inf])
    x[:, 3] = torch.tensor(1e-40)  # a subnormal, and below it its negative
    x[:, 4] = torch.tensor(-1e-40)
    counts = torch.where(torch.rand(rows, vocab, generator=gen) < 0.3,
                         torch.randint(1, 9, (rows, vocab), generator=gen), 0).to(torch.int32)
    counts[0, 5] = 20000001  # not a float: rounded once, as vLLM's int-to-float is
    prompt = torch.rand(rows, vocab, generator=gen) < 0.3
    words = torch.zeros(rows, (vocab + 31) // 32, dtype=torch.int64)
    for c in range(vocab):
        words[:, c // 32] |= prompt[:, c].to(torch.int64) << (c % 32)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    pick = lambda *v: torch.tensor(v, dtype=torch.float32)[
        torch.randint(0, len(v), (rows,), generator=gen)]
    rep = pick(1.0, 0.5, 1.1, 1.3, 2.0, 1e-3, 0.7)
    freq = pick(0.0, 0.1, -0.5, 1.0, 2.0, -2.0, 0.3)
    pres = pick(0.0, 0.1, -0.5, 1.0, 2.0, -2.0, 0.3)
    want = reference.process_logits(x, repetition_penalty=rep, frequency_penalty=freq,
                                    presence_penalty=pres, prompt_mask=words,
                                    output_counts=counts)
    for r in range(rows):
        for c in range(vocab):
            got = c_reference.sample_penalized(float(x[r, c]), int(counts[r, c]),
                                               int(prompt[r, c]), float(rep[r]),
                                               float(freq[r]), float(pres[r]))
            w = float(want[r, c])
            # the same float, but -0 and +0 (the C one reads -0 as +0)
            assert got == w or (math.isnan(got) and math.isnan(w)), (r, c, got, w)


# ---- vLLM's own filters (where vLLM is installed: .ci/engines.sh's venv) ----

@needs_torch
def test_top_k_top_p_agree_with_vllm_apart_from_ties_and_rounding():
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    gen = torch.Generator().manual_seed(4)
    rows, vocab = 400, 257
    x = torch.randn(rows, vocab, generator=gen) * torch.rand(rows, 1, generator=gen) * 6
    k = torch.randint(1, vocab + 1, (rows,), generator=gen)
    p = torch.rand(rows, generator=gen).clamp(min=0.01)
    p[::5] = 1.0
    k[1::5] = vocab
    theirs = torch.isfinite(ops.apply_top_k_top_p(x.clone(), k, p))
    ours = reference.keep_mask(x, 1.0, top_k=k, top_p=p)
    # vLLM's float32 cumsum against the reference's float64 sums: compare
    # only rows whose top-p cut is not within float32 rounding of p
    clear = reference.top_p_margin(x, 1.0, top_k=k, top_p=p) > 1e-5
    assert int(clear.sum()) > rows * 0.9
    assert torch.equal(theirs[clear], ours[clear])
    # equals of the k-th value: vLLM's PyTorch path keeps them all, the
    # reference (as vLLM's Triton kernel) exactly k, the lowest columns
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    two = torch.tensor([2])
    assert torch.isfinite(ops.apply_top_k_top_p_pytorch(ties.clone(), two, None)).tolist() == [
        [False, True, True, False, True]]
    assert reference.keep_mask(ties, 1.0, top_k=2).tolist() == [[False, True, True, False, False]]


# ---- the distribution ----

def chi2_sf(x, df):
    """P(X > x) for X chi-square with df degrees of freedom: the regularized
    upper incomplete gamma Q(df / 2, x / 2), by its series below a + 1 and its
    continued fraction (Lentz) above."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= z / n
            total += term
        return 1.0 - total * math.exp(log_front)
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h * math.exp(log_front)


def test_chi2_sf_known_values():
    # scipy.stats.chi2.sf at these points (scipy 1.17)
    assert chi2_sf(3.84145882069412, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(9.0, 9) == pytest.approx(0.43727418891386693, rel=1e-9)
    assert chi2_sf(30.0, 5) == pytest.approx(1.4748581038443073e-05, rel=1e-9)
    assert chi2_sf(2.0, 10) == pytest.approx(0.9963401531726563, rel=1e-9)
    try:
        from scipy.stats import chi2
    except ImportError:
        return
    for x, df in ((0.5, 1), (7.3, 4), (50.0, 30), (120.0, 99), (1.0, 17)):
        assert chi2_sf(x, df) == pytest.approx(float(chi2.sf(x, df)), rel=1e-9)


DISTRIBUTION_CASES = [  # temperature, top_k, top_p, min_p
    (1.0, 0, 1.0, 0.0),
    (0.7, 5, 1.0, 0.0),
    (1.3, 0, 0.8, 0.0),
    (1.0, 0, 1.0, 0.1),
    (0.9, 6, 0.9, 0.05),
    (2.0, 3, 0.7, 0.0),
]


@needs_torch
@pytest.mark.parametrize("case", DISTRIBUTION_CASES)
def test_draws_follow_the_filtered_softmax(case):
    temperature, top_k, top_p, min_p = case
    x = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0, 0.8, 1.2])
    draws = 120000
    rng = random.Random(hash(case) & M32)
    seed = torch.tensor([rng.randrange(-(2**63), 2**63) for _ in range(draws)])
    offset = torch.arange(draws) * 3 + rng.randrange(2**32)
    tokens = reference.sample(x.expand(draws, -1), temperature, top_k, top_p, min_p,
                              seed=seed, offset=offset).tokens
    counts = torch.bincount(tokens, minlength=x.numel()).tolist()
    t = [f32(v / temperature) for v in x.tolist()]
    kept = slow_keep(t, top_k, f32(top_p), f32(min_p))
    assert all(counts[c] == 0 for c in range(x.numel()) if c not in kept)
    m = max(t)
    weights = {c: math.exp(t[c] - m) for c in kept}
    total = math.fsum(weights.values())
    expected = {c: draws * w / total for c, w in weights.items()}
    assert min(expected.values()) > 20
    stat = sum((counts[c] - e) ** 2 / e for c, e in expected.items())
    assert chi2_sf(stat, len(kept) - 1) > 1e-3, (case, counts, expected)


# ---- vLLM's noise: murmur3, as Appleby's MurmurHash3_x86_32 ----

def murmur3_scalar(data, seed=0):
    """MurmurHash3_x86_32 of bytes, in plain Python."""
    h = seed
    rotl = lambda v, s: ((v << s) | (v >> (32 - s))) & M32  # noqa: E731

    def mix(h, k):
        k = rotl(k * 0xCC9E2D51 & M32, 15) * 0x1B873593 & M32
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & M32

    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        h = mix(h, int.from_bytes(data[i:i + 4], "little"))
    tail = int.from_bytes(data[n:], "little")
    if tail or len(data) > n:
        h ^= rotl(tail * 0xCC9E2D51 & M32, 15) * 0x1B873593 & M32
    h ^= len(data)
    h = (h ^ (h >> 16)) * 0x85EBCA6B & M32
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & M32
    return h ^ (h >> 16)


def test_scalar_murmur3_known_answers():
    assert murmur3_scalar(b"", 0) == 0
    assert murmur3_scalar(b"", 1) == 0x514E28B7
    assert murmur3_scalar(b"", 0xFFFFFFFF) == 0x81F16F39
    assert murmur3_scalar(b"\0\0\0\0", 0) == 0x2362F9DE
    assert murmur3_scalar(b"Hello, world!", 0x9747B28C) == 0x24884CBA
    assert murmur3_scalar(b"The quick brown fox jumps over the lazy dog", 0x9747B28C) == 0x2FA826CD


@needs_torch
def test_vllm_bits_are_murmur3_of_seed_position_column():
    rng = random.Random(8)
    seeds = [0, -1, 2**63 - 1, -(2**63)] + [rng.randrange(-(2**63), 2**63) for _ in range(8)]
    offsets = [0, 2**32 - 1, 2**32 + 5, 2**62] + [rng.randrange(2**40) for _ in range(8)]
    cols = torch.tensor([0, 1, 2, 3, 4, 1023, 1024, 65535, 65536, 2**31, 2**32 - 1])
    got = reference.vllm_bits(torch.tensor(seeds), torch.tensor(offsets), cols)
    for i, (s, o) in enumerate(zip(seeds, offsets)):
        for j, c in enumerate(cols.tolist()):
            key = struct.pack("<4I", s % 2**64 & M32, s % 2**64 >> 32, o & M32, c)
            assert int(got[i, j]) == murmur3_scalar(key), (s, o, c)
    # the uniform: float32((x + 1/2) * 2^-32), the largest x rounding to 1
    x = got.flatten().tolist()
    u = reference.vllm_uniform(torch.tensor(seeds), torch.tensor(offsets), cols).flatten()
    assert u.tolist() == [f32((v + 0.5) * 2.0**-32) for v in x]


@needs_torch
def test_vllm_noise_is_gumbel_of_its_uniform_and_finite():
    u = torch.tensor([2.0**-33, 1e-6, 0.1, 0.2499999, 0.25, 0.5, 0.9, 1 - 2**-24, 1.0])
    l1p = reference._vllm_log1p_neg(u)
    want = [math.log1p(-v) for v in u.tolist()[:-1]] + [math.log(2**-24)]
    # the series' error stays below 6e-7 (vLLM's bound), log's below 1e-6
    assert l1p.tolist() == pytest.approx(want, rel=1e-6, abs=6e-7)
    g = -torch.log(-l1p)
    assert torch.isfinite(g).all() and float(g[0]) == pytest.approx(-math.log(2.0**-33))
    seed, offset = torch.tensor([5, -7]), torch.tensor([3, 2**33 + 9])
    full = reference.vllm_noise(seed, offset, 3000)
    assert torch.equal(full, -torch.log(-reference._vllm_log1p_neg(
        reference.vllm_uniform(seed, offset, 3000))))
    # keyed by the column, and by the low 32 bits of the position alone (vLLM's)
    cols = torch.tensor([2999, 7, 1024])
    assert torch.equal(reference.vllm_noise(seed, offset, cols), full[:, cols])
    assert torch.equal(reference.vllm_noise(seed, offset + 2**32, 3000), full)
    assert not torch.equal(reference.vllm_noise(seed, offset + 1, 3000), full)


@needs_torch
def test_sample_with_vllm_noise_matches_the_slow_sampler():
    rng = random.Random(9)
    for vocab in (1, 5, 300):
        rows = 60
        b = random_batch(rng, vocab, rows, "float32")
        out = reference.sample(b["logits"], b["temperature"], b["top_k"], b["top_p"],
                               b["min_p"], seed=b["seed"], offset=b["offset"], noise="vllm")
        g = reference.vllm_noise(b["seed"], b["offset"], vocab)
        x = b["logits"].tolist()
        for i in range(rows):
            t_, k_, p_, mp_ = b["params"][i]
            want = slow_token(x[i], t_, k_, f32(p_), f32(mp_), g[i].tolist())
            assert int(out.tokens[i]) == want, (vocab, i, b["params"][i])


# ---- logits processing ----

def packed(columns, vocab):
    """A packed int32 bit row with the given columns set."""
    w = [0] * ((vocab + 31) // 32)
    for c in columns:
        w[c // 32] |= 1 << (c % 32)
    return [v - 2**32 if v >= 2**31 else v for v in w]


def slow_process(x, vocab, r):
    """The processors of one row, from sample()'s definition, in Python
    floats rounded to float32: r holds the row's lists and values."""
    x = [v if c in r["grammar"] else -INF for c, v in enumerate(x)]
    if r["allowed"]:
        x = [v if c in r["allowed"] else -INF for c, v in enumerate(x)]
    last = dict(r["bias"])  # the last entry of an id
    x = [f32(v + last[c]) if c in last else v for c, v in enumerate(x)]
    if r["stop"] and r["position"] + 1 < r["min_len"]:
        kept = [-INF if c in r["stop"] else v for c, v in enumerate(x)]
        if r["restore"] and all(v == -INF for v in kept):
            kept = [v if c in r["stop"] and math.isfinite(v) else kept[c]
                    for c, v in enumerate(x)]
        x = kept
    rp, fp, pp = r["penalties"]
    if rp != 1 or fp != 0 or pp != 0:
        out = []
        for c, v in enumerate(x):
            n = r["counts"][c]
            if rp != 1 and (c in r["prompt"] or n > 0):
                v = f32(v * f32(1 / rp)) if v > 0 else f32(v * rp)
            v = f32(v - f32(fp * n))
            out.append(f32(v - (pp if n > 0 else 0.0)))
        x = out
    return [-INF if c in r["banned"] else v for c, v in enumerate(x)]


def random_requests(rng, vocab, states):
    """Random per-request processing state, as Python lists."""
    reqs = []
    for _ in range(states):
        ids = lambda n: [rng.randrange(vocab) if rng.random() < 0.7 else  # noqa: E731
                         rng.randrange(min(vocab, 4)) for _ in range(n)]
        counts = [0] * vocab
        for c in ids(rng.randrange(20)):
            counts[c] += 1
        reqs.append(dict(
            allowed=ids(rng.choice([0, 0, 1, 5])),
            bias=[(c, f32(rng.uniform(-100, 100))) for c in ids(rng.choice([0, 1, 7, 40]))],
            stop=ids(rng.choice([0, 1, 3])), min_len=rng.randrange(40), restore=rng.random() < .5,
            penalties=(f32(rng.choice([1.0, 0.5, 1.3])), f32(rng.choice([0.0, -1.5, 0.7])),
                       f32(rng.choice([0.0, 2.0, -0.3]))),
            prompt=set(ids(rng.randrange(10))), counts=counts))
    return reqs


def as_tables(reqs, vocab, width=64):
    """The requests' lists as sample()'s tables (entries past a count stale)."""
    def table(lists, dtype=torch.int32, stale=-3):
        t = torch.full((len(lists), width), stale, dtype=dtype)
        for i, v in enumerate(lists):
            t[i, :len(v)] = torch.tensor(v, dtype=dtype)
        return t

    count = lambda key: torch.tensor([len(r[key]) for r in reqs], dtype=torch.int32)  # noqa
    return dict(
        allowed_token_ids=(count("allowed"), table([r["allowed"] for r in reqs])),
        logit_bias=(count("bias"), table([[c for c, _ in r["bias"]] for r in reqs]),
                    table([[v for _, v in r["bias"]] for r in reqs], torch.float32, NAN)),
        min_tokens=(torch.tensor([r["min_len"] for r in reqs], dtype=torch.int32), count("stop"),
                    table([r["stop"] for r in reqs]),
                    torch.tensor([int(r["restore"]) for r in reqs], dtype=torch.int32)),
        repetition_penalty=torch.tensor([r["penalties"][0] for r in reqs]),
        frequency_penalty=torch.tensor([r["penalties"][1] for r in reqs]),
        presence_penalty=torch.tensor([r["penalties"][2] for r in reqs]),
        prompt_mask=torch.tensor([packed(r["prompt"], vocab) for r in reqs], dtype=torch.int32),
        output_counts=torch.tensor([r["counts"] for r in reqs], dtype=torch.int32))


@needs_torch
def test_processing_matches_the_slow_definition():
    rng = random.Random(10)
    for vocab in (1, 7, 40, 100):
        states, rows = 12, 30
        reqs = random_requests(rng, vocab, states)
        state_rows = [rng.randrange(states) for _ in range(rows)]
        x = [hostile_row(rng, vocab) if rng.random() < 0.3 else
             [rng.gauss(0, 3) for _ in range(vocab)] for _ in range(rows)]
        position = [rng.randrange(40) for _ in range(rows)]
        grammar = [set(range(vocab)) if rng.random() < 0.5 else
                   {c for c in range(vocab) if rng.random() < 0.3} for _ in range(rows)]
        banned = [[rng.randrange(vocab) for _ in range(rng.randrange(3))] for _ in range(rows)]
        got = reference.process_logits(
            torch.tensor(x), state_rows=torch.tensor(state_rows), position=torch.tensor(position),
            bitmask=torch.tensor([packed(g, vocab) for g in grammar], dtype=torch.int32),
            banned=torch.tensor([b + [-1] * (3 - len(b)) for b in banned], dtype=torch.int32),
            **as_tables(reqs, vocab))
        for i in range(rows):
            r = dict(reqs[state_rows[i]], grammar=grammar[i], banned=set(banned[i]),
                     position=position[i])
            want = slow_process([f32(v) for v in x[i]], vocab, r)
            row = got[i].tolist()
            assert all(a == b or (a != a and b != b) for a, b in zip(row, want)), (vocab, i, r)


@needs_torch
def test_state_rows_read_the_tables_as_gathered_ones():
    rng = random.Random(11)
    vocab, states = 50, 9
    tables = as_tables(random_requests(rng, vocab, states), vocab)
    rows = torch.tensor([3, 3, 0, 8, 5])
    gathered = {k: tuple(t[rows] for t in v) if isinstance(v, tuple) else v[rows]
                for k, v in tables.items()}
    x = torch.randn(5, vocab)
    pos = torch.tensor([0, 30, 5, 2, 1])
    a = reference.process_logits(x, state_rows=rows, position=pos, **tables)
    b = reference.process_logits(x, position=pos, **gathered)
    assert torch.equal(a, b)
    # and scalars are every request's
    c = reference.process_logits(x, state_rows=rows, frequency_penalty=0.5,
                                 output_counts=tables["output_counts"])
    counts = tables["output_counts"][rows].float()
    assert torch.equal(c, x - 0.5 * counts - 0.0 * counts) and not torch.equal(c, x)


@needs_torch
def test_processing_edges():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 2)
    one = torch.tensor([1, 1], dtype=torch.int32)
    # a repeated bias id: the last entry, added once
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    bias = (i32([3, 3]), i32([[1, 1, 2]] * 2), torch.tensor([[10.0, -5.0, 1.0]] * 2))
    assert reference.process_logits(x, logit_bias=bias)[0].tolist() == [1.0, -3.0, 4.0, 4.0]
    # min_tokens: masked while position + 1 < min_len; restored only where
    # nothing else is left and restore is set
    stop = (i32([5, 5]), one, i32([[3], [3]]), i32([0, 1]))
    pos = torch.tensor([3, 4])
    assert reference.process_logits(x, min_tokens=stop, position=pos).tolist() == [
        [1.0, 2.0, 3.0, -INF], [1.0, 2.0, 3.0, 4.0]]
    allowed = (one, i32([[3], [3]]))
    pos = torch.tensor([3, 3])
    assert reference.process_logits(x, allowed_token_ids=allowed, min_tokens=stop,
                                    position=pos).tolist() == [[-INF] * 4, [-INF] * 3 + [4.0]]
    # repetition: positive logits divided (by a rounded reciprocal), others multiplied
    y = torch.tensor([[3.0, -3.0, 3.0, 0.0]])
    mask = torch.tensor([[0b0011]], dtype=torch.int32)
    got = reference.process_logits(y, repetition_penalty=3.0, prompt_mask=mask,
                                   output_counts=torch.zeros(1, 4, dtype=torch.int32))
    assert got.tolist() == [[f32(3.0 * f32(1 / 3)), -9.0, 3.0, 0.0]]
    # a bitmask's bits past the vocabulary are not read; all zero masks all
    for v in (1, 33):
        full = reference.process_logits(torch.zeros(2, v), bitmask=torch.tensor(
            [[-1] * ((v + 31) // 32), [0] * ((v + 31) // 32)], dtype=torch.int32))
        assert full[0].tolist() == [0.0] * v and full[1].tolist() == [-INF] * v
        assert int(reference.sample(torch.zeros(2, v), 1.0, bitmask=torch.tensor(
            [[0] * ((v + 31) // 32)] * 2, dtype=torch.int32)).tokens[0]) == 0


@needs_torch
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logprobs",
                                  "processed_logits"])
def test_logprobs_modes(mode):
    torch.manual_seed(12)
    rows, vocab = 8, 30
    x = torch.randn(rows, vocab) * 2
    mask = torch.full((rows, 1), -1, dtype=torch.int32)
    mask[0] = 0b1011
    kw = dict(bitmask=mask, frequency_penalty=1.0,
              output_counts=torch.randint(0, 3, (rows, vocab), dtype=torch.int32))
    t = torch.tensor([0.0, 0.7, 1.0, 1.5, 0.7, 0.7, 2.0, 1.0])
    k = torch.tensor([0, 5, 0, 0, 3, 0, 0, 0])
    out = reference.sample(x, t, top_k=k, seed=4, logprobs=20, logprobs_mode=mode, **kw)
    raw = torch.where(reference._unpack(mask, vocab), x, -INF)
    processed = reference.process_logits(x, **kw)
    keep = reference.keep_mask(processed, torch.where(t == 0, 1.0, t), top_k=k)
    processed = torch.where((t == 0)[:, None], processed,
                            torch.where(keep, processed / torch.where(t == 0, 1, t)[:, None], -INF))
    y = raw if mode.startswith("raw") else processed
    values = torch.log_softmax(y.double(), 1).float() if mode.endswith("logprobs") else y
    order = torch.sort(y, dim=1, descending=True, stable=True).indices
    assert torch.equal(out.top_indices, order[:, :20])
    assert torch.equal(out.top_logprobs, values.gather(1, out.top_indices))
    assert torch.equal(out.logprob, values.gather(1, out.tokens[:, None])[:, 0])
    assert torch.equal(out.rank, (y >= y.gather(1, out.tokens[:, None])).sum(1))
    assert keep.any(1).all() and (processed == -INF).any()


@needs_torch
def test_processing_arguments_are_checked():
    V = 40
    x = torch.zeros(3, V)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    rows = torch.tensor([0, 1, 1])
    counts = torch.zeros(2, V, dtype=torch.int32)
    ids = torch.zeros(2, 4, dtype=torch.int32)
    ok = dict(state_rows=rows, frequency_penalty=torch.zeros(2), output_counts=counts,
              logit_bias=(i32(1, 0), ids, torch.ones(2, 4)), bitmask=torch.full((3, 2), -1,
                                                                               dtype=torch.int32))
    reference.sample(x, 1.0, **ok)
    bad = [
        (ValueError, "bitmask has 1 words", dict(bitmask=torch.zeros(3, 1, dtype=torch.int32))),
        (ValueError, "bitmask has 3 words", dict(bitmask=torch.zeros(3, 3, dtype=torch.int32))),
        (ValueError, "bitmask has shape", dict(bitmask=torch.zeros(2, 2, dtype=torch.int32))),
        (TypeError, "bitmask must be a torch.int32", dict(bitmask=torch.zeros(3, 2))),
        (ValueError, r"logprobs must be in \[0, 40\]", dict(logprobs=41)),
        (ValueError, "logprobs_mode", dict(logprobs_mode="raw")),
        (ValueError, "noise must be", dict(noise="murmur")),
        (ValueError, r"logit_bias ids must be in \[0, 40\).*row 1, entry 0 has 40",
         dict(logit_bias=(i32(0, 1), i32([0, 0], [40, 0]), torch.ones(2, 2)))),
        (ValueError, "logit_bias ids must be in", dict(logit_bias=(i32(1, 0), i32([-1], [0]),
                                                                   torch.ones(2, 1)))),
        (ValueError, r"logit_bias count must be in \[0, 4\]", dict(logit_bias=(
            i32(5, 0), ids, torch.ones(2, 4)))),
        (ValueError, "logit_bias count must be", dict(logit_bias=(i32(-1, 0), ids,
                                                                  torch.ones(2, 4)))),
        (ValueError, "logit_bias values must be finite", dict(logit_bias=(
            i32(1, 0), ids, torch.full((2, 4), INF)))),
        (ValueError, "logit_bias values has shape", dict(logit_bias=(i32(1, 0), ids,
                                                                     torch.ones(2, 3)))),
        (TypeError, "logit_bias must be a tuple", dict(logit_bias=(i32(1, 0), ids))),
        (TypeError, "allowed_token_ids count must be a torch.int32",
         dict(allowed_token_ids=(torch.tensor([1, 0]), ids))),
        (ValueError, "repetition_penalty must be finite and > 0",
         dict(repetition_penalty=0.0, prompt_mask=torch.zeros(2, 2, dtype=torch.int32))),
        (ValueError, "repetition_penalty must be finite", dict(
            repetition_penalty=torch.tensor([1.0, NAN]),
            prompt_mask=torch.zeros(2, 2, dtype=torch.int32))),
        (ValueError, "frequency_penalty must be finite", dict(frequency_penalty=INF)),
        (ValueError, "repetition_penalty needs prompt_mask", dict(repetition_penalty=1.2)),
        (ValueError, "prompt_mask has 1 words", dict(
            repetition_penalty=1.2, prompt_mask=torch.zeros(2, 1, dtype=torch.int32))),
        (ValueError, "the penalties need output_counts", dict(output_counts=None)),
        (ValueError, "penalties' tables", dict(frequency_penalty=None)),
        (ValueError, "output_counts must be >= 0", dict(output_counts=counts - 1)),
        (ValueError, "output_counts has shape", dict(output_counts=counts[:, :-1])),
        (ValueError, "state_rows reaches row 2", dict(state_rows=torch.tensor([0, 1, 2]))),
        (ValueError, "state_rows must be >= 0", dict(state_rows=torch.tensor([0, -1, 1]))),
        (TypeError, "state_rows must be a torch.int32 or torch.int64 tensor, not torch.float32",
         dict(state_rows=rows.float())),
        (ValueError, "has 2 rows, expected 3", dict(state_rows=None)),
        (ValueError, "position is used by min_tokens only", dict(position=torch.zeros(3).long())),
        (ValueError, "banned must be < 40", dict(banned=i32([0], [40], [-1]))),
        (ValueError, "banned has shape", dict(banned=i32([0], [1]))),
        (TypeError, "unexpected keyword", dict(logit_bias_ids=ids)),
    ]
    for error, match, change in bad:
        kw = dict(ok)
        kw.update(change)
        kw = {k: v for k, v in kw.items() if v is not None}
        with pytest.raises(error, match=match):
            reference.sample(x, 1.0, **kw)
    # min_tokens' position: process_logits needs it; sample reads each row's
    # offset without it (where vLLM passes its positions)
    stop = (torch.tensor([5, 5], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32),
            torch.tensor([[3], [4]], dtype=torch.int32), None)
    with pytest.raises(ValueError, match="min_tokens needs position"):
        reference.process_logits(x[:2], min_tokens=stop)
    pos = torch.tensor([1, 7])
    assert torch.equal(reference.sample(x[:2], 1.0, offset=pos, min_tokens=stop).tokens,
                       reference.sample(x[:2], 1.0, offset=pos, min_tokens=stop,
                                        position=pos).tokens)


# ---- arguments ----

@needs_torch
def test_arguments_are_checked():
    x = torch.zeros(3, 10)
    ok = reference.sample(x, 1.0)
    assert ok.tokens.shape == (3,)
    bad = [
        (TypeError, dict(logits=x.double())),
        (TypeError, dict(logits=x.long())),
        (TypeError, dict(logits=[[0.0]])),
        (ValueError, dict(logits=torch.zeros(10))),
        (ValueError, dict(logits=torch.zeros(3, 0))),
        (ValueError, dict(temperature=-0.5)),
        (ValueError, dict(temperature=NAN)),
        (ValueError, dict(temperature=INF)),
        (ValueError, dict(temperature=1e39)),  # infinite as a float32
        (TypeError, dict(temperature=None)),
        (TypeError, dict(temperature="1")),
        (TypeError, dict(temperature=True)),
        (ValueError, dict(temperature=torch.tensor([1.0, -1.0, 1.0]))),
        (ValueError, dict(temperature=torch.ones(2))),
        (ValueError, dict(temperature=torch.ones(3, 1))),
        (TypeError, dict(temperature=torch.ones(3, dtype=torch.int32))),
        (ValueError, dict(top_k=-1)),
        (TypeError, dict(top_k=2.0)),
        (TypeError, dict(top_k=torch.ones(3))),
        (ValueError, dict(top_k=torch.tensor([1, -2, 0]))),
        (ValueError, dict(top_p=0.0)),
        (ValueError, dict(top_p=1e-50)),  # 0 as a float32
        (ValueError, dict(top_p=1.5)),
        (ValueError, dict(top_p=NAN)),
        (ValueError, dict(top_p=torch.tensor([0.5, 0.0, 0.5]))),
        (ValueError, dict(min_p=-0.1)),
        (ValueError, dict(min_p=1.01)),
        (ValueError, dict(min_p=NAN)),
        (TypeError, dict(seed=1.0)),
        (TypeError, dict(seed=None)),
        (ValueError, dict(seed=2**64)),
        (ValueError, dict(seed=-(2**63) - 1)),
        (TypeError, dict(seed=torch.ones(3, dtype=torch.int32))),
        (ValueError, dict(seed=torch.ones(4, dtype=torch.int64))),
        (TypeError, dict(offset="0")),
        (ValueError, dict(offset=torch.ones(2, dtype=torch.int64))),
        (TypeError, dict(logprobs=1.0)),
        (ValueError, dict(logprobs=-1)),
        (ValueError, dict(logprobs=11)),
    ]
    for error, change in bad:
        kw = dict(logits=x, temperature=1.0)
        kw.update(change)
        with pytest.raises(error):
            reference.sample(**kw)
    # the off values, and what passes
    args = reference.check_sampling_args(3, 10, "cpu", torch.tensor([0.0, 0.5, 2.0]),
                                         top_k=torch.tensor([0, 10, 4], dtype=torch.int16),
                                         top_p=None, min_p=1.0, seed=2**64 - 1, offset=-5,
                                         logprobs=10)
    assert args.top_k.tolist() == [0, 0, 4] and args.top_k.dtype == torch.int64
    assert args.top_p.tolist() == [1.0] * 3 and args.min_p.tolist() == [1.0] * 3
    assert args.seed.tolist() == [-1] * 3 and args.offset.tolist() == [-5] * 3
    assert args.temperature.dtype == torch.float32 and args.logprobs == 10
    assert reference.check_sampling_args(3, 10, "cpu", 1e-50).temperature.tolist() == [0.0] * 3
    # a capacity: what a spec's top-k records can hold
    reference.check_sampling_args(2, 100, "cpu", 1.0, top_k=8, max_top_k=8)
    reference.check_sampling_args(2, 100, "cpu", 1.0, top_k=100, max_top_k=8)  # off
    with pytest.raises(ValueError, match="top_k must be at most 8"):
        reference.check_sampling_args(2, 100, "cpu", 1.0, top_k=9, max_top_k=8)
    with pytest.raises(ValueError, match="row 1"):
        reference.check_sampling_args(2, 100, "cpu", 1.0, top_k=torch.tensor([8, 9]), max_top_k=8)
    with pytest.raises(ValueError, match="vocab_size"):
        reference.check_sampling_args(2, 0, "cpu", 1.0)
    meta = torch.zeros(3, device="meta")
    with pytest.raises(ValueError, match="is on meta"):
        reference.check_sampling_args(3, 10, "cpu", meta)
    with pytest.raises(TypeError):
        reference.noise(0, 0, torch.arange(4, dtype=torch.int32))
    with pytest.raises(ValueError):
        reference.noise(0, 0, torch.tensor([-1]))
    with pytest.raises(ValueError):
        reference.noise(0, 0, -1)
    with pytest.raises(ValueError, match="2 and 3 rows"):
        reference.noise(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 4)
    with pytest.raises(TypeError):
        reference.noise(torch.zeros(2, dtype=torch.int32), 0, 4)
