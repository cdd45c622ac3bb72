"""The sampler's reference: what kl_sample computes, in plain torch ops.

    from klgen import reference
    out = reference.sample(logits, 0.7, top_p=0.9, seed=seeds, offset=positions,
                           logprobs=5)
    out.tokens, out.logprob, out.rank, out.top_logprobs, out.top_indices

sample() takes the gathered [tokens, vocab] logits and follows vLLM 0.33's
default sampler (vllm/v1/worker/gpu/sample/sampler.py): the grammar bitmask
and the logits processors (allowed ids, logit bias, min_tokens, penalties,
banned tokens) where asked for, temperature, then min-p, then top-k, then
top-p, then a Gumbel-max draw; logprobs of the raw or processed logits.
Where vLLM leaves a result to summation order, unstable sorts or
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

noise="vllm" draws vLLM 0.33's noise instead (vllm_noise(): murmur3 of (seed,
position, column), docs/design/sampling.md), so that a seeded request draws
vLLM's token.

verify() verifies speculative decoding's drafts as vLLM 0.33's rejection
sampler does (its "standard" method): the target rows processed as sample()
processes a row, acceptance by min(1, p/q) with vLLM's uniform
(vllm_accept_uniform(): Triton's Philox tl.rand of seed and position), and the
token after the last accepted draft drawn from max(p - q, 0), or from p after a
full acceptance, with vLLM's noise.
"""

import math
from typing import NamedTuple, Optional

try:
    import torch
except ModuleNotFoundError as e:
    from klgen import _torch_missing
    raise _torch_missing("klgen.reference", e) from None

__all__ = ["LOGPROBS_MODES", "NOISES", "Processing", "Sample", "SamplingArgs",
           "WEIGHT_SCALE", "bits", "check_processing", "check_sampling_args", "keep_mask", "noise",
           "process_logits", "sample", "top_p_margin", "uniform", "VERIFY_METHODS", "Verify",
           "verify", "vllm_accept_uniform", "vllm_bits", "vllm_noise", "vllm_uniform"]

# Philox4x32's multipliers and Weyl key increments (Random123's philox.h).
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10

_MASK32 = 0xFFFFFFFF
_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_INDEX_DTYPES = (torch.int32, torch.int64)  # index arrays, as engines keep them


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
    direct = torch.log(torch.clamp(1.0 - u, min=torch.tensor(2.0 ** -24, dtype=f32,
                                                             device=u.device)))
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
    """Raises ValueError naming the first row (and entry, for a 2-D bad) where
    bad holds, and the value of values there."""
    if bool(bad.any()):
        first = bad.nonzero()[0].tolist()
        at = f"row {first[0]}" + "".join(f", entry {i}" for i in first[1:])
        raise ValueError(f"{name} must be {rule}; {at} has {values[tuple(first)].item()!r}")


def _index(rows_index, name, rows, device):
    """state_rows or offset_rows: None, or an int32 or int64 tensor [rows] on
    device, as int64."""
    if rows_index is None:
        return None
    if not isinstance(rows_index, torch.Tensor) or rows_index.dtype not in _INDEX_DTYPES:
        kind = rows_index.dtype if isinstance(rows_index, torch.Tensor) else \
            type(rows_index).__name__
        raise TypeError(f"{name} must be a {torch.int32} or {torch.int64} tensor, not {kind}")
    if rows_index.dim() != 1 or rows_index.shape[0] != rows:
        raise ValueError(f"{name} has shape {tuple(rows_index.shape)}, expected [{rows}] (one "
                         f"per row)")
    if rows_index.device != device:
        raise ValueError(f"{name} is on {rows_index.device}, expected {device} (the logits')")
    return rows_index.to(torch.int64)


