"""klgen.reference's logits processing, logprobs and vLLM noise against vLLM
0.33.0's own code (docs/design/sampling.md): the v2 sampler's Triton kernels
(vllm/v1/worker/gpu/sample/ and the runner's grammar bitmask) run on the CPU
under Triton's interpreter, called in the order vLLM's Sampler calls them, on
vLLM's own state tensors (built by its bincount kernel from random
histories), which the reference takes as they are.

Needs the vLLM venv of .ci/engines.sh, and Triton's interpreter on before
vLLM is imported: TRITON_INTERPRET=1, and CUDA_VISIBLE_DEVICES set empty so
that vLLM takes Triton on a machine without a GPU (engines.sh runs this file
in a pytest process of its own, so set). Skipped without TRITON_INTERPRET=1;
with it, an error where vLLM still finds no Triton.
"""

import math
import os
import types

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("vllm")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES= before vLLM is imported "
                "(.ci/engines.sh runs it so)", allow_module_level=True)

from vllm.triton_utils import HAS_TRITON  # noqa: E402

if not HAS_TRITON:  # asked for the interpreter, so a failure, not a skip
    raise RuntimeError("vLLM found no Triton: set CUDA_VISIBLE_DEVICES= (empty) on a machine "
                       "without a GPU")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import TensorHandle  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch  # noqa: E402
from vllm.v1.worker.gpu import structured_outputs  # noqa: E402
from vllm.v1.worker.gpu.sample import gumbel  # noqa: E402
from vllm.v1.worker.gpu.sample.bad_words import apply_bad_words  # noqa: E402
from vllm.v1.worker.gpu.sample.logit_bias import apply_logit_bias  # noqa: E402
from vllm.v1.worker.gpu.sample.logprob import compute_topk_scores  # noqa: E402
from vllm.v1.worker.gpu.sample.min_p import apply_min_p  # noqa: E402
from vllm.v1.worker.gpu.sample.penalties import apply_penalties, bincount  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample  # noqa: E402

from klgen import reference  # noqa: E402

I32, I64, F32 = torch.int32, torch.int64, torch.float32
INF = math.inf
# vLLM's capacities (logit_bias.py, envs.py)
ALLOWED_W, BIAS_W, STOP_W, BAD_W, BAD_N = 1024, 1024, 128, 1024, 128


def words(vocab):
    return (vocab + 31) // 32


def randint(gen, lo, hi, shape, dtype=I32):
    return torch.randint(lo, hi, shape, generator=gen, dtype=I64).to(dtype)


def make_state(gen, states, vocab, *, all_on=False):
    """vLLM's per-request sampler state for random requests: its tensors,
    named as vLLM names them, and the histories they were built from."""
    s = {}
    prompt_len = randint(gen, 1, 40, (states,))
    out_len = randint(gen, 0, 30, (states,))
    # tokens from a small range, so that they repeat
    hist = randint(gen, 0, vocab, (states, 80))
    small = randint(gen, 0, min(vocab, 12), (states, 80))
    hist = torch.where(torch.rand(states, 80, generator=gen) < 0.5, small, hist)
    s.update(prompt_len=prompt_len, out_len=out_len, total_len=prompt_len + out_len,
             all_token_ids=hist.contiguous())
    s["prompt_bin_mask"] = torch.zeros(states, words(vocab), dtype=I32)
    s["output_bin_counts"] = torch.zeros(states, vocab, dtype=I32)
    bincount(torch.arange(states, dtype=I64), s["all_token_ids"], prompt_len, s["total_len"],
             s["prompt_bin_mask"], s["output_bin_counts"], int(s["total_len"].max()))

    def some(share):
        return torch.ones(states, dtype=torch.bool) if all_on else \
            torch.rand(states, generator=gen) < share

    on = some(0.6)
    s["repetition_penalty"] = torch.where(on & some(0.5), torch.rand(states, generator=gen) * 1.9
                                          + 0.05, 1.0).to(F32)
    s["frequency_penalty"] = torch.where(on & some(0.5), torch.rand(states, generator=gen) * 4
                                         - 2, 0.0).to(F32)
    s["presence_penalty"] = torch.where(on & some(0.5), torch.rand(states, generator=gen) * 4
                                        - 2, 0.0).to(F32)

    def id_table(count, width):
        ids = randint(gen, 0, vocab, (states, width))
        dup = randint(gen, 0, min(vocab, 8), (states, width))  # repeated ids
        ids = torch.where(torch.rand(states, width, generator=gen) < 0.2, dup, ids)
        # past count: stale entries, some outside the vocabulary, never read
        stale = torch.arange(width) >= count[:, None].long()
        return torch.where(stale, randint(gen, -5, vocab + 5, (states, width)), ids).contiguous()

    s["num_allowed_token_ids"] = torch.where(some(0.3), randint(gen, 1, 60, (states,)), 0)
    s["allowed_token_ids"] = id_table(s["num_allowed_token_ids"], ALLOWED_W)
    s["num_logit_bias"] = torch.where(some(0.6), randint(gen, 0, 301, (states,)), 0)
    s["logit_bias_token_ids"] = id_table(s["num_logit_bias"], BIAS_W)
    bias = (torch.rand(states, BIAS_W, generator=gen) * 200 - 100).to(F32)
    s["logit_bias"] = torch.where(torch.rand(states, BIAS_W, generator=gen) < 0.05,
                                  torch.tensor(100.0), bias).contiguous()
    s["min_lens"] = prompt_len + randint(gen, 0, 50, (states,))
    s["num_stop_token_ids"] = torch.where(some(0.6), randint(gen, 1, 6, (states,)), 0)
    s["stop_token_ids"] = id_table(s["num_stop_token_ids"], STOP_W)
    s["restore_when_all_masked"] = some(0.5).to(I32)
    # bad words: 0-4 per request of 1-3 tokens, half of them ending the output
    s["num_bad_words"] = torch.zeros(states, dtype=I32)
    s["bad_word_token_ids"] = torch.zeros(states, BAD_W, dtype=I32)
    s["bad_word_offsets"] = torch.zeros(states, BAD_N + 1, dtype=I32)
    for r in range(states):
        flat, offsets = [], [0]
        for _ in range(int(randint(gen, 0, 5, ()))):
            n = int(randint(gen, 1, 4, ()))
            out = hist[r, int(prompt_len[r]):int(s["total_len"][r])].tolist()
            prefix = out[len(out) - n + 1:] if n > 1 else []
            if len(prefix) != n - 1 or bool(torch.rand((), generator=gen) < 0.5):
                prefix = randint(gen, 0, vocab, (n - 1,)).tolist()
            flat += prefix + [int(randint(gen, 0, vocab, ()))]
            offsets.append(len(flat))
        s["num_bad_words"][r] = len(offsets) - 1
        s["bad_word_token_ids"][r, :len(flat)] = torch.tensor(flat, dtype=I32)
        s["bad_word_offsets"][r, :len(offsets)] = torch.tensor(offsets, dtype=I32)
    return s


