"""The sampler's reference: what kl_sample computes, in plain torch ops.

    from klgen import reference
    out = reference.sample(logits, 0.7, top_p=0.9, seed=seeds, offset=positions,
                           logprobs=5)
    out.tokens, out.logprob, out.rank, out.top_logprobs, out.top_indices

sample() takes the gathered [tokens, vocab] logits and follows vLLM 0.33's
default sampler (vllm/v1/worker/gpu/sample/sampler.py): temperature, then
min-p, then top-k, then top-p, then a Gumbel-max draw; logprobs of the raw
logits. Where vLLM leaves a result to summation order, unstable sorts or
approximate device math, this module fixes one definition (docs/design/
sampling.md), so that a kernel working on the vocabulary's shards can be held
to it token for token. Needs torch, no GPU and none of klgen's libraries.

The noise is counter-based, so a column's draw depends only on (seed, offset,
column), never on the vocabulary's size, the padding or the tensor-parallel
split:

    key      k = (seed mod 2^32, seed >> 32 mod 2^32)
    counter  n = ((c >> 2) mod 2^32, c >> 34, offset mod 2^32, offset >> 32 mod 2^32)
    x        = word (c & 3) of Philox4x32-10(n, k)                   column c
    u        = float32((2 * (x >> 9) + 1) * 2^-24)                  in (0, 1)
    g        = -log(-log(u)), both logs in float32

Philox4x32-10 is Salmon et al.'s (SC'11) as Random123 defines it: ten rounds
with multipliers 0xD2511F53, 0xCD9E8D57 and key increments 0x9E3779B9,
0xBB67AE85, the key bumped before every round but the first. seed and offset
are 64-bit values (an int64 tensor's two's-complement bits). u takes 2^23
equally likely values, the midpoints of a 2^-23 grid: each is a float32
exactly, the smallest 2^-24 and the largest 1 - 2^-24, so g is always finite,
in [-2.8116, 16.6356]. On a CUDA device torch.log is CUDA's logf, so noise()
there gives the bits a kernel computing logf(-logf(u)) gets; on the CPU,
torch's float log may differ from it in the last bit.

vllm_noise() is vLLM 0.33's noise instead (murmur3 of (seed, position,
column), docs/design/sampling.md).
"""

import math
from typing import NamedTuple, Optional

try:
    import torch
except ModuleNotFoundError as e:
    from klgen import _torch_missing
    raise _torch_missing("klgen.reference", e) from None

__all__ = ["Sample", "SamplingArgs", "WEIGHT_SCALE", "bits", "check_sampling_args", "keep_mask",
           "noise", "sample", "top_p_margin", "uniform", "vllm_bits", "vllm_noise",
           "vllm_uniform"]

# Philox4x32's multipliers and Weyl key increments (Random123's philox.h).
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10

_MASK32 = 0xFFFFFFFF
_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _mulhilo(m, a):
    """(hi, lo) 32-bit halves of m * a, m a 32-bit constant, a an int64 tensor of
    32-bit values; in int64 with nothing above 2^49 (a split in 16-bit halves)."""
    p_lo = (a & 0xFFFF) * m
    p_hi = (a >> 16) * m
    t = ((p_hi & 0xFFFF) << 16) + p_lo
    return (p_hi >> 16) + (t >> 32), t & _MASK32


def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0, c1, c2, c3) and key (k0, k1): int64
    tensors of 32-bit values, broadcast together; returns the four words."""
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & _MASK32
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _u64(value, name, device):
    """A seed or offset as an int64 tensor (0-d or 1-d) on device: an int in
    [-2^63, 2^64), taken modulo 2^64, or an int64 tensor."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 tensor, not {value.dtype}")
        if value.dim() > 1:
            raise ValueError(f"{name} must be an int or a 1-D tensor, not of shape "
                             f"{tuple(value.shape)}")
        return value.to(device)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or an int64 tensor, not {type(value).__name__}")
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{name} {value} is outside [-2**63, 2**64)")
    if value >= 1 << 63:
        value -= 1 << 64
    return torch.tensor(value, dtype=torch.int64, device=device)