def check_sampling_args(rows, vocab_size, device, temperature, top_k=None, top_p=None,
                        min_p=None, seed=0, offset=0, logprobs=0, *, max_top_k=None,
                        state_rows=None, offset_rows=None):
    """Checks sampling parameters for rows of vocab_size logits on device and
    returns them as a SamplingArgs, one value per row.

    Each parameter is a Python number (every row) or a 1-D tensor of one per
    row on device; with state_rows (an int32 or int64 tensor [rows]), a tensor
    temperature, top_k, top_p, min_p or seed is a table of any length (one
    entry per request, as an engine keeps them) that row r reads at
    state_rows[r]; with offset_rows likewise a tensor offset. Only the
    entries read are checked. Floats are taken as float32, as vLLM stores them, and
    checked after that rounding: temperature finite and >= 0 (0: greedy),
    top_p in (0, 1] (1: off), min_p in [0, 1] (0: off). top_k: an int >= 0 (0
    or >= vocab_size: off), at most max_top_k where given. seed, offset: ints
    in [-2^63, 2^64), taken modulo 2^64, or int64 tensors. logprobs: an int in
    [0, vocab_size]. None, but for temperature, is the off
    value. A wrong type raises TypeError; a wrong value, shape or device
    (or an index outside its table) ValueError.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows must be an int >= 0, not {rows!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, not {vocab_size!r}")
    device = torch.device(device)
    states = _Tables(state_rows, rows, device)
    at = _Tables(offset_rows, rows, device, "offset_rows")
    if at.index is not None and not isinstance(offset, torch.Tensor):
        raise ValueError("offset_rows indexes offset: pass offset as a tensor")
    temperature, top_k, top_p, min_p = (states.read(v, n) for v, n in (
        (temperature, "temperature"), (top_k, "top_k"), (top_p, "top_p"), (min_p, "min_p")))
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
    for name, value, tables in (("seed", seed, states), ("offset", offset, at)):
        v = _u64(value, name, device)
        if isinstance(value, torch.Tensor):
            v = tables.read(v, name)
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


# ---- logits processing (vLLM 0.33's grammar bitmask and logits processors) ----

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
NOISES = ("philox", "vllm")


class Processing(NamedTuple):
    """check_processing's result: each processor as dense per-row tensors of
    [rows, vocab] (None: off), what the reference applies column by column.

    bitmask, allowed: bool, the columns left as they are (the rest -inf).
    bias: float32, added where bias_set; stop: bool, -inf where set, and
    restore: bool [rows], rows that take the stop columns back when nothing
    else is left. penalties: float32 [rows] each; prompt: bool, output:
    int32. banned: bool, -inf where set.
    """

    bitmask: Optional[torch.Tensor]
    allowed: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    bias_set: Optional[torch.Tensor]
    stop: Optional[torch.Tensor]
    restore: Optional[torch.Tensor]
    repetition_penalty: Optional[torch.Tensor]
    frequency_penalty: Optional[torch.Tensor]
    presence_penalty: Optional[torch.Tensor]
    prompt: Optional[torch.Tensor]
    output: Optional[torch.Tensor]
    banned: Optional[torch.Tensor]


def _tensor(value, name, dtype, shape, device):
    """value, a tensor of exactly dtype and shape (None in shape: any size
    there) on device; returns it."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a {dtype} tensor, not {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"{name} must be a {dtype} tensor, not {value.dtype}")
    if value.dim() != len(shape) or any(w is not None and w != v
                                        for w, v in zip(shape, value.shape)):
        want = ", ".join("any" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected [{want}]")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device} (the logits')")
    return value


class _Tables:
    """Gathers per-request tables into per-row ones: row r reads row
    index[r] of each table (row r where the index, state_rows or
    offset_rows, is None)."""

    def __init__(self, index, rows, device, name="state_rows"):
        self.rows, self.device, self.name = rows, device, name
        self.index = _index(index, name, rows, device)
        if self.index is not None:
            _refuse(self.index < 0, name, self.index, ">= 0")

    def gather(self, value, name, dtype, width=()):
        table = _tensor(value, name, dtype, (None,) + width, self.device)
        if self.index is None:
            if table.shape[0] != self.rows:
                raise ValueError(f"{name} has {table.shape[0]} rows, expected {self.rows} (one "
                                 f"per row; pass state_rows to index a table of requests)")
            return table
        if self.rows and int(self.index.max()) >= table.shape[0]:
            raise ValueError(f"{self.name} reaches row {int(self.index.max())} of {name}, which "
                             f"has {table.shape[0]}")
        return table[self.index]

    def read(self, value, name):
        """A sampling parameter: a 1-D tensor read at the index (as it is
        without one, or when not a tensor)."""
        if self.index is None or not isinstance(value, torch.Tensor):
            return value
        return self.gather(value, name, value.dtype)

    def penalty(self, value, name):
        """A penalty: a number (every row) or a floating tensor [states]; float32 [rows]."""
        if isinstance(value, torch.Tensor):
            if not value.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating-point tensor, not {value.dtype}")
            return self.gather(value, name, value.dtype).to(torch.float32)
        return _per_row(value, name, self.rows, self.device, torch.float32, None)