def make_batch(gen, rows, states, vocab, *, greedy=0.15, filters=True, all_on=False):
    """A step: rows of requests (idx, vLLM's expanded_idx_mapping), their
    positions, sampling parameters and grammar bitmask rows."""
    s = make_state(gen, states, vocab, all_on=all_on)
    idx = torch.randperm(states, generator=gen)[:rows].to(I64)
    b = dict(state=s, idx=idx, vocab=vocab)
    b["pos"] = (s["total_len"][idx] - 1).to(I64)
    temp = (torch.rand(states, generator=gen) * 1.9 + 0.1).to(F32)
    temp = torch.where(torch.rand(states, generator=gen) < 0.2, 1.0, temp)
    b["temperature"] = torch.where(torch.rand(states, generator=gen) < greedy, 0.0, temp)
    sampled = b["temperature"] != 0
    use = (torch.rand(states, 3, generator=gen) < 0.3) & sampled[:, None] & filters
    b["top_k"] = torch.where(use[:, 0], randint(gen, 1, vocab + 1, (states,)), vocab)
    b["top_p"] = torch.where(use[:, 1], torch.rand(states, generator=gen) * 0.9 + 0.05,
                             1.0).to(F32)
    b["min_p"] = torch.where(use[:, 2], torch.rand(states, generator=gen) * 0.3, 0.0).to(F32)
    b["seeds"] = torch.randint(-2**63, 2**63 - 1, (states,), generator=gen, dtype=I64)
    kind = torch.rand(rows, generator=gen)
    mask = torch.randint(-2**31, 2**31, (rows, words(vocab)), generator=gen, dtype=I64).to(I32)
    sparse = mask & randint(gen, -2**31, 2**31, (rows, words(vocab))) & \
        randint(gen, -2**31, 2**31, (rows, words(vocab)))
    mask = torch.where((kind < 0.4)[:, None], -1, mask)
    mask = torch.where(((kind >= 0.4) & (kind < 0.5))[:, None], 0, mask)
    b["bitmask"] = torch.where((kind >= 0.8)[:, None], sparse, mask).contiguous()
    b["banned"] = vllm_banned(b)
    return b


def drafts_in(b, rows):
    """vLLM's input ids and local positions of the rows: the step's drafts
    where b has them, else none (zeros)."""
    zeros = torch.zeros(rows, dtype=I32)
    return b.get("input_ids", zeros), b.get("local_pos", zeros)


def vllm_bad_words(logits, b):
    s = b["state"]
    apply_bad_words(logits, b["idx"], s["bad_word_token_ids"], s["bad_word_offsets"],
                    s["num_bad_words"], s["all_token_ids"], s["prompt_len"], s["total_len"],
                    *drafts_in(b, logits.shape[0]), max(int(s["num_bad_words"].max()), 1))


def vllm_banned(b):
    """What vLLM's bad-words kernel bans in each row, as reference's banned:
    the columns it sets to -inf, -1 padding."""
    probe = torch.zeros(b["idx"].shape[0], b["vocab"])
    vllm_bad_words(probe, b)
    hit = probe == -INF
    width = max(int(hit.sum(1).max()), 1)
    out = torch.full((probe.shape[0], width + 1), -1, dtype=I32)
    for r in range(probe.shape[0]):
        cols = hit[r].nonzero()[:, 0]
        out[r, :cols.numel()] = cols.to(I32)
    return out


def vllm_bitmask(logits, bitmask):
    """The runner's grammar bitmask kernel, one mask row per logits row, in place."""
    rows, vocab = logits.shape
    block = structured_outputs.GRAMMAR_BITMASK_BLOCK_SIZE
    structured_outputs._apply_grammar_bitmask_kernel[(rows, triton.cdiv(vocab, block))](
        logits, logits.stride(0), torch.arange(rows, dtype=I32),
        torch.arange(rows + 1, dtype=I32), bitmask, bitmask.stride(0), vocab, MASK_STRIDE=1,
        BLOCK_SIZE=block)


def vllm_processors(logits, b, which=("bias", "penalties", "bad_words")):
    """vLLM's Sampler.apply_sampling_params up to temperature: the float32
    copy and the logits processors, in the Sampler's list order."""
    s, idx, pos = b["state"], b["idx"], b["pos"]
    x = torch.empty_like(logits, dtype=F32).copy_(logits)
    if "bias" in which:
        apply_logit_bias(x, idx, pos, s["num_allowed_token_ids"], s["allowed_token_ids"],
                         s["num_logit_bias"], s["logit_bias_token_ids"], s["logit_bias"],
                         s["min_lens"], s["num_stop_token_ids"], s["restore_when_all_masked"],
                         s["stop_token_ids"],
                         bool(s["restore_when_all_masked"][idx].any()))
    if "penalties" in which:
        apply_penalties(x, idx, *drafts_in(b, x.shape[0]), s["repetition_penalty"],
                        s["frequency_penalty"], s["presence_penalty"], s["prompt_bin_mask"],
                        s["output_bin_counts"])
    if "bad_words" in which:
        vllm_bad_words(x, b)
    return x


def vllm_filters(x, b):
    """Sampler.apply_sampling_params after the processors: temperature,
    min-p, top-k and top-p on x (in place where vLLM's are)."""
    idx = b["idx"]
    gumbel.apply_temperature(x, idx, b["temperature"])
    apply_min_p(x, idx, b["min_p"])
    k, p = b["top_k"][idx], b["top_p"][idx]
    k = k if bool((k != b["vocab"]).any()) else None
    p = p if bool((p != 1).any()) else None
    if k is not None or p is not None:
        # vLLM's PyTorch top-k/top-p, what it runs on a CPU: its Triton one
        # does not run under the interpreter
        x = apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True)
    return x


def vllm_sample(logits, b, *, logprobs=0, mode="raw_logprobs"):
    """vLLM's Sampler.__call__ for one logit a request, from its parts:
    (tokens, LogprobsTensors or None)."""
    raw = logits.clone()
    vllm_bitmask(raw, b["bitmask"])
    x = vllm_filters(vllm_processors(raw, b), b)
    tokens = gumbel.gumbel_sample(x, b["idx"], b["temperature"], b["seeds"], b["pos"],
                                  apply_temperature=False, is_drafting=False)
    out = None
    if logprobs is not None:
        source = raw if mode.startswith("raw") else x
        out = compute_topk_scores(source, logprobs, tokens, logits_mode=mode.endswith("logits"))
    return tokens, out


def processing(b, which=("bitmask", "bias", "penalties", "bad_words")):
    """reference's keywords for the processors in which, from vLLM's state."""
    s, kw = b["state"], dict(state_rows=b["idx"])
    if "bitmask" in which:
        kw["bitmask"] = b["bitmask"]
    if "bias" in which:
        kw.update(allowed_token_ids=(s["num_allowed_token_ids"], s["allowed_token_ids"]),
                  logit_bias=(s["num_logit_bias"], s["logit_bias_token_ids"], s["logit_bias"]),
                  min_tokens=(s["min_lens"], s["num_stop_token_ids"], s["stop_token_ids"],
                              s["restore_when_all_masked"]),
                  position=b["pos"])
    if "penalties" in which:
        kw.update(repetition_penalty=s["repetition_penalty"],
                  frequency_penalty=s["frequency_penalty"],
                  presence_penalty=s["presence_penalty"], prompt_mask=s["prompt_bin_mask"],
                  output_counts=s["output_bin_counts"])
    if "bad_words" in which:
        kw["banned"] = b["banned"]
    return kw


