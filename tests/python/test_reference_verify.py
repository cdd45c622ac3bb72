"""klgen.reference.verify, speculative decoding's rejection sampling
(docs/design/sampling.md, "Verification"), on its own: the output tokens'
distribution is the target's (the defining property of rejection sampling),
greedy and full acceptances, placeholders, the bonus row as sample(), the
penalties' draft counts, requests apart, its acceptance uniform against a
scalar Philox, and what it refuses. Against vLLM's own kernels:
test_reference_vllm.py.
"""

import math
import random

import pytest

torch = pytest.importorskip("torch")

from klgen import reference  # noqa: E402
from test_reference import M32, chi2_sf, f32, philox_scalar  # noqa: E402

I32, I64, F32 = torch.int32, torch.int64, torch.float32
INF = math.inf


def layout(drafts):
    """cu_num_logits, each row's request and each row's draft index for
    requests with the given draft counts."""
    n = torch.as_tensor(drafts, dtype=I64)
    cu = torch.cat([torch.zeros(1, dtype=I64), (n + 1).cumsum(0)])
    req = torch.repeat_interleave(torch.arange(n.shape[0]), n + 1)
    return cu, req, torch.arange(int(cu[-1])) - cu[:-1][req]


def seeds(rng, n):
    return torch.tensor([rng.randrange(-2**63, 2**63) for _ in range(n)], dtype=I64)


# ---- the acceptance uniform: Triton's tl.rand, from a scalar Philox ----

def accept_uniform_scalar(seed, position):
    """tl.rand(seed, position) as Triton defines it: word 0 of Philox4x32-10
    of counter (position's two words, 0, 0) and key (seed's two words); the
    word as an int32, ~x where negative; times float32 4.6566127342e-10, in
    float32; floored there (vLLM's _TL_RAND_MIN)."""
    seed, position = seed % 2**64, position % 2**64
    x = philox_scalar((position & M32, position >> 32, 0, 0), (seed & M32, seed >> 32))[0]
    x = x ^ M32 if x >= 2**31 else x
    scale = f32(4.6566127342e-10)
    return max(f32(f32(x) * scale), scale)


def test_accept_uniform_is_tl_rand_of_philox():
    rng = random.Random(1)
    pairs = [(0, 0), (-1, 2**32 - 1), (2**63 - 1, 2**32), (-2**63, 2**62), (5, -1)]
    pairs += [(rng.randrange(-2**63, 2**63), rng.randrange(2**40)) for _ in range(2000)]
    seed = torch.tensor([s for s, _ in pairs], dtype=I64)
    pos = torch.tensor([p for _, p in pairs], dtype=I64)
    got = reference.vllm_accept_uniform(seed, pos).tolist()
    assert got == [accept_uniform_scalar(s, p) for s, p in pairs]
    assert 0 < min(got) and max(got) < 1
    # a word whose int32 is negative: its complement, not its low 31 bits
    assert any(philox_scalar((p & M32, (p % 2**64) >> 32, 0, 0),
                             ((s % 2**64) & M32, (s % 2**64) >> 32))[0] >= 2**31
               for s, p in pairs[:50])


# ---- the distribution: rejection sampling's output is the target's ----

TARGET = [2.0, 1.5, 1.0, 0.5, 0.3, 0.0, -0.5, 1.2]
DRAFT = [0.0, 1.8, -1.0, 1.5, 0.3, 1.0, 0.5, -2.0]
DISTRIBUTION_CASES = [  # temperature, top_k, draft: "model" (DRAFT's q) or a column (one-hot)
    (0.9, 0, "model"),
    (1.3, 5, "model"),
    (0.9, 0, 0),
    (1.0, 4, 2),
    (1.0, 4, 7),
]