def _unpack(words, vocab):
    """Packed int32 words [rows, ceil(vocab / 32)] as bool [rows, vocab]: column
    c is bit c % 32 (least significant first) of word c // 32."""
    c = torch.arange(vocab, device=words.device)
    return ((words.to(torch.int64)[:, c // 32] >> (c % 32)) & 1).bool()


def _packed(value, name, tables, vocab, per_request):
    width = (vocab + 31) // 32
    if per_request:
        words = tables.gather(value, name, torch.int32, (None,))
    else:
        words = _tensor(value, name, torch.int32, (tables.rows, None), tables.device)
    if words.shape[1] != width:
        raise ValueError(f"{name} has {words.shape[1]} words a row, expected ceil({vocab} / 32) "
                         f"= {width}")
    return _unpack(words, vocab)


def _id_list(value, name, tables, vocab, with_values=False):
    """A sparse list per request, (count int32 [states], ids int32 [states,
    width][, values float32 [states, width]]): row r takes entries 0 ..
    count - 1. Returns (listed bool [rows, vocab], values float32 [rows,
    vocab] or None), the value of an id its last entry's."""
    parts = 3 if with_values else 2
    if not isinstance(value, (tuple, list)) or len(value) != parts:
        kind = "(count, ids, values)" if with_values else "(count, ids)"
        raise TypeError(f"{name} must be a tuple {kind} of tensors")
    count = tables.gather(value[0], f"{name} count", torch.int32)
    ids = tables.gather(value[1], f"{name} ids", torch.int32, (None,))
    width = ids.shape[1]
    _refuse((count < 0) | (count > width), f"{name} count", count, f"in [0, {width}] (the "
            f"ids' width)")
    used = torch.arange(width, device=ids.device) < count[:, None]
    _refuse(((ids < 0) | (ids >= vocab)) & used, f"{name} ids", ids,
            f"in [0, {vocab}) (the vocabulary) before count")
    listed = torch.zeros(count.shape[0], vocab, dtype=torch.bool, device=ids.device)
    values = None
    if with_values:
        v = tables.gather(value[2], f"{name} values", torch.float32, (width,))
        _refuse(~torch.isfinite(v) & used, f"{name} values", v, "finite before count")
        values = torch.zeros(listed.shape, dtype=torch.float32, device=ids.device)
    rows = torch.arange(count.shape[0], device=ids.device)
    # entry by entry, so that a repeated id keeps its last entry's value
    for j in range(width):
        r = rows[used[:, j]]
        listed[r, ids[r, j].long()] = True
        if with_values:
            values[r, ids[r, j].long()] = v[r, j]
    return listed, values


def _banned(value, tables, vocab):
    ids = _tensor(value, "banned", torch.int32, (tables.rows, None), tables.device)
    _refuse(ids >= vocab, "banned", ids, f"< {vocab} (the vocabulary; a negative entry is "
            f"padding)")
    out = torch.zeros(tables.rows, vocab + 1, dtype=torch.bool, device=ids.device)
    out.scatter_(1, torch.where(ids < 0, vocab, ids).long(), True)
    return out[:, :vocab]


def _min_tokens(value, position, tables, vocab):
    """min_tokens = (min_len, count, stop_ids, restore): the stop columns of
    rows with position + 1 < min_len, and the rows that restore them."""
    if not isinstance(value, (tuple, list)) or len(value) != 4:
        raise TypeError("min_tokens must be a tuple (min_len, count, stop_ids, restore) of "
                        "tensors (restore may be None)")
    min_len = tables.gather(value[0], "min_tokens min_len", torch.int32)
    if position is None:
        raise ValueError("min_tokens needs position (each row's position)")
    pos = _tensor(position, "position", torch.int64, (tables.rows,), tables.device)
    stop = _id_list(value[1:3], "min_tokens stop", tables, vocab)[0]
    stop &= (pos + 1 < min_len)[:, None]
    restore = None
    if value[3] is not None:
        restore = tables.gather(value[3], "min_tokens restore", torch.int32) != 0
    return stop, restore


def check_processing(rows, vocab_size, device, *, state_rows=None, repetition_penalty=None,
                     frequency_penalty=None, presence_penalty=None, prompt_mask=None,
                     output_counts=None, logit_bias=None, allowed_token_ids=None,
                     min_tokens=None, position=None, banned=None, bitmask=None):
    """Checks the logits processing arguments of sample() (layouts in its
    docstring) for rows of vocab_size logits on device; returns a Processing.

    A wrong type raises TypeError; a wrong dtype TypeError; a wrong shape,
    device or value (an id outside the vocabulary, a count beyond its list,
    a bitmask of the wrong width, a penalty outside its domain) ValueError.
    """
    device = torch.device(device)
    tables = _Tables(state_rows, rows, device)
    mask = None if bitmask is None else _packed(bitmask, "bitmask", tables, vocab_size, False)
    allowed = None
    if allowed_token_ids is not None:
        listed = _id_list(allowed_token_ids, "allowed_token_ids", tables, vocab_size)[0]
        allowed = listed | ~listed.any(1, keepdim=True)
    bias = bias_set = None
    if logit_bias is not None:
        bias_set, bias = _id_list(logit_bias, "logit_bias", tables, vocab_size, with_values=True)
    stop = restore = None
    if min_tokens is not None:
        stop, restore = _min_tokens(min_tokens, position, tables, vocab_size)
    elif position is not None:
        raise ValueError("position is used by min_tokens only: pass min_tokens with it")
    penalties = [None if v is None else tables.penalty(v, n) for v, n in (
        (repetition_penalty, "repetition_penalty"), (frequency_penalty, "frequency_penalty"),
        (presence_penalty, "presence_penalty"))]
    rep, freq, pres = penalties
    if rep is not None:
        _refuse(~torch.isfinite(rep) | (rep <= 0), "repetition_penalty", rep,
                "finite and > 0 (as a float32; 1: off)")
    for v, n in ((freq, "frequency_penalty"), (pres, "presence_penalty")):
        if v is not None:
            _refuse(~torch.isfinite(v), n, v, "finite (as a float32; 0: off)")
    prompt = output = None
    if all(v is None for v in penalties):
        if prompt_mask is not None or output_counts is not None:
            raise ValueError("prompt_mask and output_counts are the penalties' tables: pass "
                             "repetition_penalty, frequency_penalty or presence_penalty with them")
    else:
        if output_counts is None:
            raise ValueError("the penalties need output_counts (each request's output token "
                             "counts)")
        output = tables.gather(output_counts, "output_counts", torch.int32, (vocab_size,))
        _refuse(output < 0, "output_counts", output, ">= 0")
        if rep is not None and prompt_mask is None:
            raise ValueError("repetition_penalty needs prompt_mask (each request's prompt "
                             "tokens)")
        if prompt_mask is not None:
            prompt = _packed(prompt_mask, "prompt_mask", tables, vocab_size, True)
    return Processing(mask, allowed, bias, bias_set, stop, restore, rep, freq, pres, prompt,
                      output, None if banned is None else _banned(banned, tables, vocab_size))


def _masked(x, bitmask):
    """The logits in float32 with the grammar bitmask applied: what vLLM's
    runner hands its sampler (and takes raw logprobs of)."""
    x = x.to(torch.float32)
    return x if bitmask is None else torch.where(bitmask, x, -math.inf)


def _process(x, p):
    """vLLM's logits processors on x (float32, the bitmask applied), in its
    order: allowed ids, bias, min_tokens, penalties, banned columns."""
    inf = math.inf
    if p.allowed is not None:
        x = torch.where(p.allowed, x, -inf)
    if p.bias is not None:
        x = torch.where(p.bias_set, x + p.bias, x)
    if p.stop is not None:
        stopped = torch.where(p.stop, -inf, x)
        if p.restore is not None:
            # nothing but -inf left: the stop columns get their finite values back
            dead = p.restore & (stopped == -inf).all(1)
            stopped = torch.where(dead[:, None] & p.stop & torch.isfinite(x), x, stopped)
        x = stopped
    if p.output is not None:
        ones = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
        rep = ones if p.repetition_penalty is None else p.repetition_penalty
        freq = ones * 0 if p.frequency_penalty is None else p.frequency_penalty
        pres = ones * 0 if p.presence_penalty is None else p.presence_penalty
        on = ((rep != 1) | (freq != 0) | (pres != 0))[:, None]
        counts = p.output.to(torch.float32)
        seen = p.output > 0
        if p.prompt is not None:
            # x * (1 / scale) where x > 0, else x * scale: the reciprocal rounded
            scale = torch.where(p.prompt | seen, rep[:, None], 1.0)
            scaled = x * torch.where(x > 0, 1.0 / scale, scale)
            x = torch.where(on & (rep != 1)[:, None], scaled, x)
        y = x - freq[:, None] * counts
        y = y - pres[:, None] * seen.to(torch.float32)
        x = torch.where(on, y, x)
    if p.banned is not None:
        x = torch.where(p.banned, -inf, x)
    return x


def process_logits(logits, **processing):
    """The logits after the grammar bitmask and the processors, before
    temperature: float32 [tokens, vocab], as sample() draws from them.
    processing: sample()'s logits processing keywords."""
    _check_logits(logits)
    p = check_processing(*logits.shape, logits.device, **processing)
    return _process(_masked(logits, p.bitmask), p)


class Sample(NamedTuple):
    """sample()'s result, one row per token.

    tokens: int64 [tokens]. logprob: float32 [tokens], the token's log
    probability (its logit in the logits modes) under the logits
    logprobs_mode names. rank: int64 [tokens], how many columns of those
    logits are >= the token's (vLLM's rank). top_logprobs, top_indices:
    float32 and int64 [tokens, n], the n largest of those logits' log
    probabilities (or logits) and columns (largest first, NaN above all,
    ties to the lowest column).
    """

    tokens: torch.Tensor
    logprob: torch.Tensor
    rank: torch.Tensor
    top_logprobs: torch.Tensor
    top_indices: torch.Tensor


def sample(logits, temperature, top_k=None, top_p=None, min_p=None, *, seed=0, offset=0,
           logprobs=0, logprobs_mode="raw_logprobs", noise="philox", state_rows=None,
           offset_rows=None, **processing):
    """Samples a token from each row of the gathered logits [tokens, vocab]
    (float32, float16 or bfloat16) as kl_sample does; returns a Sample.

    Per row, with x the logits cast to float32, the grammar bitmask and the
    logits processors applied (below), and T the temperature:
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
              t + g(seed, offset, column) among those kept (float32), g
              noise() (noise="philox") or vllm_noise() (noise="vllm", with
              offset the row's position, as vLLM draws).

    logprobs: n top entries, 0 .. vocab (an engine caps n: vLLM's
              max_logprobs, 20 by default). logprob, rank and
    the top entries come from the logits logprobs_mode names (vLLM's):
      raw_logprobs (the default), raw_logits: the logits as the model gave
        them with only the bitmask applied, before the processors,
        temperature and filters;
      processed_logprobs, processed_logits: the logits the token is drawn
        from: t where the filters keep a column, -inf elsewhere (x itself
        for T == 0).
    The logprobs modes take log_softmax of those (in float64, rounded to
    float32), the logits modes the logits themselves.

    Logits processing, every keyword None (off) unless given. Per-request
    tables have one row per request; row r of the logits reads row
    state_rows[r] of each (row r where state_rows is None: then each table
    has exactly tokens rows). Integer tensors are int32 but for state_rows
    (int32 or int64) and position (int64); floats float32. In vLLM's order, before temperature:
      bitmask: int32 [tokens, ceil(vocab / 32)], per row: column c is allowed
        when bit c % 32 (least significant first) of word c // 32 is set;
        the rest become -inf, before the raw logprobs are taken (vLLM's
        runner applies the grammar's bitmask to the logits it samples from).
        A row without a grammar is all ones (-1).
      allowed_token_ids = (count [R], ids [R, A]), per request: where count
        > 0, every column but ids[:count] becomes -inf.
      logit_bias = (count [R], ids [R, B], values [R, B]), per request: x[id]
        += value for each of the first count entries; an id listed more than
        once takes its last entry's value (once).
      min_tokens = (min_len [R], count [R], stop_ids [R, M], restore [R] or
        None), per request, with position: int64 [tokens], each row's
        position (that of the last token the model read; vLLM's pos; by
        default the row's offset, where vLLM passes its positions): where
        count > 0 and position + 1 < min_len, stop_ids[:count] become -inf;
        where restore is non-zero and that leaves every column -inf, those
        stop columns that were finite get their values back.
      repetition_penalty, frequency_penalty, presence_penalty: numbers (every
        request) or float32 [R], with output_counts: int32 [R, vocab], each
        request's count of every column among its output tokens, and
        prompt_mask: int32 [R, ceil(vocab / 32)], bit c as in bitmask set
        when column c is in the request's prompt (needed with
        repetition_penalty). A request with repetition_penalty rp != 1,
        frequency_penalty f != 0 or presence_penalty p != 0: where rp != 1,
        a column in the prompt or the output is scaled, x * (1 / rp) for x >
        0, else x * rp (the reciprocal rounded to float32); then x -= f *
        count, x -= p * (count > 0), each product and difference in float32.
      banned: int32 [tokens, K], per row: the columns to ban this step (the
        engine's bad words), each becoming -inf; a negative entry is
        padding.
    An id (before its list's count, or in banned) outside [0, vocab), a
    count outside [0, its list's width], a non-finite bias, penalty, or
    repetition_penalty <= 0, a bitmask or prompt_mask whose width is not
    ceil(vocab / 32), or a penalty without its tables raises ValueError;
    process_logits() gives x. Parameters are numbers or per-row tensors,
    checked by check_sampling_args() and check_processing(); with
    state_rows, tensor temperature, top_k, top_p, min_p and seed are
    per-request tables as the processing's are, and with offset_rows
    (int32 or int64 [tokens]) a tensor offset is a table row r reads at
    offset_rows[r] (vLLM's positions and logits_indices).
    """
    _check_logits(logits)
    rows, vocab = logits.shape
    args = check_sampling_args(rows, vocab, logits.device, temperature, top_k, top_p, min_p,
                               seed, offset, logprobs, state_rows=state_rows,
                               offset_rows=offset_rows)
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, not "
                         f"{logprobs_mode!r}")
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {', '.join(NOISES)}, not {noise!r}")
    if processing.get("min_tokens") is not None and processing.get("position") is None:
        processing = dict(processing, position=args.offset)  # vLLM passes its positions there
    p = check_processing(rows, vocab, logits.device, state_rows=state_rows, **processing)
    raw = _masked(logits, p.bitmask)
    x = _process(raw, p)
    t = _tempered(x, args)
    keep = _keep(t, args)[0]
    g = _NOISE[noise](args.seed, args.offset, vocab, device=logits.device)
    scores = torch.where(keep, t + g, -math.inf)
    drawn = torch.argmax(scores, dim=-1)
    greedy = args.temperature == 0
    tokens = torch.where(greedy | _special(t), torch.argmax(t, dim=-1), drawn)

    if logprobs_mode.startswith("raw"):
        y = raw
    else:
        y = torch.where(greedy[:, None], x, torch.where(keep, t, -math.inf))
    values = y
    if logprobs_mode.endswith("logprobs"):
        values = torch.log_softmax(y.to(torch.float64), dim=-1).to(torch.float32)
    rank = (y >= y.gather(1, tokens[:, None])).sum(dim=-1)
    top = _key_order(y)[:, :args.logprobs]
    return Sample(tokens, values.gather(1, tokens[:, None])[:, 0], rank, values.gather(1, top), top)


_NOISE = {"philox": noise, "vllm": vllm_noise}


# ---- speculative decoding's verification (vLLM 0.33's rejection sampler) ----

# The methods verify() implements; vLLM's others are named in its refusal.
VERIFY_METHODS = ("standard",)
_VLLM_OTHER_METHODS = ("synthetic", "block", "fly")
# Triton's tl.rand scale, the largest float32 s with (2^31 - 1) * s < 1, and
# vLLM's floor for an acceptance uniform (its _TL_RAND_MIN): the same float32.
_TL_RAND_SCALE = 4.6566127342e-10


def vllm_accept_uniform(seed, offset, *, device=None):
    """vLLM's acceptance uniform for a draft: Triton's tl.rand(seed, offset)
    floored at its smallest positive value, float32, shape of seed and offset
    broadcast (ints or int64 tensors as bits(); offset the position of the
    logits row that judges the draft).

    x = word 0 of Philox4x32-10 with key (seed mod 2^32, seed >> 32 mod 2^32)
    and counter (offset mod 2^32, offset >> 32 mod 2^32, 0, 0); as an int32, x
    becomes ~x where negative, so x in [0, 2^31); u = max(float32(x) * s, s)
    in float32, s = float32(4.6566127342e-10) (about 2^-31)."""
    if device is None:
        device = next((t.device for t in (seed, offset) if isinstance(t, torch.Tensor)),
                      torch.device("cpu"))
    seed, offset = torch.broadcast_tensors(_u64(seed, "seed", device),
                                           _u64(offset, "offset", device))
    zero = torch.zeros_like(offset)
    x = _philox(offset & _MASK32, (offset >> 32) & _MASK32, zero, zero, seed & _MASK32,
                (seed >> 32) & _MASK32)[0]
    x = torch.where(x >= 1 << 31, x ^ _MASK32, x)
    s = torch.tensor(_TL_RAND_SCALE, dtype=torch.float32, device=device)
    return torch.maximum(x.to(torch.float32) * s, s)


class Verify(NamedTuple):
    """verify()'s result. Per request: accepted, int64 [requests], the drafts
    accepted (the request's output is accepted + 1 tokens). Per logits row
    (row cu[r] + i is request r's output position i):
    tokens: int64 [rows], output token i for i <= accepted[r], -1 after.
    logprob: float32 [rows], the token's under the logits logprobs_mode
      names (NaN where the token is -1); rank: int64 [rows], the count of
      columns >= the token's (-1 where the token is -1); top_logprobs,
      top_indices: float32 and int64 [rows, n], as sample()'s, every row.
    margin: float64 [rows], on the rows whose draft the ratio test judged:
      log p(d) - (log u + log q(d)), > 0 accepted; NaN elsewhere (greedy
      rows, rows past the first rejection, placeholders, bonus rows).
    gap: float64 [requests], the draw's best score less its second best
      (inf where the row is greedy or has one finite score): how near the
      drawn token is to another under rounding."""

    accepted: torch.Tensor
    tokens: torch.Tensor
    logprob: torch.Tensor
    rank: torch.Tensor
    top_logprobs: torch.Tensor
    top_indices: torch.Tensor
    margin: torch.Tensor
    gap: torch.Tensor


def _cu_num_logits(cu, rows, device):
    """cu_num_logits checked: an int32 or int64 tensor [requests + 1], 0 first,
    rows last, rising by at least 1 (each request has its bonus row)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"cu_num_logits must be an int32 or int64 tensor, not {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_num_logits must be an int32 or int64 tensor, not {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"cu_num_logits has shape {tuple(cu.shape)}, expected [requests + 1]")
    if cu.device != device:
        raise ValueError(f"cu_num_logits is on {cu.device}, expected {device} (the logits')")
    cu = cu.to(torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != rows:
        raise ValueError(f"cu_num_logits must run from 0 to {rows} (the logits' rows), not from "
                         f"{int(cu[0])} to {int(cu[-1])}")
    _refuse(cu[1:] - cu[:-1] < 1, "cu_num_logits' steps", cu[1:] - cu[:-1],
            ">= 1 (each request has drafts + 1 rows)")
    return cu


def _draft_logits(value, vocab, state, drafts, device):
    """The draft logits of each row's draft, float32 [rows, vocab] (rows
    without a draft: 0), from value [states, D, vocab] at (state, draft)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"draft_logits must be a tensor, not {type(value).__name__}")
    if value.dtype not in _LOGITS_DTYPES:
        raise TypeError(f"draft_logits has dtype {value.dtype}, expected float32, float16 or "
                        f"bfloat16")
    if value.dim() != 3 or value.shape[2] != vocab:
        raise ValueError(f"draft_logits has shape {tuple(value.shape)}, expected [states, drafts, "
                         f"{vocab}] (the target's vocabulary)")
    if value.device != device:
        raise ValueError(f"draft_logits is on {value.device}, expected {device} (the logits')")
    has = drafts >= 0
    if bool(has.any()):
        if int(drafts.max()) >= value.shape[1]:
            raise ValueError(f"draft_logits has room for {value.shape[1]} drafts a request, a "
                             f"request has {int(drafts.max()) + 1}")
        if int(state[has].max()) >= value.shape[0]:
            raise ValueError(f"draft_logits has {value.shape[0]} states, a request reads state "
                             f"{int(state[has].max())}")
    out = torch.zeros(drafts.shape[0], vocab, dtype=torch.float32, device=device)
    out[has] = value[state[has], drafts[has]].to(torch.float32)
    return out