def sampling(b):
    """Each row's sampling parameters, gathered from vLLM's state."""
    idx = b["idx"]
    return dict(temperature=b["temperature"][idx], top_k=b["top_k"][idx].long(),
                top_p=b["top_p"][idx], min_p=b["min_p"][idx], seed=b["seeds"][idx],
                offset=b["pos"])


def tables(b):
    """The same as vLLM keeps them, per-request tables (int32 top_k, its
    vocabulary for off) that the rows read through processing(b)'s
    state_rows, as kl_sample reads them."""
    return dict(temperature=b["temperature"], top_k=b["top_k"], top_p=b["top_p"],
                min_p=b["min_p"], seed=b["seeds"], offset=b["pos"])


def same_bits(a, b):
    """Equal as float32 values, NaN to NaN (0 == -0)."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


# ---- the state layouts: vLLM's own, taken as they are ----

def test_penalty_state_is_vllms_bincount():
    gen = torch.Generator().manual_seed(1)
    vocab = 77
    s = make_state(gen, 30, vocab)
    for r in range(30):
        prompt = s["all_token_ids"][r, :int(s["prompt_len"][r])].tolist()
        out = s["all_token_ids"][r, int(s["prompt_len"][r]):int(s["total_len"][r])].tolist()
        in_prompt = reference._unpack(s["prompt_bin_mask"][r:r + 1], vocab)[0]
        assert in_prompt.nonzero()[:, 0].tolist() == sorted(set(prompt))
        assert s["output_bin_counts"][r].tolist() == [out.count(c) for c in range(vocab)]


# ---- each processor, and all of them, against vLLM's kernels ----

@pytest.mark.parametrize("which", [("bias",), ("penalties",), ("bad_words",),
                                   ("bias", "penalties", "bad_words")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_processors_match_vllm(which, dtype):
    gen = torch.Generator().manual_seed(hash((which, str(dtype))) % 2**31)
    for vocab, rows, states, all_on in ((50, 40, 48, False), (1000, 24, 30, False),
                                        (333, 16, 16, True)):
        b = make_batch(gen, rows, states, vocab, all_on=all_on)
        logits = (torch.randn(rows, vocab, generator=gen) * 4).to(dtype)
        logits[:, :3] = torch.tensor([0.0, -0.0, 1e-3]).to(dtype)
        want = vllm_processors(logits, b, which)
        got = reference.process_logits(logits, **processing(b, which))
        bad = ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
        assert not bad.any(), (which, vocab, bad.nonzero()[:5].tolist())


def test_min_tokens_restore_matches_vllm():
    """Rows whose only allowed columns are stop tokens: masked, they leave
    nothing, and a request with a grammar (restore) takes them back."""
    gen = torch.Generator().manual_seed(2)
    vocab, rows = 64, 24
    b = make_batch(gen, rows, rows, vocab)
    s, idx = b["state"], b["idx"]
    s["num_stop_token_ids"][idx] = 3
    s["stop_token_ids"][idx, :3] = randint(gen, 0, vocab, (rows, 3))
    s["num_allowed_token_ids"][idx] = 3
    s["allowed_token_ids"][idx, :3] = s["stop_token_ids"][idx, :3]
    s["min_lens"][idx] = (b["pos"] + 1 + (torch.arange(rows) % 3 != 0)).to(I32)
    s["num_logit_bias"][idx[::4]] = 0
    logits = torch.randn(rows, vocab, generator=gen)
    want = vllm_processors(logits, b, ("bias",))
    got = reference.process_logits(logits, **processing(b, ("bias",)))
    assert same_bits(got, want)
    restored = torch.isfinite(got).any(1) & (s["min_lens"][idx] > b["pos"] + 1)
    assert 0 < int(restored.sum()) < rows  # the case ran, and not everywhere


def test_bitmask_matches_vllm():
    gen = torch.Generator().manual_seed(3)
    for vocab in (1, 31, 32, 33, 100, 8300):
        rows = 12
        b = make_batch(gen, rows, rows, vocab)
        # bits past the vocabulary set: vLLM never reads them
        b["bitmask"][1] = -1
        b["bitmask"][2] = 0
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(rows, vocab, generator=gen).to(dtype)
            want = logits.clone()
            vllm_bitmask(want, b["bitmask"])
            got = reference.process_logits(logits, bitmask=b["bitmask"])
            assert torch.equal(got, want.float()), vocab
        assert torch.isfinite(got[1]).all() and (got[2] == -INF).all()


# ---- logprobs and ranks ----

def assert_scores_match(got, want, mode, what):
    """Logprobs (or logits) equal: logits bit for bit, logprobs to float32
    rounding of vLLM's float32 sums; NaN and infinities alike."""
    if mode.endswith("logits"):
        assert same_bits(got, want), (mode, what)
    else:
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)) and same_bits(got[~finite], want[~finite])
        assert torch.allclose(got[finite], want[finite], rtol=1e-5, atol=2e-6), (mode, what)


@pytest.mark.parametrize("mode", reference.LOGPROBS_MODES)
def test_logprobs_match_vllm(mode):
    """vLLM's compute_topk_scores on the logits the mode names (the raw ones
    with the bitmask, or the processed ones) at the reference's tokens: the
    same values (logits exactly, logprobs to float32 rounding of vLLM's
    float32 sums), ranks and top-n values."""
    gen = torch.Generator().manual_seed(4 + reference.LOGPROBS_MODES.index(mode))
    for vocab, rows, dtype in ((40, 40, torch.float32), (3000, 16, torch.bfloat16),
                               (21, 20, torch.float32)):
        n = min(vocab, int(randint(gen, 0, 21, ())))
        # top-k and top-p: vLLM's own kernels keep ties and cut by float sums
        b = make_batch(gen, rows, rows, vocab, filters=False)
        # min-p, but where greedy (vLLM's SamplingParams turn it off there)
        b["min_p"] = torch.where((torch.rand(rows, generator=gen) < 0.3) & (b["temperature"] != 0),
                                 0.1, 0.0).to(F32)
        logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
        ours = reference.sample(logits, **tables(b), logprobs=n, logprobs_mode=mode,
                                noise="vllm", **processing(b))
        raw = logits.clone()
        vllm_bitmask(raw, b["bitmask"])
        source = raw
        if mode.startswith("processed"):
            source = vllm_processors(raw, b)
            gumbel.apply_temperature(source, b["idx"], b["temperature"])
            apply_min_p(source, b["idx"], b["min_p"])
        # in float32: the interpreter compares bfloat16 values by their bits
        source = source.float()
        theirs = compute_topk_scores(source, n, ours.tokens, logits_mode=mode.endswith("logits"))
        # a token of logit -inf (a row the bitmask masks whole): vLLM's rank
        # kernel counts its 8192-column block's padding too, the reference
        # the columns only
        dead = source.float().gather(1, ours.tokens[:, None])[:, 0] == -INF
        padded = triton.cdiv(vocab, 8192) * 8192
        assert (theirs.selected_token_ranks[dead] == padded).all()
        assert (ours.rank[dead] == vocab).all()
        assert torch.equal(theirs.selected_token_ranks[~dead], ours.rank[~dead]), (mode, vocab)
        assert torch.equal(theirs.logprob_token_ids[:, 0], ours.tokens)
        got = torch.cat([ours.logprob[:, None], ours.top_logprobs], 1)
        assert_scores_match(got, theirs.logprobs, mode, vocab)
        # top-n: the same logits, in the same order (torch.topk orders equals its own way)
        y = source.float()
        assert torch.equal(y.gather(1, ours.top_indices),
                           y.gather(1, theirs.logprob_token_ids[:, 1:]))