def first_token_chi2(temperature, top_k, draft, recover=None):
    """Verifies 40,000 requests of one draft each on fixed target and draft
    logits, the drafts drawn from q (a fixed generator, apart from the
    verification's noise); returns (chi-square of the first output token's
    counts against the target's filtered softmax, its degrees of freedom,
    the acceptance rate)."""
    requests, vocab = 40000, len(TARGET)
    rng = random.Random(repr((temperature, top_k, draft)))
    cu, req, step = layout([1] * requests)
    logits = torch.tensor(TARGET).expand(2 * requests, -1).contiguous()
    kw = {}
    if draft == "model":
        d = torch.tensor(DRAFT)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        drafts = torch.multinomial(torch.softmax(d / f32(temperature), 0), requests, True,
                                   generator=gen)
        kw["draft_logits"] = d.expand(requests, 1, -1)
    else:
        drafts = torch.full((requests,), draft, dtype=I64)
    aligned = torch.where(step == 0, drafts[req], -1)
    out = reference.verify(logits, cu, aligned, temperature, top_k, seed=seeds(rng, requests),
                           position=torch.full((2 * requests,), rng.randrange(2**32)) + step,
                           **kw)
    counts = torch.bincount(out.tokens[cu[:-1]], minlength=vocab).tolist()
    t = torch.tensor(TARGET) / f32(temperature)
    keep = reference.keep_mask(torch.tensor([TARGET]), temperature, top_k)[0].tolist()
    p = torch.softmax(torch.where(torch.tensor(keep), t, -INF).double(), 0).tolist()
    assert all(counts[c] == 0 for c in range(vocab) if not keep[c])
    expected = {c: requests * p[c] for c in range(vocab) if keep[c]}
    assert min(expected.values()) > 20
    stat = sum((counts[c] - e) ** 2 / e for c, e in expected.items())
    return stat, len(expected) - 1, float(out.accepted.double().mean())


@pytest.mark.parametrize("case", DISTRIBUTION_CASES)
def test_first_token_follows_the_target(case):
    """The defining property: whatever q is, the first output token is
    distributed as p (the target's filtered softmax). A recovery drawn from
    p instead of max(p - q, 0), or a one-hot draw that keeps the draft's
    column, moves it by far more than the bound allows."""
    stat, df, accepted = first_token_chi2(*case)
    print(f"verify chi-square {case}: {stat:.2f} on {df} df (p = {chi2_sf(stat, df):.3g}), "
          f"{accepted:.3f} accepted")
    assert 0.05 < accepted < 0.95  # both branches ran, often
    assert chi2_sf(stat, df) > 1e-3, (case, stat)


# ---- properties ----

def random_step(rng, gen, requests, vocab, *, greedy=0.3):
    n = [rng.randrange(0, 9) for _ in range(requests)]
    n[:2] = [0, 8]
    cu, req, step = layout(n)
    rows = int(cu[-1])
    temp = torch.tensor([0.0 if rng.random() < greedy else rng.uniform(0.3, 1.8)
                         for _ in range(requests)])
    logits = torch.randn(rows, vocab, generator=gen) * 3
    drafts = torch.where(step < torch.tensor(n)[req],
                         torch.randint(0, vocab, (rows,), generator=gen), -1)
    return dict(cu=cu, req=req, step=step, n=torch.tensor(n), temp=temp, logits=logits,
                drafts=drafts, seed=seeds(rng, requests),
                position=torch.randint(0, 2**40, (requests,), generator=gen)[req] + step)


def test_bonus_row_draws_as_sample():
    """Requests without drafts: the bonus row's token, logprobs and ranks are
    sample(noise="vllm")'s, filters and processing included."""
    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    rows, vocab = 64, 300
    logits = torch.randn(rows, vocab, generator=gen) * 3
    cu = torch.arange(rows + 1)
    temp = torch.tensor([0.0 if rng.random() < 0.2 else rng.uniform(0.3, 1.8)
                         for _ in range(rows)])
    k = torch.tensor([rng.choice([0, 5, 50]) for _ in range(rows)])
    p = torch.tensor([rng.choice([1.0, 0.9, 0.5]) for _ in range(rows)])
    mp = torch.where(temp == 0, 0.0, torch.tensor([rng.choice([0.0, 0.05])
                                                   for _ in range(rows)]))
    seed, pos = seeds(rng, rows), torch.randint(0, 2**40, (rows,), generator=gen)
    bias = (torch.full((rows,), 3, dtype=I32), torch.randint(0, vocab, (rows, 3), dtype=I32,
                                                             generator=gen),
            torch.randn(rows, 3, generator=gen) * 5)
    for mode in reference.LOGPROBS_MODES:
        got = reference.verify(logits, cu, torch.full((rows,), 7), temp, k, p, mp, seed=seed,
                               position=pos, logprobs=4, logprobs_mode=mode, logit_bias=bias)
        want = reference.sample(logits, temp, k, p, mp, seed=seed, offset=pos, logprobs=4,
                                logprobs_mode=mode, noise="vllm", logit_bias=bias)
        assert got.accepted.eq(0).all()
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.rank, want.rank)
        for a, b in ((got.logprob, want.logprob), (got.top_logprobs, want.top_logprobs)):
            assert torch.equal(torch.isnan(a), torch.isnan(b))
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
        assert torch.equal(got.top_indices, want.top_indices)
        assert got.margin.isnan().all()