def _columns(columns, device):
    if isinstance(columns, torch.Tensor):
        if columns.dtype != torch.int64 or columns.dim() != 1:
            raise TypeError(f"columns must be an int or a 1-D int64 tensor, not a {columns.dtype} "
                            f"tensor of shape {tuple(columns.shape)}")
        columns = columns.to(device)
        if columns.numel() and bool((columns < 0).any()):
            raise ValueError("columns must be non-negative")
        return columns
    if isinstance(columns, bool) or not isinstance(columns, int):
        raise TypeError(f"columns must be an int or a 1-D int64 tensor, not "
                        f"{type(columns).__name__}")
    if columns < 0:
        raise ValueError(f"columns must be non-negative, not {columns}")
    return torch.arange(columns, dtype=torch.int64, device=device)


def _noise_args(seed, offset, columns, device):
    """seed and offset as int64 tensors broadcast together, with a trailing
    axis for the columns, and the columns as a 1-D int64 tensor."""
    if device is None:
        device = next((t.device for t in (seed, offset, columns) if isinstance(t, torch.Tensor)),
                      torch.device("cpu"))
    seed, offset = _u64(seed, "seed", device), _u64(offset, "offset", device)
    cols = _columns(columns, device)
    if seed.dim() and offset.dim() and seed.shape != offset.shape:
        raise ValueError(f"seed and offset have {seed.shape[0]} and {offset.shape[0]} rows")
    seed, offset = torch.broadcast_tensors(seed, offset)
    return seed.unsqueeze(-1), offset.unsqueeze(-1), cols


def bits(seed, offset, columns, *, device=None):
    """The noise's 32-bit words x (as int64 in [0, 2^32)) of the given columns.

    seed, offset: ints in [-2^63, 2^64) (taken modulo 2^64) or int64 tensors
    of shape [] or [rows], broadcast together. columns: n for columns 0..n-1,
    or a 1-D int64 tensor of column indices. The result has the broadcast
    shape of seed and offset, then one entry per column. device: where to
    compute (default: the device of the tensor arguments, else the CPU).
    """
    seed, offset, cols = _noise_args(seed, offset, columns, device)
    # One Philox call gives the words of four columns: run it once per block.
    blocks, where = torch.unique(cols >> 2, return_inverse=True)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    words = _philox(blocks & _MASK32, blocks >> 32, offset & _MASK32, (offset >> 32) & _MASK32,
                    k0, k1)
    words = torch.stack(torch.broadcast_tensors(*words), dim=-1)  # [..., blocks, 4]
    flat = words.flatten(-2)
    return flat[..., where * 4 + (cols & 3)]


def uniform(seed, offset, columns, *, device=None):
    """The noise's uniform variates u = (2 * (x >> 9) + 1) * 2^-24 in float32,
    strictly inside (0, 1); arguments as bits()."""
    x = bits(seed, offset, columns, device=device)
    return ((x >> 9) * 2 + 1).to(torch.float32) * (2.0 ** -24)


def noise(seed, offset, columns, *, device=None):
    """The Gumbel noise g = -log(-log(u)), float32 throughout; arguments as bits()."""
    return -torch.log(-torch.log(uniform(seed, offset, columns, device=device)))


# ---- vLLM 0.33's noise (vllm/v1/worker/gpu/sample/gumbel.py, fp32 path) ----

# murmur3's multipliers and round constant (Appleby's MurmurHash3_x86_32).
MURMUR3_C1, MURMUR3_C2, MURMUR3_N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
MURMUR3_F1, MURMUR3_F2 = 0x85EBCA6B, 0xC2B2AE35


def _mul32(m, a):
    """m * a mod 2^32: m a 32-bit constant, a an int64 tensor of 32-bit values."""
    return _mulhilo(m, a)[1]


def _rotl32(v, s):
    return ((v << s) & _MASK32) | (v >> (32 - s))


def _murmur3_mix(h, key):
    key = _mul32(MURMUR3_C2, _rotl32(_mul32(MURMUR3_C1, key), 15))
    return (_rotl32(h ^ key, 13) * 5 + MURMUR3_N) & _MASK32