# ---- vLLM's noise ----

@triton.jit
def _noise_kernel(u_ptr, log1p_ptr, g_ptr, seed_ptr, pos_ptr, vocab, BLOCK: tl.constexpr):
    """vLLM's uniform, log1p(-u) and noise (gumbel_noised_argmax over a
    [1, BLOCK] block: one column a reduction) for a row and block."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    u = gumbel.murmur3_uniform32(seed, pos, cols)
    tl.store(u_ptr + row * vocab + cols, u, mask=inside)
    tl.store(log1p_ptr + row * vocab + cols, gumbel._log1p_neg_stable(u), mask=inside)
    g, _ = gumbel.gumbel_noised_argmax(tl.zeros((1, BLOCK), tl.float32), cols[None, :],
                                       inside[None, :], seed, pos, 1.0, IS_DRAFTING=False,
                                       USE_FP64=False, APPLY_TEMPERATURE=False)
    tl.store(g_ptr + row * vocab + cols, g, mask=inside)


def vllm_noise_parts(seed, pos, vocab):
    rows = seed.shape[0]
    u, log1p, g = (torch.empty(rows, vocab) for _ in range(3))
    _noise_kernel[(rows, triton.cdiv(vocab, 1024))](u, log1p, g, seed, pos, vocab, BLOCK=1024)
    return u, log1p, g


def test_vllm_uniforms_are_vllms_bit_for_bit():
    gen = torch.Generator().manual_seed(6)
    rows, vocab = 96, 5000
    seed = torch.randint(-2**63, 2**63 - 1, (rows,), generator=gen, dtype=I64)
    pos = torch.randint(0, 2**40, (rows,), generator=gen, dtype=I64)
    seed[:4] = torch.tensor([0, -1, 2**63 - 1, -2**63])
    pos[:4] = torch.tensor([0, 2**32 - 1, 2**32, 2**62])
    u, log1p, g = vllm_noise_parts(seed, pos, vocab)
    ours = reference.vllm_uniform(seed, pos, vocab)
    assert torch.equal(ours.view(I32), u.view(I32))
    # log1p(-u): the series (no log) bit for bit; else a float32 log, torch's
    # against numpy's under the interpreter (its SIMD log is within 4 ulp)
    series = u < 0.25
    l_ours = reference._vllm_log1p_neg(ours)
    assert torch.equal(l_ours[series].view(I32), log1p[series].view(I32))
    assert int(series.sum()) > 0 and int((~series).sum()) > 0
    assert ((l_ours.view(I32) - log1p.view(I32)).abs() <= 4).all()
    # g: two logs (torch's, and numpy's under the interpreter) apart
    g_ours = reference.vllm_noise(seed, pos, vocab)
    assert ((g_ours - g).abs() <= 2**-20 * g.abs().clamp(min=1)).all()
    assert torch.isfinite(g).all()


@triton.jit
def _accept_uniform_kernel(u_ptr, seed_ptr, pos_ptr):
    """vLLM's acceptance uniform of a request and position, as its
    rejection kernel draws it."""
    i = tl.program_id(0)
    u = gumbel.tl_rand32(tl.load(seed_ptr + i), tl.load(pos_ptr + i), includes_zero=False)
    tl.store(u_ptr + i, u)


def test_accept_uniforms_are_vllms_bit_for_bit():
    gen = torch.Generator().manual_seed(10)
    n = 3000
    seed = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen, dtype=I64)
    pos = torch.randint(0, 2**40, (n,), generator=gen, dtype=I64)
    seed[:4] = torch.tensor([0, -1, 2**63 - 1, -2**63])
    pos[:4] = torch.tensor([0, 2**32 - 1, 2**32, 2**62])
    u = torch.empty(n)
    _accept_uniform_kernel[(n,)](u, seed, pos)
    assert torch.equal(reference.vllm_accept_uniform(seed, pos).view(I32), u.view(I32))
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_vllm_noise_draws_vllms_tokens():
    """The whole step, vLLM's sampler against reference.sample(noise="vllm"):
    the same token on every row but float near-ties, counted."""
    gen = torch.Generator().manual_seed(7)
    total = near = 0
    for vocab, rows, filters in ((100, 400, True), (4000, 96, True), (50000, 16, False),
                                 (1000, 128, True)):
        b = make_batch(gen, rows, rows * 2, vocab, filters=filters)
        logits = torch.randn(rows, vocab, generator=gen) * 3
        want, _ = vllm_sample(logits, b, logprobs=None)
        args, kw = sampling(b), processing(b)
        got = reference.sample(logits, **tables(b), noise="vllm", **kw).tokens
        tie = near_ties(logits, args, kw)
        total += rows
        near += int(tie.sum())
        assert torch.equal(got[~tie], want[~tie]), (vocab, (got != want).nonzero()[:5].tolist())
    print(f"vLLM noise: {total} rows, {near} near-ties")
    assert near <= total // 50


def near_ties(logits, args, kw):
    """Rows whose token may go either way under float rounding: the two best
    kept scores within 2^-18 of each other (the logs of the noise differ by
    a few ulp), or a filter's cut within rounding (filter_ties)."""
    x = reference.process_logits(logits, **kw)
    t_, k, p, mp = (args[n] for n in ("temperature", "top_k", "top_p", "min_p"))
    t = x / torch.where(t_ == 0, 1.0, t_)[:, None]
    keep = reference.keep_mask(x, torch.where(t_ == 0, 1.0, t_), k, p, mp)
    g = reference.vllm_noise(args["seed"], args["offset"], x.shape[1])
    s = torch.where(keep, t + g, -INF)
    top2 = s.topk(min(2, s.shape[1]), dim=1).values
    best = top2[:, 0]
    gap = top2[:, 1] - best if top2.shape[1] > 1 else torch.full_like(best, -INF)
    tie = (-gap <= 2**-18 * best.abs().clamp(min=1)) & (t_ != 0)
    return tie | filter_ties(x, args)


def filter_ties(x, args):
    """Rows of processed logits x whose filters may keep other columns under
    float rounding: a top-p cut within 1e-5 of p, a min-p threshold within 4
    ulp of a value, or top-k's k-th value tied with the next."""
    t_, k, p, mp = (args[n] for n in ("temperature", "top_k", "top_p", "min_p"))
    t = x / torch.where(t_ == 0, 1.0, t_)[:, None]
    tie = reference.top_p_margin(x, torch.where(t_ == 0, 1.0, t_), k, p, mp) < 1e-5
    m = t.amax(1, keepdim=True)
    threshold = m + torch.log(mp.to(torch.float64)).to(F32)[:, None]
    tie |= ((t - threshold).abs() <= 4 * 2**-23 * threshold.abs()).any(1) & (mp > 0)
    sorted_t = t.sort(1, descending=True).values
    kk = k.clamp(max=x.shape[1] - 1)
    kth = sorted_t.gather(1, (kk - 1).clamp(min=0)[:, None])[:, 0]
    after = sorted_t.gather(1, kk[:, None])[:, 0]
    tie |= (k > 0) & (k < x.shape[1]) & (kth == after) & torch.isfinite(kth)
    return tie