def test_q_equal_to_p_accepts_every_draft():
    """Draft logits equal to the target's (no processing, no filters): p = q,
    so log p - log q = 0 > log u for every draft; greedy rows whose drafts
    are the argmax accept them all too; the bonus row draws as sample()."""
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    st = random_step(rng, gen, 40, 500)
    cu, req, step, n = st["cu"], st["req"], st["step"], st["n"]
    greedy = (st["temp"] == 0)[req]
    drafts = torch.where(greedy, st["logits"].argmax(1), st["drafts"])
    drafts = torch.where(step < n[req], drafts, -1)
    cache = torch.zeros(40, 8, 500)
    judged = step < n[req]
    cache[req[judged], step[judged]] = st["logits"][judged]
    out = reference.verify(st["logits"], cu, drafts, st["temp"], seed=st["seed"],
                           position=st["position"], draft_logits=cache)
    assert torch.equal(out.accepted, n)
    bonus = cu[1:] - 1
    assert torch.equal(out.tokens[judged], drafts[judged])
    want = reference.sample(st["logits"][bonus], st["temp"], seed=st["seed"],
                            offset=st["position"][bonus], noise="vllm").tokens
    assert torch.equal(out.tokens[bonus], want)
    tested = judged & ~greedy
    assert (out.margin[tested] > 0).all() and out.margin[~tested].isnan().all()


def test_greedy_accepts_the_argmax_prefix():
    """Greedy requests (T = 0, with other requests' filters beside): accepted
    while the draft is the argmax; the first other draft's row, or the bonus
    row, gives the argmax; rows after it -1."""
    rng, gen = random.Random(4), torch.Generator().manual_seed(4)
    st = random_step(rng, gen, 60, 200, greedy=1.0)
    cu, req, step, n = st["cu"], st["req"], st["step"], st["n"]
    argmax = st["logits"].argmax(1)
    prefix = torch.tensor([rng.randrange(0, int(d) + 1) for d in n])
    wrong = (argmax + 1 + torch.randint(0, 199, argmax.shape, generator=gen)) % 200
    drafts = torch.where(step < prefix[req], argmax, wrong)
    drafts = torch.where(step < n[req], drafts, -1)
    out = reference.verify(st["logits"], cu, drafts, 0.0, seed=st["seed"],
                           position=st["position"])
    assert torch.equal(out.accepted, prefix)
    at = cu[:-1] + prefix
    assert torch.equal(out.tokens[at], argmax[at])
    assert torch.equal(out.tokens[step < prefix[req]], argmax[step < prefix[req]])
    assert out.tokens[step > prefix[req]].eq(-1).all()


def test_drafts_p_excludes_and_placeholders_stop_verification():
    """A draft outside what the bitmask or top-k keep has p = 0: rejected,
    whatever q; a placeholder (-1) stops verification and its row draws from
    p as sample() does; a one-hot draw never gives the rejected draft."""
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    requests, vocab = 50, 96
    st = random_step(rng, gen, requests, vocab, greedy=0.0)
    cu, req, step, n = st["cu"], st["req"], st["step"], st["n"]
    rows = int(cu[-1])
    # each row allows the even columns; drafts are odd
    mask = torch.full((rows, 3), 0x55555555, dtype=I32)
    drafts = torch.where(step < n[req], st["drafts"] | 1, -1)
    out = reference.verify(st["logits"], cu, drafts, st["temp"], seed=st["seed"],
                           position=st["position"], bitmask=mask)
    assert out.accepted.eq(0).all()
    first = out.tokens[cu[:-1]]
    assert (first % 2 == 0).all() and (first != drafts[cu[:-1]]).all()
    # top-k 3: a draft outside the three largest, with q far above p, rejected
    low = st["logits"].argsort(1)[:, 0]
    out = reference.verify(st["logits"], cu, torch.where(step < n[req], low, -1), st["temp"],
                           top_k=3, seed=st["seed"], position=st["position"])
    assert out.accepted.eq(0).all()
    # placeholders: drafts the target always accepts (a column 10^4 above
    # the rest: p = 1 there), then a -1 on a row of the random logits
    cut = torch.tensor([rng.randrange(0, int(d) + 1) for d in n])
    before = step < cut[req]
    sure = torch.where(before, st["drafts"].clamp(min=0), -1)
    logits = st["logits"].clone()
    logits[before, sure[before]] = 1e4
    at = cu[:-1] + cut
    want = reference.sample(logits[at], st["temp"], seed=st["seed"], offset=st["position"][at],
                            noise="vllm").tokens
    # with q one-hot, and with draft logits: p, not the residual, at a placeholder
    cache = torch.randn(requests, 8, vocab, generator=gen) * 3
    for kw in ({}, dict(draft_logits=cache)):
        out = reference.verify(logits, cu, sure, st["temp"], seed=st["seed"],
                               position=st["position"], **kw)
        assert torch.equal(out.accepted, cut)
        assert torch.equal(out.tokens[at], want)