def _murmur3_fmix(h):
    h = _mul32(MURMUR3_F1, h ^ (h >> 16))
    h = _mul32(MURMUR3_F2, h ^ (h >> 13))
    return h ^ (h >> 16)


def vllm_bits(seed, offset, columns, *, device=None):
    """vLLM's 32-bit hash of (seed, position, column) as int64 in [0, 2^32):
    murmur3 (x86_32, seed 0) of the four words seed mod 2^32, seed >> 32 mod
    2^32, offset mod 2^32 and column, length 16. offset is the row's position
    (only its low 32 bits count, as in vLLM). Arguments as bits()."""
    seed, offset, cols = _noise_args(seed, offset, columns, device)
    h = torch.zeros((), dtype=torch.int64, device=cols.device)
    for word in (seed & _MASK32, (seed >> 32) & _MASK32, offset & _MASK32, cols & _MASK32):
        h = _murmur3_mix(h, word)
    return _murmur3_fmix(h ^ 16)


def vllm_uniform(seed, offset, columns, *, device=None):
    """vLLM's uniform variates: u = float32((x + 1/2) * 2^-32) of x =
    vllm_bits(), computed as vLLM does, (x >> 16) * 2^-16 + ((x & 0xFFFF) +
    1/2) * 2^-32 in float32 (both terms exact, the sum rounded once). u is in
    (0, 1]: the largest x rounds to 1. Arguments as bits()."""
    x = vllm_bits(seed, offset, columns, device=device)
    hi = (x >> 16).to(torch.float32) * 2.0 ** -16
    return hi + ((x & 0xFFFF).to(torch.float32) + 0.5) * 2.0 ** -32


def _vllm_log1p_neg(u):
    """log(1 - u) as vLLM's _log1p_neg_stable computes it in float32: a
    degree-8 series -u * (1 + u * (1/2 + u * (... + u / 8))) below 0.25, each
    coefficient rounded to float32 and each product and sum rounded (no fused
    multiply-add); else log(max(1 - u, 2^-24))."""
    f32 = torch.float32
    poly = torch.full_like(u, 1.0 / 8.0)
    for d in (7, 6, 5, 4, 3, 2, 1):
        poly = torch.tensor(1.0 / d, dtype=f32) + u * poly
    series = -u * poly
    direct = torch.log(torch.clamp(1.0 - u, min=torch.tensor(2.0 ** -24, dtype=f32)))
    return torch.where(u < 0.25, series, direct)


def vllm_noise(seed, offset, columns, *, device=None):
    """vLLM's Gumbel noise g = -log(-log1p(-u)) of u = vllm_uniform(), in
    float32 as _vllm_log1p_neg; arguments as bits()."""
    return -torch.log(-_vllm_log1p_neg(vllm_uniform(seed, offset, columns, device=device)))