def _earlier_drafts(drafts, judged, request, cu, vocab):
    """int32 [rows, vocab]: each row's count of every column among its
    request's drafts before it (what vLLM adds to the output counts)."""
    hot = torch.zeros(drafts.shape[0], vocab + 1, dtype=torch.int64, device=drafts.device)
    hot[torch.arange(drafts.shape[0], device=drafts.device),
        torch.where(judged & (drafts >= 0), drafts, vocab)] = 1
    before = torch.cumsum(hot, 0) - hot
    return (before - before[cu[:-1]][request])[:, :vocab].to(torch.int32)


def verify(logits, cu_num_logits, draft_tokens, temperature, top_k=None, top_p=None, min_p=None,
           *, draft_logits=None, seed=0, position, logprobs=0, logprobs_mode="raw_logprobs",
           method="standard", **processing):
    """Verifies a step's drafts as vLLM 0.33's rejection sampler does
    (rejection_sample_method "standard", vllm/v1/worker/gpu/spec_decode/);
    returns a Verify.

    logits: the target's gathered logits [rows, vocab] (float32, float16 or
    bfloat16), each request's drafts + 1 rows in turn: cu_num_logits, int32
    or int64 [requests + 1] (vLLM's), request r has rows cu[r] .. cu[r+1] - 1,
    drafts[r] = cu[r+1] - cu[r] - 1. Row cu[r] + i judges draft i; the last
    row (the bonus row) judges none.
    draft_tokens: int32 or int64 [rows], aligned with the rows: entry cu[r] +
      i is draft i of request r (vLLM's draft_sampled, its input ids, at cu[r]
      + i + 1); -1 a placeholder, never accepted; the bonus rows' entries are
      not read.
    draft_logits: None (n-gram drafts: q is one-hot at the draft), or the
      draft model's logits as vLLM stores them, before temperature: [states,
      D, vocab], request r's draft i at [s, i], s its state row (state_rows
      at the request's rows, which must agree; r where state_rows is None).
    temperature, top_k, top_p, min_p: per request, a number or a tensor of
      [requests], as sample() checks them; seed: per request, an int or an
      int64 [requests]. position: int64 [rows], each row's position (that of
      its input token), for the noise, the acceptance uniform and min_tokens.
    processing: sample()'s logits processing keywords, per row (state_rows
      [rows] as vLLM's expanded_idx_mapping); the penalties' output counts
      of a row also count its request's drafts before it, as vLLM's do.

    Each row's target distribution p is that of sample() on the row: x the
    processed logits, t = x / T where the filters keep a column, -inf
    elsewhere; q = softmax(d / T) of the draft logits d (no processing, no
    filters; the division in float32). Per request, draft by draft until one
    is rejected:
      T == 0: accepted when the draft equals argmax(x) (ties to the lowest
        column); the first rejected draft's row gives argmax(x), and so does
        the bonus row after a full acceptance.
      T > 0: accepted when log p(d) > log u + log q(d) (log q = 0 one-hot),
        the log softmaxes and log u in float64, u = vllm_accept_uniform(seed,
        position of the row); a placeholder stops the test there. The row of
        the first rejection draws its token from the residual max(p - q, 0):
        argmax of r + g, r = log p + log1p(-exp(log q - log p)) where that
        ratio is < 1, else -inf (float64), one-hot q: t with the draft's
        column -inf (float32); g = vllm_noise(seed, position, column). A
        placeholder's row, or the bonus row after a full acceptance, draws
        from p itself: argmax of t + g, as sample(noise="vllm") (float32).
    Logprobs as sample()'s of the output tokens, each row's from its own logits.
    method: "standard" only; vLLM's synthetic, block and fly raise ValueError.
    """
    if method != "standard":
        other = (f"vLLM's {method!r} is not implemented here" if method in _VLLM_OTHER_METHODS
                 else f"unknown method {method!r}")
        raise ValueError(f"{other}: verify() implements rejection_sample_method 'standard' only "
                         f"(not {', '.join(_VLLM_OTHER_METHODS)})")
    _check_logits(logits)
    rows, vocab = logits.shape
    device = logits.device
    cu = _cu_num_logits(cu_num_logits, rows, device)
    requests = cu.shape[0] - 1
    counts = cu[1:] - cu[:-1]
    request = torch.repeat_interleave(torch.arange(requests, device=device), counts)
    step = torch.arange(rows, device=device) - cu[:-1][request]
    judged = step < (counts - 1)[request]

    per_request = check_sampling_args(requests, vocab, device, temperature, top_k, top_p, min_p,
                                      seed, 0, logprobs)
    pos = _tensor(position, "position", torch.int64, (rows,), device)
    args = SamplingArgs(*(v[request] for v in per_request[:5]), pos, per_request.logprobs)
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, not "
                         f"{logprobs_mode!r}")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.int32,
                                                                                torch.int64):
        raise TypeError("draft_tokens must be an int32 or int64 tensor")
    drafts = _tensor(draft_tokens, "draft_tokens", draft_tokens.dtype, (rows,), device).long()
    _refuse(judged & ((drafts < -1) | (drafts >= vocab)), "draft_tokens", drafts,
            f"in [0, {vocab}) or -1 (a placeholder) on the rows that judge a draft")
    drafts = torch.where(judged, drafts, -1)

    p = check_processing(rows, vocab, device,
                         position=pos if processing.get("min_tokens") is not None else None,
                         **processing)
    if p.output is not None:
        p = p._replace(output=p.output + _earlier_drafts(drafts, judged, request, cu, vocab))
    raw = _masked(logits, p.bitmask)
    x = _process(raw, p)
    t = _tempered(x, args)
    keep = _keep(t, args)[0]
    greedy = args.temperature == 0
    processed = torch.where(greedy[:, None], x, torch.where(keep, t, -math.inf))
    target = torch.argmax(x, dim=-1)

    q = None
    if draft_logits is not None:
        state_rows = processing.get("state_rows")
        state = torch.arange(requests, device=device)
        if state_rows is not None:
            state = state_rows[cu[:-1]]
            _refuse(state_rows != state[request], "state_rows", state_rows,
                    "the same on every row of a request")
        d = _draft_logits(draft_logits, vocab, state[request], torch.where(judged, step, -1),
                          device)
        scale = torch.where(greedy, 1.0, args.temperature)  # greedy rows read no q
        q = torch.log_softmax((d / scale[:, None]).double(), dim=-1)

    # the ratio test, on every row; the rows past a rejection are not read
    valid = judged & (drafts >= 0)
    d0 = drafts.clamp(min=0)[:, None]
    log_p = torch.log_softmax(processed.double(), dim=-1)
    log_q = q.gather(1, d0)[:, 0] if q is not None else torch.zeros(rows, dtype=torch.float64,
                                                                   device=device)
    log_u = torch.log(vllm_accept_uniform(args.seed, pos).double())
    margin = log_p.gather(1, d0)[:, 0] - (log_u + log_q)
    accept = valid & torch.where(greedy, drafts == target, margin > 0)
    stop = torch.where(judged & ~accept, step, (counts - 1)[request])
    accepted = torch.full((requests,), rows, dtype=torch.int64, device=device)
    accepted = accepted.scatter_reduce(0, request, stop, "amin")
    margin = torch.where(valid & ~greedy & (step <= accepted[request]), margin, math.nan)

    # the token at each request's first rejection, or its bonus row
    at = cu[:-1] + accepted
    g = vllm_noise(args.seed[at], pos[at], vocab, device=device)
    from_p = (drafts[at] < 0)[:, None]
    score = processed[at] + g
    if q is not None:
        lp, lq = log_p[at], q[at]
        ratio = torch.exp(lq - lp)
        residual = torch.where(ratio < 1, lp + torch.log1p(-ratio), -math.inf)
        score = torch.where(from_p, score.double(), residual + g.double())
    else:
        score = torch.where(from_p | (torch.arange(vocab, device=device) != drafts[at][:, None]),
                            score, -math.inf)
    drawn = torch.where(_special(t[at]), torch.argmax(t[at], dim=-1),
                        torch.argmax(score, dim=-1))
    best = score.double().topk(min(2, vocab), dim=-1).values
    gap = best[:, 0] - best[:, -1] if vocab > 1 else torch.full_like(best[:, 0], math.inf)
    gap = torch.where(greedy[at] | ~torch.isfinite(gap) | _special(t[at]), math.inf, gap)
    tokens = torch.where(step < accepted[request], drafts, -1)
    tokens[at] = torch.where(greedy[at], target[at], drawn)

    y = raw if logprobs_mode.startswith("raw") else processed
    values = y
    if logprobs_mode.endswith("logprobs"):
        values = torch.log_softmax(y.to(torch.float64), dim=-1).to(torch.float32)
    has = tokens >= 0
    t0 = tokens.clamp(min=0)[:, None]
    logprob = torch.where(has, values.gather(1, t0)[:, 0], math.nan)
    rank = torch.where(has, (y >= y.gather(1, t0)).sum(dim=-1), -1)
    top = _key_order(y)[:, :args.logprobs]
    return Verify(accepted, tokens, logprob, rank, values.gather(1, top), top, margin, gap)