def test_penalties_count_the_drafts_before_each_row():
    """A row's output counts are its request's plus the request's drafts
    before it (placeholders not counted): the same result as tables made
    per row by hand."""
    rng, gen = random.Random(6), torch.Generator().manual_seed(6)
    requests, vocab = 30, 40
    st = random_step(rng, gen, requests, vocab, greedy=0.2)
    cu, req, step, n = st["cu"], st["req"], st["step"], st["n"]
    rows = int(cu[-1])
    # drafts from few columns, so that they repeat; and a few placeholders
    drafts = torch.where(step < n[req], torch.randint(0, 4, (rows,), generator=gen), -1)
    drafts[torch.rand(rows, generator=gen) < 0.05] = -1
    base = torch.randint(0, 3, (requests, vocab), generator=gen, dtype=I32)
    prompt = torch.randint(-2**31, 2**31, (requests, 2), generator=gen, dtype=I64).to(I32)
    freq = torch.rand(requests, generator=gen) * 2
    pres = torch.rand(requests, generator=gen) - 0.5
    rep = torch.rand(requests, generator=gen) + 0.5
    got = reference.verify(st["logits"], cu, drafts, st["temp"], seed=st["seed"],
                           position=st["position"], logprobs=3,
                           logprobs_mode="processed_logprobs", state_rows=req,
                           output_counts=base, prompt_mask=prompt, frequency_penalty=freq,
                           presence_penalty=pres, repetition_penalty=rep)
    by_hand = base[req].clone()
    for j in range(rows):
        for i in range(int(step[j])):
            d = int(drafts[int(cu[req[j]]) + i])
            if d >= 0:
                by_hand[j, d] += 1

    def rows_alone(counts):
        """Each row's processed top logprobs with these output counts."""
        return reference.sample(st["logits"], st["temp"][req], logprobs=3,
                                logprobs_mode="processed_logprobs", output_counts=counts,
                                prompt_mask=prompt[req], frequency_penalty=freq[req],
                                presence_penalty=pres[req], repetition_penalty=rep[req])

    want = rows_alone(by_hand)
    assert torch.equal(got.top_logprobs, want.top_logprobs)
    assert torch.equal(got.top_indices, want.top_indices)
    # it mattered: without the drafts' counts the rows come out otherwise
    assert not torch.equal(rows_alone(base[req]).top_logprobs, got.top_logprobs)


def test_requests_do_not_depend_on_each_other():
    """A request verified in a batch and alone gives the same result: the
    batch's other requests, their draft counts and rows change nothing."""
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    st = random_step(rng, gen, 16, 120)
    cu, n = st["cu"], st["n"]
    cache = torch.randn(16, 8, 120, generator=gen) * 2 + st["logits"][cu[:-1]][:, None]
    kw = dict(logprobs=2, logprobs_mode="raw_logprobs")
    out = reference.verify(st["logits"], cu, st["drafts"], st["temp"], seed=st["seed"],
                           position=st["position"], draft_logits=cache, **kw)
    for r in range(16):
        rows = slice(int(cu[r]), int(cu[r + 1]))
        one = reference.verify(st["logits"][rows], cu[r:r + 2] - cu[r], st["drafts"][rows],
                               st["temp"][r:r + 1], seed=st["seed"][r:r + 1],
                               position=st["position"][rows], draft_logits=cache[r:r + 1], **kw)
        assert int(one.accepted) == int(out.accepted[r])
        assert torch.equal(one.tokens, out.tokens[rows])
        assert torch.equal(one.logprob.nan_to_num(), out.logprob[rows].nan_to_num())
        assert torch.equal(one.top_indices, out.top_indices[rows])
    assert 0 < int((out.accepted > 0).sum()) and int((out.accepted < n).sum()) > 0