# ---- speculative decoding's verification ----

MAX_DRAFTS = 8
ALL = ("bitmask", "bias", "penalties", "bad_words")


def _log1p(x):
    """libdevice's log1p for Triton's interpreter, which has no extern
    functions: numpy's, in x's dtype."""
    return tl.tensor(TensorHandle(np.log1p(x.handle.data), x.handle.dtype), x.type)


@pytest.fixture(autouse=True)
def interpreter_log1p(monkeypatch):
    """The rejection sampler's residual takes libdevice's log1p."""
    monkeypatch.setattr(rejection_sampler_utils, "tldevice", types.SimpleNamespace(log1p=_log1p))


def make_step(gen, requests, vocab, *, which=ALL, filters=True, all_on=False,
              scales=(0.0, 0.3, 1.0, 4.0)):
    """A speculative step of requests with 0-8 drafts each, as vLLM's runner
    lays it out, and the reference's arguments for it. Each request's drafts
    come from a draft model (the target's logits plus noise of one of scales,
    drafts sampled from its q, or its argmax where greedy), or are the
    target's argmax, or its least likely column; a few are placeholders."""
    b = make_batch(gen, requests, requests * 2, vocab, filters=filters, all_on=all_on)
    s, idx = b["state"], b["idx"]
    n = randint(gen, 0, MAX_DRAFTS + 1, (requests,), I64)
    n[:2] = torch.tensor([0, MAX_DRAFTS])
    cu = torch.cat([torch.zeros(1, dtype=I64), (n + 1).cumsum(0)])
    rows = int(cu[-1])
    req = torch.repeat_interleave(torch.arange(requests), n + 1)
    local = torch.arange(rows) - cu[:-1][req]
    judged = local < n[req]
    pos = (s["total_len"][idx] - 1).to(I64)[req] + local
    logits = torch.randn(rows, vocab, generator=gen) * 3
    scale = torch.tensor(scales)[randint(gen, 0, len(scales), (requests,), I64)]
    model = logits + torch.randn(rows, vocab, generator=gen) * scale[req][:, None]
    temp = b["temperature"][idx][req]
    q = torch.softmax(model / torch.where(temp == 0, 1.0, temp)[:, None], dim=-1)
    drawn = torch.multinomial(q, 1, generator=gen)[:, 0]
    drawn = torch.where(temp == 0, model.argmax(1), drawn)
    kind = randint(gen, 0, 4, (requests,), I64)[req]
    drafts = torch.where(kind == 2, logits.argmax(1), torch.where(kind == 3, logits.argmin(1),
                                                                   drawn))
    drafts = torch.where(torch.rand(rows, generator=gen) < 0.03, -1, drafts)
    drafts = torch.where(judged, drafts, -1)
    # vLLM's draft logits, per request state and draft; the rest not read
    cache = torch.randn(requests * 2, MAX_DRAFTS, vocab, generator=gen) * 5
    cache[idx[req][judged], local[judged]] = model[judged]
    # vLLM's input ids: the last committed token, then the drafts
    input_ids = torch.cat([drafts[:1], drafts[:-1]]).to(I32)
    input_ids[cu[:-1]] = s["all_token_ids"][idx, s["total_len"][idx].long() - 1]
    b.update(idx=idx[req], pos=pos, input_ids=input_ids, local_pos=local.to(I32),
             bitmask=b["bitmask"][req].contiguous())
    b["banned"] = vllm_banned(b)
    return dict(b=b, requests=idx, cu=cu, logits=logits, drafts=drafts, cache=cache,
                which=which)


def vllm_verify(st, *, draft_logits, logprobs, mode):
    """vLLM's RejectionSampler._verify from its parts: the target rows'
    processing as Sampler.apply_sampling_params (its PyTorch top-k/top-p),
    rejection_sample, and the logprobs of what it sampled."""
    b, which = st["b"], st["which"]
    raw = st["logits"].clone()
    if "bitmask" in which:
        vllm_bitmask(raw, b["bitmask"])
    x = vllm_processors(raw, b, which)
    logits = dict(raw=raw, before_temperature=x.clone())
    x = vllm_filters(x, b)
    cu = st["cu"].to(I32)
    sampled, num_sampled = rejection_sample(
        x, st["cache"] if draft_logits else None, b["input_ids"], cu, b["pos"], st["requests"],
        b["idx"], b["local_pos"], b["temperature"], b["seeds"], MAX_DRAFTS)
    owner = types.SimpleNamespace(sampler=types.SimpleNamespace(logprobs_mode=mode),
                                  enable_adaptive_verification=False)
    out = RejectionSampler._get_logprobs_tensors(
        owner, sampled, num_sampled, raw if mode.startswith("raw") else x, cu,
        cu.numpy(), logprobs)
    logits["processed"] = x
    return sampled, num_sampled, out, logits


def reference_verify(st, *, draft_logits, logprobs, mode):
    b, idx = st["b"], st["requests"]
    kw = processing(b, st["which"])
    kw.pop("position", None)
    return reference.verify(
        st["logits"], st["cu"], st["drafts"], b["temperature"][idx], b["top_k"][idx].long(),
        b["top_p"][idx], b["min_p"][idx], draft_logits=st["cache"] if draft_logits else None,
        seed=b["seeds"][idx], position=b["pos"], logprobs=logprobs, logprobs_mode=mode, **kw)


def verify_ties(st, ours, x):
    """Requests whose outcome may go either way under float rounding (vLLM
    sums its log-sum-exps in float32 by blocks, the reference in float64): a
    ratio test within 1e-4 of its bound, a draw whose two best scores are
    within 1e-4, or a filter's cut within rounding on a row of the request
    (filter_ties on vLLM's logits before temperature)."""
    b, cu = st["b"], st["cu"]
    req = torch.repeat_interleave(torch.arange(cu.shape[0] - 1), cu[1:] - cu[:-1])
    eidx = b["idx"]
    args = dict(temperature=b["temperature"][eidx], top_k=b["top_k"][eidx].long(),
                top_p=b["top_p"][eidx], min_p=b["min_p"][eidx])
    row = (ours.margin.abs() <= 1e-4) | filter_ties(x, args)
    tie = torch.zeros(cu.shape[0] - 1, dtype=torch.bool).index_put_((req,), row, accumulate=True)
    return tie | (ours.gap <= 1e-4)


@pytest.mark.parametrize("draft_logits", [True, False], ids=["draft-model", "ngram"])
@pytest.mark.parametrize("which", [ALL, ("penalties",), ()],
                         ids=["processed", "penalties", "plain"])