class SamplingArgs(NamedTuple):
    """Sampling parameters, checked and made per row, on the logits' device.

    temperature, top_p, min_p: float32 [rows]; top_k: int64 [rows], 0 where
    off; seed, offset: int64 [rows]; logprobs: the int n of top logprobs.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    logprobs: int


def _per_row(value, name, rows, device, dtype, default):
    """value as a [rows] tensor of dtype: a Python number or a [rows] tensor
    (already of a float dtype for a float parameter, an integer one for an
    integer parameter); None is default."""
    if value is None:
        value = default
    if isinstance(value, torch.Tensor):
        if dtype.is_floating_point and not value.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, not {value.dtype}")
        if not dtype.is_floating_point and value.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be an integer tensor, not {value.dtype}")
        if value.dim() != 1 or value.shape[0] != rows:
            raise ValueError(f"{name} has shape {tuple(value.shape)}, expected [{rows}] (one per row)")
        if value.device != device:
            raise ValueError(f"{name} is on {value.device}, expected {device} (the logits')")
        return value.to(dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float) if dtype.is_floating_point
                                                 else int):
        kind = "a number" if dtype.is_floating_point else "an int"
        raise TypeError(f"{name} must be {kind} or a tensor of one per row, not "
                        f"{type(value).__name__}")
    if dtype.is_floating_point:  # through float64: a value beyond float32 becomes inf
        value = float(value) if abs(value) < 2**1024 else math.copysign(math.inf, value)
        return torch.full((rows,), value, dtype=torch.float64, device=device).to(dtype)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{name} {value} is out of range")
    return torch.full((rows,), value, dtype=dtype, device=device)


def _refuse(bad, name, values, rule):
    """Raises ValueError naming the first row where bad holds."""
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name} must be {rule}; row {row} has {values[row].item()!r}")


def check_sampling_args(rows, vocab_size, device, temperature, top_k=None, top_p=None,
                        min_p=None, seed=0, offset=0, logprobs=0, *, max_top_k=None):
    """Checks sampling parameters for rows of vocab_size logits on device and
    returns them as a SamplingArgs, one value per row.

    Each parameter is a Python number (every row) or a 1-D tensor of one per
    row on device. Floats are taken as float32, as vLLM stores them, and
    checked after that rounding: temperature finite and >= 0 (0: greedy),
    top_p in (0, 1] (1: off), min_p in [0, 1] (0: off). top_k: an int >= 0 (0
    or >= vocab_size: off), at most max_top_k where given. seed, offset: ints
    in [-2^63, 2^64), taken modulo 2^64, or int64 tensors. logprobs: an int in
    [0, vocab_size]. None, but for temperature, is the off value. A wrong
    type raises TypeError; a wrong value, shape or device ValueError.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows must be an int >= 0, not {rows!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, not {vocab_size!r}")
    device = torch.device(device)
    f32 = torch.float32
    t = _per_row(temperature, "temperature", rows, device, f32, None)
    _refuse(~torch.isfinite(t) | (t < 0), "temperature", t, "finite and >= 0 (as a float32)")
    p = _per_row(top_p, "top_p", rows, device, f32, 1.0)
    _refuse(~((p > 0) & (p <= 1)), "top_p", p, "in (0, 1] (as a float32)")
    mp = _per_row(min_p, "min_p", rows, device, f32, 0.0)
    _refuse(~((mp >= 0) & (mp <= 1)), "min_p", mp, "in [0, 1] (as a float32)")
    k = _per_row(top_k, "top_k", rows, device, torch.int64, 0)
    _refuse(k < 0, "top_k", k, ">= 0 (0: off)")
    k = torch.where(k >= vocab_size, 0, k)
    if max_top_k is not None:
        _refuse(k > max_top_k, "top_k", k, f"at most {max_top_k} (or 0, or >= the vocabulary)")
    seeds = []
    for name, value in (("seed", seed), ("offset", offset)):
        v = _u64(value, name, device)
        if v.dim() == 1 and v.shape[0] != rows:
            raise ValueError(f"{name} has shape {tuple(v.shape)}, expected [{rows}] (one per row)")
        if isinstance(value, torch.Tensor) and value.device != device:
            raise ValueError(f"{name} is on {value.device}, expected {device} (the logits')")
        seeds.append(v.expand(rows).contiguous())
    if isinstance(logprobs, bool) or not isinstance(logprobs, int):
        raise TypeError(f"logprobs must be an int, not {type(logprobs).__name__}")
    if not 0 <= logprobs <= vocab_size:
        raise ValueError(f"logprobs must be in [0, {vocab_size}] (the vocabulary), not {logprobs}")
    return SamplingArgs(t, k, p, mp, seeds[0], seeds[1], logprobs)


def _check_logits(logits):
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, not {type(logits).__name__}")
    if logits.dtype not in _LOGITS_DTYPES:
        raise TypeError(f"logits has dtype {logits.dtype}, expected float32, float16 or bfloat16")
    if logits.dim() != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected [tokens, vocab >= 1]")


def _log_min_p(min_p):
    """log(min_p) rounded to float32 (through float64: correctly rounded but
    for the rare double rounding); -inf for 0."""
    return torch.log(min_p.to(torch.float64)).to(torch.float32)


# Top-p's weights are integers, W = floor(exp(t - max t) * 2^38) (the exp in
# float32), so that their sums are exact in any order: a kernel that adds
# them by shards gets the reference's sums and the same cut. 2^38 keeps the
# total below 2^62 for any vocabulary klgen takes (2^24 columns) and a
# weight's truncation below 2^-38 of the largest.
WEIGHT_SCALE = 2.0 ** 38


def _ceil_product(p, totals):
    """ceil(p * total) for each row, exactly: p float32 [rows], totals int64 [rows]."""
    out = []
    for pi, ti in zip(p.tolist(), totals.tolist()):
        num, den = float(pi).as_integer_ratio()  # a float32's value, exactly
        out.append(-((-ti * num) // den))
    return torch.tensor(out, dtype=torch.int64, device=totals.device)


def _keep_sorted(values, args):
    """Which entries of rows sorted in the key order (value descending, ties
    to the lowest column) min-p, top-k and top-p keep, every row's maximum
    finite: a boolean tensor of values' shape; and each row's top-p margin,
    the smallest |weights before a column - p * total| / total over the
    columns top-p decides on (float64; inf where top-p is off)."""
    rows, vocab = values.shape
    rank = torch.arange(vocab, device=values.device)
    m = values[:, :1]
    # min-p: a value threshold, m + log(min_p) in float32; ties all stay.
    threshold = m + _log_min_p(args.min_p)[:, None]
    keep = (args.min_p[:, None] == 0) | (values >= threshold)
    # top-k: the first k in the key order, exactly k.
    keep &= (args.top_k[:, None] == 0) | (rank < args.top_k[:, None])
    # top-p: the shortest prefix of what is left whose mass reaches p, in
    # integer weights (WEIGHT_SCALE): a column stays while the weights before
    # it sum to less than p * total, exactly (the sum is an integer, so that
    # is less than ceil(p * total)).
    w = torch.where(keep, (torch.exp(values - m) * WEIGHT_SCALE).to(torch.int64), 0)
    total = torch.cumsum(w, dim=-1)
    before = total - w
    bound = _ceil_product(args.top_p, total[:, -1])[:, None]
    off = (args.top_p == 1)[:, None]
    p = args.top_p.to(torch.float64)[:, None]
    distance = (before.to(torch.float64) - p * total[:, -1:].to(torch.float64)).abs()
    margin = torch.where(keep & ~off, distance, math.inf).amin(dim=-1) / total[:, -1]
    return keep & (off | (before < bound)), margin


def keep_mask(logits, temperature, top_k=None, top_p=None, min_p=None):
    """The columns each row's filters keep: [tokens, vocab] bool.

    The filters of sample() on logits / temperature, in float32 (rows with
    temperature 0 on the logits themselves). A row whose largest value is not
    finite (a NaN, +Inf, or all -Inf) keeps exactly the column sample()
    returns for it. Arguments as sample().
    """
    _check_logits(logits)
    rows, vocab = logits.shape
    args = check_sampling_args(rows, vocab, logits.device, temperature, top_k, top_p, min_p)
    return _keep(_tempered(logits, args), args)[0]


def top_p_margin(logits, temperature, top_k=None, top_p=None, min_p=None):
    """How near each row's top-p decision is to going the other way: the
    smallest |sum of the weights before a column - top_p * total| / total
    over the columns top-p decides on, float64 [tokens]; inf where top-p does
    not run (top_p 1, or a largest value that is not finite). The weights are
    integers, so the order of a sum changes nothing; an exp that differs in
    the last bit (the CPU's against CUDA's expf) moves a weight by up to
    2^-23 of the largest, and can change the kept set only where this is
    about that small. So do sums of floats, as vLLM's float32 cumsum.
    Arguments as sample(); rows with temperature 0 are taken on the logits.
    """
    _check_logits(logits)
    rows, vocab = logits.shape
    args = check_sampling_args(rows, vocab, logits.device, temperature, top_k, top_p, min_p)
    return _keep(_tempered(logits, args), args)[1]


def _tempered(logits, args):
    x = logits.to(torch.float32)
    t = args.temperature
    return x / torch.where(t == 0, 1.0, t)[:, None]


def _special(t):
    """Rows whose largest value is not finite (amax is NaN where a NaN is)."""
    return ~torch.isfinite(t.amax(dim=-1))


def _keep(t, args):
    """(keep mask, top-p margin) of the tempered rows t."""
    special = _special(t)
    regular = torch.where(special[:, None], 0.0, t)
    values, order = torch.sort(regular, dim=-1, descending=True, stable=True)
    kept, margin = _keep_sorted(values, args)
    keep = torch.zeros_like(regular, dtype=torch.bool).scatter_(1, order, kept)
    one = torch.zeros_like(keep).scatter_(1, torch.argmax(t, dim=-1, keepdim=True), True)
    return torch.where(special[:, None], one, keep), torch.where(special, math.inf, margin)


def _key_order(x):
    """The columns of each row in the key order: value descending, ties to
    the lowest column, every NaN above +Inf alike (torch.sort would order
    NaNs by their bits): a stable sort by value with NaN as +Inf, then a
    stable one that moves the NaNs first."""
    nan = torch.isnan(x)
    order = torch.sort(torch.where(nan, math.inf, x), dim=-1, descending=True, stable=True).indices
    first = torch.sort(nan.gather(1, order).to(torch.int8), dim=-1, descending=True,
                       stable=True).indices
    return order.gather(1, first)


class Sample(NamedTuple):
    """sample()'s result, one row per token.

    tokens: int64 [tokens]. logprob: float32 [tokens], the token's log
    probability under the raw logits. rank: int64 [tokens], how many columns
    have a raw logit >= the token's (vLLM's rank). top_logprobs, top_indices:
    float32 and int64 [tokens, n], the n largest raw logits' log
    probabilities and columns (largest first, NaN above all, ties to the
    lowest column).
    """

    tokens: torch.Tensor
    logprob: torch.Tensor
    rank: torch.Tensor
    top_logprobs: torch.Tensor
    top_indices: torch.Tensor


def sample(logits, temperature, top_k=None, top_p=None, min_p=None, *, seed=0, offset=0,
           logprobs=0):
    """Samples a token from each row of the gathered logits [tokens, vocab]
    (float32, float16 or bfloat16) as kl_sample does; returns a Sample.

    Per row, with x the logits cast to float32 and T the temperature:
      T == 0: the token is argmax(x) (ties to the lowest column, NaN largest).
      T > 0:  t = x / T (float32). A row whose largest t is not finite gives
              argmax(t): its first NaN, else its first +Inf, else (all -Inf)
              column 0. Otherwise the filters keep a prefix of the columns in
              the order of t descending, ties to the lowest column:
                min_p > 0: t >= max(t) + log(min_p), the sum in float32;
                top_k > 0: the first top_k of what min_p kept;
                top_p < 1: of what is left, the shortest prefix whose weights
                  sum to at least top_p times their total: a column stays
                  when the sum before it is < top_p * total, exactly, with
                  integer weights floor(exp(t - max(t)) * 2^38), exp in
                  float32 (WEIGHT_SCALE: exact sums in any order);
              and the token is the first column of the largest
              t + noise(seed, offset, column) among those kept (float32).
    logprob, rank and the n = logprobs top entries come from log_softmax(x)
    (computed in float64, rounded to float32): vLLM's default, the raw
    logits' logprobs, untouched by temperature or filters.

    Parameters are numbers or per-row tensors, checked by
    check_sampling_args().
    """
    _check_logits(logits)
    rows, vocab = logits.shape
    args = check_sampling_args(rows, vocab, logits.device, temperature, top_k, top_p, min_p,
                               seed, offset, logprobs)
    x = logits.to(torch.float32)
    t = _tempered(logits, args)
    keep = _keep(t, args)[0]
    g = noise(args.seed, args.offset, vocab, device=logits.device)
    scores = torch.where(keep, t + g, -math.inf)
    drawn = torch.argmax(scores, dim=-1)
    tokens = torch.where((args.temperature == 0) | _special(t), torch.argmax(t, dim=-1), drawn)

    lp = torch.log_softmax(x.to(torch.float64), dim=-1).to(torch.float32)
    chosen = x.gather(1, tokens[:, None])
    rank = (x >= chosen).sum(dim=-1)
    top = _key_order(x)[:, :args.logprobs]
    return Sample(tokens, lp.gather(1, tokens[:, None])[:, 0], rank, lp.gather(1, top), top)