# ---- misuse ----

def test_verify_refuses_misuse():
    x = torch.zeros(5, 10)
    cu = torch.tensor([0, 2, 5])
    d = torch.tensor([1, -1, 2, 3, -1])
    pos = torch.arange(5)

    def call(**kw):
        args = dict(logits=x, cu_num_logits=cu, draft_tokens=d, temperature=1.0, position=pos)
        args.update(kw)
        return reference.verify(**args)

    call()
    for method in ("synthetic", "block", "fly"):
        with pytest.raises(ValueError, match=f"vLLM's '{method}' is not implemented"):
            call(method=method)
    with pytest.raises(ValueError, match="unknown method 'typical'.*synthetic, block, fly"):
        call(method="typical")
    with pytest.raises(TypeError, match="cu_num_logits must be an int32 or int64 tensor"):
        call(cu_num_logits=[0, 2, 5])
    with pytest.raises(TypeError, match="cu_num_logits must be an int32 or int64 tensor"):
        call(cu_num_logits=cu.float())
    with pytest.raises(ValueError, match="from 0 to 5"):
        call(cu_num_logits=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="from 0 to 5"):
        call(cu_num_logits=torch.tensor([1, 2, 5]))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        call(cu_num_logits=torch.tensor([0, 2, 2, 5]))
    with pytest.raises(ValueError, match="requests \\+ 1"):
        call(cu_num_logits=torch.zeros(0, dtype=I64))
    with pytest.raises(ValueError, match="draft_tokens must be in \\[0, 10\\) or -1"):
        call(draft_tokens=torch.tensor([10, -1, 2, 3, -1]))
    with pytest.raises(ValueError, match="draft_tokens must be in"):
        call(draft_tokens=torch.tensor([1, -1, -2, 3, -1]))
    call(draft_tokens=torch.tensor([1, 99, 2, 3, -7]))  # bonus rows: not read
    with pytest.raises(TypeError, match="draft_tokens must be an int32 or int64 tensor"):
        call(draft_tokens=d.float())
    with pytest.raises(ValueError, match="draft_tokens has shape"):
        call(draft_tokens=d[:4])
    with pytest.raises(ValueError, match="position has shape"):
        call(position=torch.arange(2))
    with pytest.raises(TypeError, match="position must be a torch.int64 tensor"):
        call(position=3)
    with pytest.raises(ValueError, match="temperature has shape"):
        call(temperature=torch.ones(5))
    with pytest.raises(ValueError, match="logprobs_mode"):
        call(logprobs_mode="logprobs")
    with pytest.raises(ValueError, match="logprobs must be in"):
        call(logprobs=11)
    with pytest.raises(ValueError, match="draft_logits has shape"):
        call(draft_logits=torch.zeros(2, 2, 11))
    with pytest.raises(ValueError, match="room for 1 drafts a request, a request has 2"):
        call(draft_logits=torch.zeros(2, 1, 10))
    with pytest.raises(ValueError, match="draft_logits has 1 states, a request reads state 1"):
        call(draft_logits=torch.zeros(1, 2, 10))
    with pytest.raises(TypeError, match="draft_logits has dtype"):
        call(draft_logits=torch.zeros(2, 2, 10, dtype=I64))
    with pytest.raises(ValueError, match="state_rows must be the same on every row of a request"):
        call(draft_logits=torch.zeros(3, 2, 10), state_rows=torch.tensor([0, 1, 2, 2, 2]))
    call(draft_logits=torch.zeros(3, 2, 10), state_rows=torch.tensor([2, 2, 0, 0, 0]))
    with pytest.raises(ValueError, match="state_rows reaches row 5 of min_tokens min_len"):
        call(min_tokens=(torch.zeros(2, dtype=I32), torch.zeros(2, dtype=I32),
                         torch.zeros(2, 1, dtype=I32), None),
             state_rows=torch.tensor([0, 5, 1, 1, 1]))