def test_verify_matches_vllms_rejection_sampler(draft_logits, which):
    """reference.verify against vLLM's rejection_sample on the same step: the
    same accepted counts, tokens and logprobs on every request but float
    near-ties, counted; all, none and some drafts accepted, greedy and sampled
    requests mixed, vocabularies across vLLM's 8192-column blocks. With
    penalties alone, on every request and with drafts near the target's, the
    drafts before a row count as output tokens there."""
    gen = torch.Generator().manual_seed(11 + 2 * draft_logits + len(which))
    penalties = which == ("penalties",)
    total = near = full = none = greedy = rows_seen = 0
    for vocab, requests, mode in ((100, 48, "raw_logprobs"), (1000, 24, "processed_logprobs"),
                                  (9000, 8, "raw_logits"), (300, 24, "processed_logits")):
        st = make_step(gen, requests, vocab, which=which, filters=which == ALL, all_on=penalties,
                       scales=(0.0, 0.1) if penalties else (0.0, 0.3, 1.0, 4.0))
        n = int(randint(gen, 0, 6, ()))
        sampled, num_sampled, theirs, x = vllm_verify(st, draft_logits=draft_logits, logprobs=n,
                                                      mode=mode)
        ours = reference_verify(st, draft_logits=draft_logits, logprobs=n, mode=mode)
        tie = verify_ties(st, ours, x["before_temperature"])
        # top-n: the same logits in the same order, on the requests' rows
        y = x["raw" if mode.startswith("raw") else "processed"].float()
        req = torch.repeat_interleave(torch.arange(requests), st["cu"][1:] - st["cu"][:-1])
        rows = ~tie[req]
        assert torch.equal(y.gather(1, ours.top_indices)[rows],
                           y.gather(1, theirs.logprob_token_ids[:, 1:])[rows])
        cu, drafts = st["cu"], st["cu"][1:] - st["cu"][:-1] - 1
        total += requests
        near += int(tie.sum())
        full += int(((ours.accepted == drafts) & (drafts > 0)).sum())
        none += int(((ours.accepted == 0) & (drafts > 0)).sum())
        greedy += int((st["b"]["temperature"][st["requests"]] == 0).sum())
        rows_seen += int(cu[-1])
        for r in (~tie).nonzero()[:, 0].tolist():
            rows = slice(int(cu[r]), int(cu[r]) + int(num_sampled[r]))
            assert int(num_sampled[r]) == int(ours.accepted[r]) + 1, (vocab, r)
            assert torch.equal(ours.tokens[rows], sampled[r, :int(num_sampled[r])]), (vocab, r)
            assert ours.tokens[rows.stop:int(cu[r + 1])].eq(-1).all()
            got = torch.cat([ours.logprob[rows, None], ours.top_logprobs[rows]], 1)
            assert_scores_match(got, theirs.logprobs[rows], mode, (vocab, r))
            live = theirs.logprobs[rows, 0] > -INF
            assert torch.equal(ours.rank[rows][live], theirs.selected_token_ranks[rows][live])
    print(f"verify ({'draft model' if draft_logits else 'n-gram'}, {which or 'plain'}): "
          f"{total} requests ({greedy} greedy, {rows_seen} rows), {full} all accepted, "
          f"{none} none, {near} near-ties")
    assert full > 0 and none > 0 and total - full - none > near
    assert near <= total // 20


# ---- the vLLM glue's bad words: vLLM's kernel's bans, from its tables ----

def banned_sets(banned):
    return [sorted(set(row) - {-1}) for row in banned.tolist()]


def reach_into_prompt(b, gen):
    """A bad word for a few of b's requests whose tokens before its last are
    the last of the prompt and the whole output: longer than the output, so
    vLLM's kernel bans nothing for it (without drafts), though those tokens
    are there."""
    s = b["state"]
    for r in b["idx"][:4].tolist():
        end, out = int(s["total_len"][r]), int(s["out_len"][r])
        last = int(randint(gen, 0, b["vocab"], ()))
        word = s["all_token_ids"][r, end - out - 1:end].tolist() + [last]
        s["num_bad_words"][r] = 1
        s["bad_word_offsets"][r, :2] = torch.tensor([0, len(word)], dtype=I32)
        s["bad_word_token_ids"][r, :len(word)] = torch.tensor(word, dtype=I32)
    b["banned"] = vllm_banned(b)


def stale_words(b):
    """Past each request's count of words, a word its output ends with, as
    a request that had the slot before would leave it: never read."""
    s = b["state"]
    for r in range(s["num_bad_words"].shape[0]):
        n, out = int(s["num_bad_words"][r]), int(s["out_len"][r])
        end = int(s["bad_word_offsets"][r, n])
        if out and n < BAD_N and end + 2 <= BAD_W:
            last = int(s["all_token_ids"][r, int(s["total_len"][r]) - 1])
            s["bad_word_token_ids"][r, end:end + 2] = torch.tensor([last, r % b["vocab"]])
            s["bad_word_offsets"][r, n + 1] = end + 2
    b["banned"] = vllm_banned(b)


@pytest.mark.parametrize("drafts", [False, True])
def test_glue_bad_words_ban_what_vllm_bans(drafts):
    """klgen.integrations.vllm.bad_words_banned on vLLM's own BadWordsState
    tables (random requests, half their words ending the output, 0-4 words
    each, words past each count that would ban) bans in every row the
    columns vLLM's bad-words kernel sets to -inf, with and without drafts."""
    from klgen.integrations.vllm import bad_words_banned

    gen = torch.Generator().manual_seed(31 + drafts)
    hits = rows_seen = 0
    for vocab in (50, 1000, 7):
        for _ in range(4):
            b = make_step(gen, 12, vocab)["b"] if drafts else make_batch(gen, 24, 30, vocab)
            reach_into_prompt(b, gen)
            stale_words(b)
            s = b["state"]
            width = max(int(s["num_bad_words"][b["idx"]].max()), 1)
            ids, local = drafts_in(b, b["idx"].shape[0])
            step = dict(local_pos=local, input_ids=ids) if drafts else {}
            got = bad_words_banned(s["bad_word_token_ids"], s["bad_word_offsets"],
                                   s["num_bad_words"], s["all_token_ids"], s["prompt_len"],
                                   s["total_len"], b["idx"], width, **step)
            assert got.dtype == I32 and got.shape == (b["idx"].shape[0], width)
            want = banned_sets(b["banned"])
            assert banned_sets(got) == want, (vocab, banned_sets(got), want)
            hits += sum(map(len, want))
            rows_seen += len(want)
    assert hits > rows_seen // 4  # the words did end outputs


# ---- the vLLM glue on vLLM's own Sampler: a request mix ----

def mix_params(gen, vocab, histories):
    """A request for each (prompt, output) history, drawn from a server's
    mix: 40 % plain, 20 % frequency and presence penalties, 10 % repetition
    penalty, 10 % a grammar, 10 % seeded, 5 % logit bias, 5 % min_tokens with
    stop ids; on top, a tenth greedy, a fifth with bad words, of which one
    bans a column where the output ends with its first token (and one never
    does), and 15 % asking for 5 top logprobs (drawn apart, so that the rest
    of the mix stays as it was). (kind, SamplingParams, that column or None)
    each."""
    from vllm.sampling_params import StructuredOutputsParams

    apart = torch.Generator().manual_seed(43)

    kinds = ["plain"] * 8 + ["penalties"] * 4 + ["repetition"] * 2 + ["grammar"] * 2 + \
        ["seeded"] * 2 + ["bias", "min_tokens"]
    out = []
    for _, output in histories:
        kind = kinds[int(randint(gen, 0, len(kinds), ()))]
        kw = dict(temperature=float(torch.rand((), generator=gen)) * 1.5 + 0.2)
        if torch.rand((), generator=gen) < 0.1:
            kw["temperature"] = 0.0
        if torch.rand((), generator=gen) < 0.3:
            kw.update(top_k=int(randint(gen, 1, 60, ())), top_p=0.9)
        if kind == "penalties":
            kw.update(frequency_penalty=0.5, presence_penalty=0.3)
        elif kind == "repetition":
            kw.update(repetition_penalty=1.3)
        elif kind == "grammar":
            kw.update(structured_outputs=StructuredOutputsParams(regex="a+"))
        elif kind == "seeded":
            kw.update(seed=int(randint(gen, 0, 2**31, ())))
        elif kind == "bias":
            kw.update(logit_bias={int(randint(gen, 0, vocab, ())): 5.0 for _ in range(8)})
        elif kind == "min_tokens":
            kw.update(min_tokens=int(randint(gen, 1, 40, ())), max_tokens=64,
                      stop_token_ids=randint(gen, 0, vocab, (3,)).tolist())
        if torch.rand((), generator=apart) < 0.15:
            kw["logprobs"] = 5
        params, target = SamplingParams(**kw), None
        if output and torch.rand((), generator=gen) < 0.2:
            target = int(randint(gen, 0, vocab, ()))
            params._bad_words_token_ids = [[(output[-1] + 1) % vocab, 7, target],
                                           [output[-1], target]]
        out.append((kind, params, target))
    return out


def vllm_sampler(monkeypatch, vocab, params, histories):
    """vLLM's v2 Sampler and RequestState on the CPU (its UVA buffers as
    plain CPU tensors), a request per SamplingParams with its (prompt,
    output) history; its staged writes applied by vLLM's own kernels. The
    sampler and each request's slot."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.worker.gpu.buffer_utils as buffers
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.sample import sampler as sampler_module
    from vllm.v1.worker.gpu.states import RequestState

    monkeypatch.setattr(current_platform, "device_type", "cpu")
    monkeypatch.setattr(buffers, "is_uva_available", lambda: False)
    monkeypatch.setattr(buffers, "UvaBuffer", buffers.NonUvaBuffer)
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    # vLLM's PyTorch top-k/top-p, as vllm_filters: its Triton one does not
    # run under the interpreter
    monkeypatch.setattr(sampler_module, "apply_top_k_top_p",
                        lambda x, k, p, **_: apply_top_k_top_p_pytorch(x, k, p,
                                                                        allow_cpu_sync=True))
    from klgen.integrations.vllm import _plans

    cpu, n = torch.device("cpu"), len(params)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        req = RequestState(n, 128, 128, 0, vocab, cpu)
        sampler = sampler_module.Sampler(VllmConfig(device_config=DeviceConfig(device="cpu")),
                                         n, vocab, cpu, req)
    _plans(sampler)  # the glue sees the requests added, as in a server that runs on
    slots = []
    for i, (p, (prompt, output)) in enumerate(zip(params, histories)):
        req.add_request(f"r{i}", len(prompt), prompt + output, len(prompt + output), 64)
        slots.append(req.req_id_to_index[f"r{i}"])
        sampler.add_request(slots[-1], p)
    req.apply_staged_writes()
    sampler.apply_staged_writes()
    return sampler, slots


def decode_batch(sampler, slots):
    """vLLM's InputBatch for a decode step of the requests in `slots`, one
    token each, at the position after each request's tokens."""
    req = sampler.req_states
    n, at = len(slots), torch.tensor(slots, dtype=I32)
    total = req.total_len.gpu[at.long()]
    last = req.all_token_ids.gpu[at.long(), (total - 1).long()]
    return types.SimpleNamespace(
        idx_mapping_np=np.array(slots, dtype=np.int32), idx_mapping=at,
        expanded_idx_mapping=at, expanded_local_pos=torch.zeros(n, dtype=I32),
        num_reqs=n, cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
        cu_num_logits=torch.arange(n + 1, dtype=I32), positions=(total - 1).to(I64),
        logits_indices=torch.arange(n, dtype=I64), input_ids=last.to(I32),
        seq_lens=total.to(I32), seq_lens_cpu_upper_bound=total.to(I32),
        num_draft_tokens=0, req_ids=[f"r{s}" for s in slots])


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
def test_glue_serves_a_request_mix_as_vllms_sampler(monkeypatch, mode):
    """klgen.integrations.vllm.sampling_args on vLLM's own Sampler for a
    request mix, mixed within each step: no step declined, and the token
    of every row that is not a float near-tie is the one vLLM's
    Sampler.__call__ draws from the same logits (the runner's grammar
    bitmask applied first, as the runner does). A step with logprobs
    requests returns vLLM's LogprobsTensors, in either raw mode: the same
    ids and ranks on those rows, logprobs within float32 rounding, logits
    equal. A request with its own logprob_token_ids, or a processed mode,
    declines its steps."""
    from klgen._torch import Sample, TopLogprobs
    from klgen.integrations.vllm import logprobs_tensors, sampling_args

    gen = torch.Generator().manual_seed(41)
    vocab, n = 300, 40
    histories = []
    for _ in range(n):
        prompt = randint(gen, 0, vocab, (int(randint(gen, 1, 20, ())),)).tolist()
        output = randint(gen, 0, min(vocab, 20), (int(randint(gen, 0, 30, ())),)).tolist()
        histories.append((prompt, output))
    mix = mix_params(gen, vocab, histories)
    sampler, slots = vllm_sampler(monkeypatch, vocab, [p for _, p, _ in mix], histories)
    sampler.logprobs_mode = mode
    bad = next(p for p in sampler.logits_processors if type(p).__name__ == "BadWordsState")
    total = near = steps = moved = with_logprobs = 0
    for _ in range(12):
        rows = int(randint(gen, 4, 17, ()))
        picked = torch.randperm(n, generator=gen)[:rows].tolist()
        batch = decode_batch(sampler, [slots[i] for i in picked])
        logits = torch.randn(rows, vocab, generator=gen) * 3
        for r, i in enumerate(picked):  # the banned column the likeliest
            if mix[i][2] is not None:
                logits[r, mix[i][2]] += 30.0
        bitmask = torch.full((rows, words(vocab)), -1, dtype=I32)
        for r, i in enumerate(picked):
            if mix[i][0] == "grammar":
                bitmask[r] = randint(gen, -2**31, 2**31, (words(vocab),))
        masked = logits.clone()
        vllm_bitmask(masked, bitmask)
        theirs = sampler(masked, batch)
        want = theirs.sampled_token_ids[:, 0]
        args = sampling_args(sampler, batch, 64, vocab)
        assert not isinstance(args, str), args
        args = dict(args, bitmask=bitmask)  # as the glue adds the runner's
        asked = args.pop("ranks", False)
        args.pop("token_logprobs", None)
        drawn = reference.sample(logits, **args, noise="vllm")
        got = drawn.tokens
        tie = glue_near_ties(logits, args, batch)
        assert torch.equal(got[~tie], want[~tie]), (picked, got, want)
        assert asked == (theirs.logprobs_tensors is not None)
        if asked:  # what the glue hands vLLM, from kl_sample's Sample
            top = TopLogprobs(drawn.top_logprobs, drawn.top_indices)
            ours = logprobs_tensors(Sample(got, drawn.logprob, top if args["logprobs"] else None,
                                           drawn.rank))
            mine, vllms = ours.logprob_token_ids[~tie], theirs.logprobs_tensors.logprob_token_ids
            assert torch.equal(mine, vllms[~tie]), (mine, vllms)
            assert torch.equal(ours.selected_token_ranks[~tie],
                               theirs.logprobs_tensors.selected_token_ranks[~tie])
            if mode == "raw_logits":
                assert torch.equal(ours.logprobs[~tie], theirs.logprobs_tensors.logprobs[~tie])
            else:
                assert torch.allclose(ours.logprobs[~tie],
                                      theirs.logprobs_tensors.logprobs[~tie], rtol=1e-5, atol=2e-6)
            with_logprobs += 1
        if "banned" in args:  # the bans are those of vLLM's kernel
            probe = torch.zeros(rows, vocab)
            apply_bad_words(probe, batch.expanded_idx_mapping, bad.bad_word_token_ids.gpu,
                            bad.bad_word_offsets.gpu, bad.num_bad_words.gpu,
                            bad.req_states.all_token_ids.gpu, bad.req_states.prompt_len.gpu,
                            bad.req_states.total_len.gpu, batch.input_ids,
                            batch.expanded_local_pos, int(args["banned"].shape[1]))
            assert banned_sets(args["banned"]) == \
                [(row == -INF).nonzero()[:, 0].tolist() for row in probe]
            plain = {k: v for k, v in args.items() if k != "banned"}
            moved += int((reference.sample(logits, **plain, noise="vllm").tokens != got).sum())
        total, near, steps = total + rows, near + int(tie.sum()), steps + 1
    # the words' tables read over their tokens, not the table's width
    widths = [p.bad_tokens for p in sampler.__dict__["_klgen_plans"].values()
              if getattr(p, "bad_words", None) is not None]
    assert widths and all(w == 5 for w in widths), widths
    print(f"vLLM glue, request mix: {steps} steps, {total} rows, {near} near-ties, "
          f"{moved} tokens the bans moved, {with_logprobs} steps with logprobs")
    assert near <= total // 20 and moved > 0 and 0 < with_logprobs < steps
    sampler.add_request(slots[0], SamplingParams(temperature=1.0, logprob_token_ids=[1, 2]))
    sampler.apply_staged_writes()
    reason = sampling_args(sampler, decode_batch(sampler, slots[:3]), 64, vocab)
    assert isinstance(reason, str) and "logprob_token_ids" in reason, reason
    sampler.add_request(slots[0], SamplingParams(temperature=1.0, logprobs=2))
    sampler.apply_staged_writes()
    sampler.logprobs_mode = "processed_logprobs"
    reason = sampling_args(sampler, decode_batch(sampler, slots[:3]), 64, vocab)
    assert isinstance(reason, str) and "processed_logprobs" in reason, reason


def test_glue_bans_as_outputs_grow(monkeypatch):
    """One composition stepped while its requests' outputs grow: the glue
    lays its bad words out on the first step alone (the plan keeps the
    layout) and on every step bans what vLLM's own kernel bans, words
    whose prefixes the new tokens complete included."""
    from klgen.integrations.vllm import sampling_args

    gen = torch.Generator().manual_seed(5)
    vocab, n = 300, 8
    histories = [([1, 2, 3], [int(randint(gen, 0, 20, ())) for _ in range(4)]) for _ in range(n)]
    mix = mix_params(gen, vocab, histories)
    for (_, p, _), (_, output) in zip(mix, histories):  # every request has words
        p._bad_words_token_ids = [[40 + len(output) % 3, 41, 50], [42, 51], [43, 44, 45, 52]]
    sampler, slots = vllm_sampler(monkeypatch, vocab, [p for _, p, _ in mix], histories)
    bad = next(p for p in sampler.logits_processors if type(p).__name__ == "BadWordsState")
    req = sampler.req_states
    layouts, banned = set(), 0
    for step in range(6):
        batch = decode_batch(sampler, slots)
        args = sampling_args(sampler, batch, 64, vocab)
        assert not isinstance(args, str), args
        probe = torch.zeros(n, vocab)
        apply_bad_words(probe, batch.expanded_idx_mapping, bad.bad_word_token_ids.gpu,
                        bad.bad_word_offsets.gpu, bad.num_bad_words.gpu,
                        req.all_token_ids.gpu, req.prompt_len.gpu, req.total_len.gpu,
                        batch.input_ids, batch.expanded_local_pos, int(args["banned"].shape[1]))
        want = [(row == -INF).nonzero()[:, 0].tolist() for row in probe]
        assert banned_sets(args["banned"]) == want, (step, args["banned"], want)
        banned += sum(map(len, want))
        plan = next(iter(sampler.__dict__["_klgen_plans"].values()))
        layouts.add(id(plan.bad_layout[0]))
        for slot in slots:  # the next output token: a word's prefix now and then
            total = int(req.total_len.gpu[slot])
            token = (40, 41, 42, 43, 44, 7)[(slot + step) % 6]
            req.all_token_ids.gpu[slot, total] = token
            req.total_len.gpu[slot] = total + 1
    assert len(layouts) == 1 and banned > 0, (layouts, banned)


def glue_near_ties(logits, args, batch):
    """near_ties for the glue's arguments: vLLM's tables read through
    state_rows, min_tokens at each row's position."""
    if "state_rows" not in args:  # all greedy: an argmax
        return torch.zeros(logits.shape[0], dtype=torch.bool)
    rows = args["state_rows"].long()
    per_row = {name: args[name][rows] for name in ("temperature", "seed")}
    per_row["top_k"] = torch.zeros_like(rows) if args["top_k"] is None else \
        args["top_k"][rows].long()
    per_row["top_p"] = torch.ones(rows.shape) if args["top_p"] is None else args["top_p"][rows]
    per_row["min_p"] = torch.zeros(rows.shape) if args["min_p"] is None else args["min_p"][rows]
    per_row["offset"] = args["offset"][args["offset_rows"]]
    kw = {k: v for k, v in args.items() if k not in (
        "temperature", "top_k", "top_p", "min_p", "seed", "offset", "offset_rows", "logprobs",
        "logprobs_mode")}
    if "min_tokens" in kw:
        kw["position"] = per_row["offset"]
    return near_ties(logits, per_row, kw)


# ---- misuse: what vLLM would refuse, refused ----

def test_ids_vllm_refuses_are_refused():
    vocab = 10
    config = types.SimpleNamespace(get_vocab_size=lambda: vocab, max_logprobs=20)
    with pytest.raises(VLLMValidationError):
        SamplingParams(logit_bias={vocab: 1.0})._validate_logit_bias(config)
    x = torch.zeros(1, vocab)
    one, ids = torch.tensor([1], dtype=I32), torch.tensor([[vocab]], dtype=I32)
    with pytest.raises(ValueError, match="logit_bias ids must be in"):
        reference.sample(x, 1.0, logit_bias=(one, ids, torch.ones(1, 1)))
