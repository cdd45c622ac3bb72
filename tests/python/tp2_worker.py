"""TP ranks, one per GPU (torchrun --nproc_per_node=2, or 1 on a machine of one
GPU: the same checks with a group of one): klgen.LogitsGather against
torch.distributed.all_gather_into_tensor + movedim + slice, bit for bit
(+0.0 and -0.0 counted equal: the one-shot path writes -0.0 as +0.0).
Prints one line per check; exits non-zero on any failure."""

import os
import sys

import torch
import torch.distributed as dist

import klgen
from klgen import reference as definition  # the sampler's
from klgen.integrations import _gathers

failures = 0


def say(ok, what):
    global failures
    failures += 0 if ok else 1
    if dist.get_rank() == 0 or not ok:
        print(f"{'ok  ' if ok else 'FAIL'} rank {dist.get_rank()}: {what}", flush=True)


def canon(t):
    """The bits of t with the sign of zeros cleared."""
    bits = t.view({2: torch.int16, 4: torch.int32}[t.element_size()])
    return torch.where(t == 0, torch.zeros_like(bits), bits)


def reference(shard, tp, vocab):
    tokens, cols = shard.shape
    every = torch.empty((tp * tokens, cols), dtype=shard.dtype, device=shard.device)
    dist.all_gather_into_tensor(every, shard)
    return every.view(tp, tokens, cols).movedim(0, 1).reshape(tokens, tp * cols)[:, :vocab]


def data(tokens, cols, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((tokens, cols), generator=g, device="cuda").to(dtype)
    flat = x.view(-1)
    flat[:: 997] = float("nan")
    flat[1:: 991] = float("inf")
    flat[2:: 983] = float("-inf")
    flat[3:: 977] = -0.0
    return x


def same(a, b):
    return a.shape == b.shape and torch.equal(canon(a), canon(b))


def hostile(x, step, rank, shard, vocab):
    """Rows of kinds that break naive code (same kind on every rank for a row):
    all equal, ties across ranks, a tie across the padding boundary, NaN, +Inf,
    all -Inf, values that a soft-cap saturates, -0 against +0."""
    cols = torch.arange(shard, device=x.device) + rank * shard
    for t in range(x.shape[0]):
        kind = (step * 7 + t * 3) % 10
        row = x[t]
        a, b = (step * 7919 + t * 104729) % vocab, (step * 6007 + t * 3331) % vocab
        if kind == 1:
            row.fill_(1.5)
        elif kind == 2:
            row[(cols == a) | (cols == b) | (cols == (a + shard) % vocab)] = 50.0
        elif kind == 3:
            row[(cols == vocab - 1) | (cols == vocab - 1 - shard)] = 50.0
        elif kind == 4:
            row[(cols == a) | (cols == b)] = float("nan")
        elif kind == 5:
            row[(cols == a) | (cols == b)] = float("inf")
        elif kind == 6:
            row.fill_(float("-inf"))
        elif kind == 7:
            row.copy_(200 + 1000 * torch.rand(shard, device=x.device).to(x.dtype))
        elif kind == 8:
            row.copy_(-1 - row.abs())
            row[cols == a] = -0.0
            row[cols == b] = 0.0
        row[cols >= vocab] = float("nan") if t % 2 else float("inf")  # padding never counts
    return x


def select_reference(vals, k):
    """argmax, top-k and log-sum-exp of fp32 rows, computed plainly: NaN largest
    (the first one wins), ties to the lowest column, -0 == +0."""
    # torch.sort orders floats by their bits: NaNs of different payloads (a
    # planted NaN, a NaN that went through * 8) or zeros of different signs
    # would not tie. One NaN and one zero make them ties, as kl_topk has them.
    vals = torch.where(torch.isnan(vals), float("nan"), torch.where(vals == 0, 0.0, vals))
    idx = torch.arange(vals.shape[1], device=vals.device).expand_as(vals)
    big = vals.shape[1]
    nan = torch.isnan(vals)
    first_nan = torch.where(nan, idx, big).min(dim=1).values
    top = torch.where(nan, float("-inf"), vals).max(dim=1).values
    first_top = torch.where(vals == top[:, None], idx, big).min(dim=1).values
    argmax = torch.where(first_nan < big, first_nan, first_top)
    order = torch.sort(vals, dim=1, descending=True, stable=True)
    return argmax, order.values[:, :k], order.indices[:, :k], torch.logsumexp(vals.double(), dim=1)


def sampling(rank, tp, steps):
    """kl_argmax and kl_topk against select_reference on the gathered logits,
    over `steps` steps; every 10th step past max_tokens, so NCCL serves it."""
    cases = [
        dict(vocab_size=163840, dtype=torch.bfloat16, max_tokens=8, topk=8, name="kimi_sel"),
        dict(vocab_size=256000, dtype=torch.bfloat16, out_dtype="fp32", softcap=30.0, topk=8,
             max_tokens=8, noise="vllm", name="gemma_sel"),
        dict(vocab_size=151655, dtype=torch.float16, softcap=30.0, scale=0.5, numerics="fp32",
             topk=64, max_tokens=4, name="qwen_sel"),
        dict(vocab_size=50257, dtype=torch.float32, topk=5, max_tokens=4, noise="vllm",
             name="gpt2_sel"),
    ]
    for fields in cases:
        with klgen.LogitsGather(**fields) as g:
            bad = {"gather": 0, "argmax": 0, "topk": 0, "lse": 0, "sample": 0}
            plain = "softcap" not in fields and "scale" not in fields and "out_dtype" not in fields
            worst = 0.0
            over = 0
            n = steps if fields["name"] == "kimi_sel" else steps // 4
            for step in range(n):
                tokens = g.max_tokens + 3 if step % 10 == 7 else 1 + step % g.max_tokens
                over += tokens > g.max_tokens
                x = data(tokens, g.shard, g.dtype, 9000 + step * 2 + rank) * 8
                x = hostile(x, step, rank, g.shard, g.vocab_size)
                gathered = g(x)
                if plain:  # the gathered logits themselves, against torch's all-gather
                    ref = reference(x, tp, g.vocab_size)
                    if not same(gathered, ref):
                        bad["gather"] += 1
                        if bad["gather"] == 1:
                            i, j = (canon(gathered) != canon(ref)).nonzero()[0].tolist()
                            print(f"  {fields['name']} step {step} tokens {tokens}: gathered "
                                  f"[{i},{j}] {gathered[i, j].item()!r}, all-gather "
                                  f"{ref[i, j].item()!r}", flush=True)
                vals = gathered.float()
                index, value = g.argmax(x, values=True)
                top = g.topk(x)
                want_i, want_v, want_ti, lse = select_reference(vals, g.k)
                picked = vals.gather(1, want_i[:, None])[:, 0]
                bad["argmax"] += not (torch.equal(index, want_i) and same_f32(value, picked))
                ok_topk = torch.equal(top.indices, want_ti) and same_f32(top.values, want_v)
                bad["topk"] += not ok_topk
                if not ok_topk and bad["topk"] == 1:
                    t = int((top.indices != want_ti).any(dim=1).nonzero()[0])
                    print(f"  {fields['name']} step {step} tokens {tokens} row {t} (kind "
                          f"{(step * 7 + t * 3) % 10}): top-k {top.indices[t].tolist()} "
                          f"{top.values[t].tolist()}, want {want_ti[t].tolist()} "
                          f"{want_v[t].tolist()}", flush=True)
                if step % 8 == 0 or step % 10 == 7:  # and on every NCCL step
                    bad["sample"] += check_draws(g, x, gathered, step, tp)
                    # hostile rows mostly draw their NaN: finite ones draw by the filters
                    clean = x.nan_to_num(0.0, 0.0, 0.0)
                    bad["sample"] += check_draws(g, clean, g(clean), step + 1, tp)
                finite = torch.isfinite(lse)
                rel = ((top.lse.double() - lse).abs() / lse.abs().clamp(min=1.0))[finite]
                worst = max(worst, rel.max().item() if rel.numel() else 0.0)
                bad["lse"] += not (torch.equal(top.lse[~finite].double().nan_to_num(),
                                               lse[~finite].nan_to_num()) and
                                   (rel <= 1e-5).all().item())
            st = g.stats()
            say(not any(bad.values()) and st["nccl"] >= 3 * over and st["oneshot"] > 0,
                f"sampling {fields['name']}: {n} steps (every 10th via NCCL): mismatches {bad}, "
                f"lse worst {worst:.2g} relative; paths {st['oneshot']} one-shot, {st['nccl']} NCCL")


def draw_params(tokens, k, step, device):
    """Per-row sampling parameters, the same on every rank (a generator seeded by step)."""
    gen = torch.Generator().manual_seed(step)
    pick = lambda options: torch.tensor(options)[torch.randint(len(options), (tokens,),
                                                               generator=gen)]
    return dict(temperature=pick([0.0, 0.5, 1.0, 1.3]).to(device),
                top_k=pick([0, 1, 2, k]).to(device),
                top_p=pick([1.0, 0.9, 0.5, 1e-7]).to(device),
                min_p=pick([0.0, 0.0, 0.05, 1.0]).to(device),
                seed=torch.randint(-2**63, 2**63 - 1, (tokens,), generator=gen).to(device),
                offset=torch.randint(0, 2**40, (tokens,), generator=gen).to(device))


def draw_bitmask(tokens, vocab, step, device):
    """A grammar's bitmask, int32 [tokens, ceil(vocab / 32)], the same on
    every rank: by row, no grammar (all ones), nothing kept, a few columns,
    half of them, nearly all; the bits past the vocabulary random."""
    gen = torch.Generator().manual_seed(step + 5)
    words = (vocab + 31) // 32
    bits = torch.zeros((tokens, words * 32), dtype=torch.bool)
    for t in range(tokens):
        kind = (step + t) % 5
        if kind == 0:
            bits[t] = True
        elif kind == 2:
            bits[t, torch.randint(vocab, (int(torch.randint(1, 40, (1,), generator=gen)),),
                                  generator=gen)] = True
        elif kind in (3, 4):
            bits[t] = torch.rand(words * 32, generator=gen) < (0.5 if kind == 3 else 0.97)
        bits[t, vocab:] = torch.rand(words * 32 - vocab, generator=gen) < 0.5
    weights = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)
    packed = (bits.view(tokens, words, 32).long() * weights).sum(-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).int().to(device)


def draw_penalties(tokens, vocab, step, device):
    """vLLM's penalties, the same on every rank: by row none, repetition,
    frequency and presence alone and together, with prompts and output
    counts (a few columns, or a third of them; one count past float's
    integers now and then)."""
    gen = torch.Generator().manual_seed(step + 11)
    pick = lambda options: torch.tensor(options, dtype=torch.float32)[
        torch.randint(len(options), (tokens,), generator=gen)]
    rep = pick([1.0, 1.0, 0.5, 1.3, 2.0, 1e-3])
    freq = pick([0.0, 0.0, 0.1, -0.5, 2.0, -2.0])
    pres = pick([0.0, 0.0, 0.3, -1.0, 2.0])
    counts = torch.zeros((tokens, vocab), dtype=torch.int32)
    for t in range(tokens):
        if (step + t) % 3 == 1:
            at = torch.randint(vocab, (40,), generator=gen)
            counts[t].index_add_(0, at, torch.randint(1, 9, (40,), generator=gen, dtype=torch.int32))
        elif (step + t) % 3 == 2:
            counts[t] = torch.where(torch.rand(vocab, generator=gen) < 0.33,
                                    torch.randint(1, 4, (vocab,), generator=gen), 0).int()
    if step % 4 == 1:
        counts[0, step % vocab] = 20000001
    prompt = draw_bitmask(tokens, vocab, step + 17, "cpu")
    return dict(repetition_penalty=rep.to(device), frequency_penalty=freq.to(device),
                presence_penalty=pres.to(device), prompt_mask=prompt.to(device),
                output_counts=counts.to(device))


def draw_lists(tokens, vocab, step, device):
    """vLLM's other processors, the same on every rank: allowed ids, logit
    bias (repeated ids among them), min_tokens' stop ids (on for rows whose
    position + 1 is below min_len) and banned ids with padding; some rows
    with empty lists."""
    gen = torch.Generator().manual_seed(step + 23)
    ints = lambda hi, shape: torch.randint(hi, shape, generator=gen, dtype=torch.int32)
    few = min(vocab, 6)
    allowed_ids = torch.where(ints(2, (tokens, 8)) == 0, ints(few, (tokens, 8)),
                              ints(vocab, (tokens, 8)))
    bias_ids = torch.where(ints(2, (tokens, 12)) == 0, ints(few, (tokens, 12)),
                           ints(vocab, (tokens, 12)))
    values = torch.randn((tokens, 12), generator=gen) * 4
    values[:, 0] = torch.where(ints(2, (tokens,)) == 0, -100.0, 100.0)
    stop = ints(vocab, (tokens, 3))
    banned = torch.where(ints(3, (tokens, 4)) == 0, -1, ints(vocab, (tokens, 4)))
    counts = lambda width: torch.where(ints(3, (tokens,)) == 0, 0, ints(width + 1, (tokens,)))
    on = lambda t: t.to(device)
    return dict(allowed_token_ids=(on(counts(8) * (step % 2)), on(allowed_ids)),
                logit_bias=(on(counts(12)), on(bias_ids), on(values)),
                min_tokens=(on(ints(6, (tokens,))), on(counts(3)), on(stop), None),
                position=on(ints(5, (tokens,)).long()), banned=on(banned))


def as_tables(p, step):
    """p's per-row parameters as per-request tables of a few more entries
    (the rest garbage) that the rows read through state_rows, and their
    offsets as a table read through offset_rows."""
    gen = torch.Generator().manual_seed(step + 1)
    rows = p["temperature"].shape[0]
    device = p["temperature"].device
    out = {}
    for index, names in (("state_rows", ("temperature", "top_k", "top_p", "min_p", "seed")),
                         ("offset_rows", ("offset",))):
        at = torch.randperm(rows + 3, generator=gen)[:rows].to(device)
        out[index] = at
        for name in names:
            if name in p:
                table = torch.full((rows + 3,), -7, dtype=p[name].dtype, device=device)
                out[name] = table.index_copy(0, at, p[name])
    return out


def processed(g, x, gathered, kw, n, what):
    """g.sample with logits processors in kw against the definition: the
    tokens (with the logprob, the rank and n top-n, gathered; without, the
    shards' path), logprobs within 1e-5, ranks equal. True when they agree."""
    close = lambda a, b: torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6,
                                        equal_nan=True)
    got = g.sample(x, logprobs=n, ranks=True, **kw)
    want = definition.sample(gathered, logprobs=n, noise=g.noise, **kw)
    ok = (torch.equal(got.tokens, want.tokens) and close(got.logprobs, want.logprob) and
          torch.equal(got.ranks, want.rank))
    if n:
        ok = ok and (torch.equal(got.top_logprobs.indices, want.top_indices) and
                     close(got.top_logprobs.values, want.top_logprobs))
    quiet = g.sample(x, token_logprobs=False, **kw)  # the shards' path
    ok = ok and torch.equal(quiet.tokens, want.tokens)
    if not ok:
        print(f"  {g.name} {what}: {got.tokens.tolist()} {quiet.tokens.tolist()} "
              f"{got.logprobs.tolist()}, want {want.tokens.tolist()} {want.logprob.tolist()}",
              flush=True)
    return ok


def check_draws(g, x, gathered, step, tp):
    """g.sample against klgen.reference.sample on the gathered logits: tokens
    bit for bit (the definition's noise on CUDA is the kernel's, Philox's or
    vLLM's as the spec says), the same on
    every rank; logprobs within 1e-5; the top columns equal. Odd steps pass
    no filter and ask no top-n: kl_sample's shards draw them, nothing
    gathered (not counted in sample_gathered). 0 or 1 (bad)."""
    bare = step % 2 == 1
    n = 0 if bare else min(g.k, 4)
    p = draw_params(x.shape[0], g.k, step, x.device)
    if bare:
        p = {name: v for name, v in p.items() if name not in ("top_k", "top_p", "min_p")}
    n_gathered = g.stats()["sample_gathered"]
    got = g.sample(x, logprobs=n, **p)
    want = definition.sample(gathered, logprobs=n, noise=g.noise, **p)
    ranks = [torch.empty_like(got.tokens) for _ in range(tp)]
    dist.all_gather(ranks, got.tokens)
    close = lambda a, b: torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6,
                                        equal_nan=True)
    ok = (torch.equal(got.tokens, want.tokens) and all(torch.equal(r, got.tokens) for r in ranks)
          and close(got.logprobs, want.logprob) and
          g.stats()["sample_gathered"] == n_gathered + (not bare))
    if not bare:
        ok = ok and (torch.equal(got.top_logprobs.indices, want.top_indices) and
                     close(got.top_logprobs.values, want.top_logprobs))
        ranked = g.sample(x, logprobs=n, ranks=True, **p)
        ok = ok and torch.equal(ranked.tokens, got.tokens) and torch.equal(ranked.ranks, want.rank)
    else:  # without the tokens' logprobs: the same tokens, no logprobs
        quiet = g.sample(x, token_logprobs=False, **p)
        ok = ok and quiet.logprobs is None and torch.equal(quiet.tokens, got.tokens)
    # the logits themselves for the logprobs (vLLM's raw_logits), bit for bit
    lv = g.sample(x, logprobs=n, logprobs_mode="raw_logits", **p)
    want_lv = definition.sample(gathered, logprobs=n, noise=g.noise, logprobs_mode="raw_logits",
                                **p)
    ok = ok and torch.equal(lv.tokens, got.tokens) and same_f32(lv.logprobs, want_lv.logprob)
    if n:
        ok = ok and (torch.equal(lv.top_logprobs.indices, want_lv.top_indices) and
                     same_f32(lv.top_logprobs.values, want_lv.top_logprobs))
    if step % 3 == 0:  # the same parameters as tables, read through state_rows and offset_rows
        tabled = g.sample(x, logprobs=n, **as_tables(p, step))
        ok = ok and torch.equal(tabled.tokens, got.tokens) and same(tabled.logprobs, got.logprobs)
    if step % 3 != 0:  # a grammar's bitmask: the columns whose bit is clear -inf
        m = draw_bitmask(x.shape[0], g.vocab_size, step, x.device)
        masked = g.sample(x, logprobs=n, bitmask=m, **p)
        wm = definition.sample(gathered, logprobs=n, noise=g.noise, bitmask=m, **p)
        ok_m = torch.equal(masked.tokens, wm.tokens) and close(masked.logprobs, wm.logprob)
        if not bare:
            ok_m = ok_m and (torch.equal(masked.top_logprobs.indices, wm.top_indices) and
                             close(masked.top_logprobs.values, wm.top_logprobs))
        if not ok_m:
            print(f"  {g.name} step {step}: with a bitmask {masked.tokens.tolist()} "
                  f"{masked.logprobs.tolist()}, want {wm.tokens.tolist()} "
                  f"{wm.logprob.tolist()}", flush=True)
        ok = ok and ok_m
    if step % 3 != 1:  # vLLM's penalties (with a bitmask one step in three): the draws
        # read the penalized logits, the logprobs the raw ones
        pen = draw_penalties(x.shape[0], g.vocab_size, step, x.device)
        if step % 3 == 2:
            pen["bitmask"] = draw_bitmask(x.shape[0], g.vocab_size, step + 3, x.device)
        ok = processed(g, x, gathered, dict(p, **pen), n, f"step {step}: with penalties") and ok
    if step % 3 != 2:  # vLLM's lists (with penalties and a bitmask one step in three)
        lists = draw_lists(x.shape[0], g.vocab_size, step, x.device)
        if step % 3 == 0:
            lists.update(draw_penalties(x.shape[0], g.vocab_size, step + 5, x.device))
            lists["bitmask"] = draw_bitmask(x.shape[0], g.vocab_size, step + 7, x.device)
        ok = processed(g, x, gathered, dict(p, **lists), n, f"step {step}: with lists") and ok
    if step % 4 == 2:  # SGLang's forms: int32 top_k, 1 << 30 for off; one seed; row offsets
        forms = dict(p, top_k=torch.where(p["top_k"] == 0, 1 << 30, p["top_k"]).int(),
                     seed=step, offset=torch.arange(x.shape[0], device=x.device))
        engine = g.sample(x, token_logprobs=False, **forms)
        ok = ok and torch.equal(engine.tokens,
                                definition.sample(gathered, noise=g.noise, **forms).tokens)
    if not ok:
        print(f"  {g.name} step {step}: sample {got.tokens.tolist()} want "
              f"{want.tokens.tolist()}", flush=True)
    return int(not ok)


def sample_graph_and_compile(rank, tp):
    """g.sample in a CUDA graph (replays read new data and parameters) and
    under torch.compile(fullgraph=True), against the reference."""
    with klgen.LogitsGather(vocab_size=50257, dtype=torch.bfloat16, max_tokens=4, topk=8,
                            name="sample_graph") as g:
        tokens = 3
        x = torch.zeros((tokens, g.shard), dtype=g.dtype, device="cuda")
        p = draw_params(tokens, g.k, 1, "cuda")
        m = draw_bitmask(tokens, g.vocab_size, 1, "cuda")
        pen = draw_penalties(tokens, g.vocab_size, 1, "cuda")
        g.sample(x, logprobs=2, **p)  # eager first, as engines warm up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = g.sample(x, logprobs=2, ranks=True, **p)
            masked = g.sample(x, logprobs=2, bitmask=m, **p)
            penalized = g.sample(x, token_logprobs=False, **p, **pen)
        ok = True
        for step in range(5):
            # finite: a NaN row would draw its NaN whatever the parameters
            x.copy_((data(tokens, g.shard, g.dtype, 7100 + 10 * step + rank) * 8)
                    .nan_to_num(0.0, 0.0, 0.0))
            for k, v in draw_params(tokens, g.k, 100 + step, "cuda").items():
                p[k].copy_(v)
            m.copy_(draw_bitmask(tokens, g.vocab_size, 100 + step, "cuda"))
            for k, v in draw_penalties(tokens, g.vocab_size, 100 + step, "cuda").items():
                pen[k].copy_(v)
            graph.replay()
            gathered = reference(x, tp, g.vocab_size)
            want = definition.sample(gathered, logprobs=2, **p)
            ok &= torch.equal(out.tokens, want.tokens) and torch.equal(
                out.top_logprobs.indices, want.top_indices) and torch.equal(out.ranks, want.rank)
            want = definition.sample(gathered, logprobs=2, bitmask=m, **p)
            ok &= torch.equal(masked.tokens, want.tokens) and torch.equal(
                masked.top_logprobs.indices, want.top_indices)
            want = definition.sample(gathered, **p, **pen)
            ok &= torch.equal(penalized.tokens, want.tokens)
        say(ok, "sample: 5 replays of a captured draw, new data, parameters, bitmask and "
                "penalties each")

        def draw(x, t, s):
            return g.sample(x * 2, t, top_p=0.9, seed=s, token_logprobs=False).tokens

        def ranked(x, t, s):
            got = g.sample(x * 2, t, top_p=0.9, seed=s, token_logprobs=False, ranks=True)
            return torch.stack((got.tokens, got.ranks))

        compiled = torch.compile(draw, fullgraph=True)
        for tokens in (1, 4):
            x = data(tokens, g.shard, g.dtype, 9100 + tokens + rank).nan_to_num(0.0, 0.0, 0.0)
            t = torch.full((tokens,), 0.8, device="cuda")
            s = torch.arange(tokens, device="cuda")
            say(torch.equal(compiled(x, t, s), draw(x, t, s)),
                f"sample under torch.compile(fullgraph=True), tokens {tokens}")
            say(torch.equal(torch.compile(ranked, fullgraph=True)(x, t, s), ranked(x, t, s)),
                f"sample with ranks under torch.compile(fullgraph=True), tokens {tokens}")


def same_f32(a, b):
    """fp32 values equal bit for bit, zeros of either sign alike, any NaN alike."""
    return a.shape == b.shape and bool(((canon(a) == canon(b)) |
                                        (torch.isnan(a) & torch.isnan(b))).all())


def integration_specs(rank):
    """The specs the engine drop-ins make (klgen.integrations), on klgen against
    TorchGather, the torch implementation of the contract that the real-engine
    tests run on without a GPU (tests/python/test_vllm.py, test_sglang.py):
    vLLM and SGLang cannot be installed on the GPU machines, so this is what
    ties those tests to the kernels. Both paths (past max_tokens: NCCL)."""
    # vLLM: forward's, the unsliced gather's, a soft-capped head's with top-k, a
    # scaled fp16 one's; SGLang: the fp32 upcast, deferred_argmax's (fp32, capped)
    cases = [
        dict(vocab_size=50257, padded_vocab=50304, dtype=torch.bfloat16),
        dict(vocab_size=50304, padded_vocab=50304, dtype=torch.bfloat16),
        dict(vocab_size=50257, padded_vocab=50304, dtype=torch.bfloat16, softcap=30.0, topk=5),
        dict(vocab_size=32000, padded_vocab=32000, dtype=torch.float16, softcap=50.0,
             scale=0.75, topk=8),
        dict(vocab_size=50257, padded_vocab=50304, dtype=torch.bfloat16, out_dtype=torch.float32),
        dict(vocab_size=151655, padded_vocab=151680, dtype=torch.float32, softcap=30.0),
    ]
    for i, fields in enumerate(cases):
        ours, torch_ = (_gathers.new_gather(backend, name=f"integration{i}", max_tokens=4,
                                            **fields)
                        for backend in ("klgen", "torch"))
        bad = 0
        for tokens in (1, 3, 4, 7):
            x = hostile(data(tokens, ours.shard, ours.dtype, 800 + 10 * i + tokens + rank) * 8,
                        tokens, rank, ours.shard, ours.vocab_size)
            ok = same(ours(x), torch_(x))
            ok &= torch.equal(ours.argmax(x), torch_.argmax(x))
            if ours.k:
                got, want = ours.topk(x), torch_.topk(x)
                ok &= torch.equal(got.indices, want.indices) and same_f32(got.values, want.values)
                finite = torch.isfinite(want.lse)
                ok &= torch.allclose(got.lse[finite], want.lse[finite], rtol=1e-5, atol=1e-5)
                ok &= torch.equal(got.lse[~finite].nan_to_num(), want.lse[~finite].nan_to_num())
            bad += not ok
        st = ours.stats()
        say(bad == 0 and st["nccl"] > 0 and st["oneshot"] > 0,
            f"integration spec {i} ({fields}): klgen == TorchGather, {bad} bad steps; paths "
            f"{st['oneshot']} one-shot, {st['nccl']} NCCL")
        ours.close()


def main():
    dist.init_process_group("nccl")
    rank, tp = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    # three at once, each dtype, one with an odd vocabulary (padding sliced off)
    gathers = [
        klgen.LogitsGather(vocab_size=163840, dtype=torch.bfloat16, max_tokens=8, name="kimi"),
        klgen.LogitsGather(vocab_size=50257, dtype=torch.float16, max_tokens=8, name="gpt2"),
        klgen.LogitsGather(vocab_size=152064, dtype="fp32", max_tokens=4, name="qwen"),
    ]
    seed = 1000 * rank
    for g in gathers:
        say(g.stats()["oneshot_ready"], f"{g.name}: one-shot ready ({g.stats()['not_ready']})")
        for tokens in range(1, g.max_tokens + 5):  # past max_tokens: the NCCL fallback
            seed += 1
            x = data(tokens, g.shard, g.dtype, seed)
            ref = reference(x, tp, g.vocab_size)
            got = g(x)
            out = torch.full_like(ref, 7.0)
            g(x, out=out)
            say(same(got, ref) and same(out, ref), f"{g.name} {g.dtype} eager tokens {tokens}")
        st = g.stats()
        say(st["nccl"] == 2 * 4 and st["declined"]["tokens"] == 8,
            f"{g.name}: fallback past max_tokens: {st}")
    # an existing communicator for the fallback (here the first gather's own)
    with klgen.LogitsGather(vocab_size=163840, dtype=torch.bfloat16, max_tokens=2, name="given",
                            nccl_comm=gathers[0]._own_comm.value) as given:
        x = data(5, given.shard, given.dtype, 555 + rank)  # past max_tokens: NCCL
        say(same(given(x), reference(x, tp, given.vocab_size)) and given.stats()["nccl"] == 1 and
            given._own_comm is None, "fallback on a given ncclComm_t")
    # strided input: copied first, same result
    g = gathers[0]
    wide = data(3, 2 * g.shard, g.dtype, 77 + rank)
    strided = wide[:, ::2]
    say(same(g(strided), reference(strided.contiguous(), tp, g.vocab_size)), "strided shard")
    # inside a CUDA graph: captured once, replayed with new data
    for g in gathers:
        tokens = 3
        static_in = torch.zeros((tokens, g.shard), dtype=g.dtype, device="cuda")
        g(static_in)  # an eager step first, as engines warm up before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = g(static_in)
        ok = True
        for step in range(5):
            static_in.copy_(data(tokens, g.shard, g.dtype, 5000 + 10 * step + rank))
            graph.replay()
            torch.cuda.synchronize()
            ok &= same(static_out, reference(static_in, tp, g.vocab_size))
        say(ok, f"{g.name}: 5 replays of a captured gather")
    # torch.compile(fullgraph=True)
    g = gathers[1]

    def step(x):
        return g(x * 2)

    compiled = torch.compile(step, fullgraph=True)
    for tokens in (1, 5, 12):
        x = data(tokens, g.shard, g.dtype, 9000 + tokens + rank).nan_to_num(0.0, 0.0, 0.0)
        say(same(compiled(x), step(x)), f"torch.compile(fullgraph=True), tokens {tokens}")
    # epilogues: against the engine's separate torch ops on the gathered logits
    # ("engine"), or the same formula in fp32 rounded once ("fp32"), on both paths
    def as_f32(v):
        return torch.tensor(v, dtype=torch.float32).item()

    def engine(ref, cap, scale, out_dtype):
        x = ref
        if cap:
            x = x / cap
            x = torch.tanh(x)
            x = x * cap
        if scale != 1:
            x = x * scale
        return x.to(out_dtype)

    def fp32(ref, cap, scale, out_dtype):
        x = ref.float()
        if cap:
            inv = (torch.tensor(1.0) / torch.tensor(cap, dtype=torch.float32)).item()
            x = torch.tanh(x * inv) * as_f32(cap)
        if scale != 1:
            x = x * as_f32(scale)
        return x.to(out_dtype)

    cases = [
        (dict(vocab_size=163840, dtype=torch.bfloat16, out_dtype=torch.float32, softcap=30.0,
              max_tokens=8, name="gemma"), engine, 30.0, 1.0),
        (dict(vocab_size=50257, dtype=torch.float16, softcap=50.0, scale=0.5, numerics="fp32",
              max_tokens=8, name="capfp32"), fp32, 50.0, 0.5),
        (dict(vocab_size=152064, dtype=torch.float32, scale=1.25, max_tokens=4, name="scaled"),
         engine, 0, 1.25),
        (dict(vocab_size=50257, dtype=torch.bfloat16, out_dtype=torch.float32, max_tokens=4,
              name="upcast"), engine, 0, 1.0),
        (dict(vocab_size=50257, dtype=torch.bfloat16, softcap=30.0, scale=2.0, max_tokens=4,
              name="capscale"), engine, 30.0, 2.0),
        (dict(vocab_size=65536, dtype=torch.float16, out_dtype="fp32", softcap=30.0,
              numerics="fp32", max_tokens=4, name="f16up"), fp32, 30.0, 1.0),
    ]
    for fields, fn, cap, scale in cases:
        with klgen.LogitsGather(**fields) as e:
            bad = 0
            for tokens in (1, 3, e.max_tokens, e.max_tokens + 3):  # one-shot, then NCCL
                x = data(tokens, e.shard, e.dtype, 700 + tokens + 17 * rank) * 40
                gathered = reference(x, tp, e.vocab_size)
                ref = fn(gathered, cap, scale, e.out_dtype)
                got = e(x)
                if got.dtype != e.out_dtype or not same(got, ref):
                    bad += 1
                    diff = (canon(got) != canon(ref)).nonzero()
                    if len(diff):
                        i, j = diff[0].tolist()
                        print(f"  {fields['name']} tokens {tokens}: {len(diff)} differ, first "
                              f"[{i},{j}] got {got[i, j].item()!r} want {ref[i, j].item()!r} "
                              f"from {gathered[i, j].item()!r}", flush=True)
            st = e.stats()
            say(bad == 0 and st["nccl"] == 1 and st["oneshot"] == 3,
                f"epilogue {fields['name']} ({fn.__name__}): one-shot and NCCL path, {bad} bad")
    sampling(rank, tp, int(os.environ.get("KLGEN_TEST_STEPS", "2000")))
    sample_graph_and_compile(rank, tp)
    integration_specs(rank)
    # wrong tensors: a clean error, raised before anything collective
    g = gathers[0]
    bad = [
        (TypeError, "dtype", lambda: g(torch.zeros((1, g.shard), dtype=torch.float32, device="cuda"))),
        (ValueError, "shape", lambda: g(torch.zeros((1, g.shard + 1), dtype=g.dtype, device="cuda"))),
        (ValueError, "is on cpu", lambda: g(torch.zeros((1, g.shard), dtype=g.dtype))),
        (TypeError, "torch.Tensor", lambda: g([1, 2, 3])),
        (ValueError, "out has shape", lambda: g(torch.zeros((2, g.shard), dtype=g.dtype, device="cuda"),
                                                 out=torch.empty((1, g.vocab_size), dtype=g.dtype, device="cuda"))),
    ]
    for exc, part, call in bad:
        try:
            call()
            say(False, f"wrong tensor ({part}) accepted")
        except exc as e:
            say(part in str(e), f"wrong tensor -> {type(e).__name__}: {e}")
    # one rank passes a wrong tensor, the other a right one: the wrong one gets
    # its error at once, the right one's step times out and status() names the peer
    if tp > 1:
        with klgen.LogitsGather(vocab_size=4096, dtype=torch.bfloat16, max_tokens=2, timeout_ms=300,
                                name="lonely") as lone:
            x = torch.zeros((1, lone.shard), dtype=torch.bfloat16, device="cuda")
            if rank == 1:
                try:
                    lone(x.float())
                    say(False, "rank 1's wrong tensor accepted")
                except TypeError:
                    say(True, "rank 1: wrong tensor refused")
            else:
                lone(x)
                torch.cuda.synchronize()
                try:
                    lone.status()
                    say(False, "rank 0: no time-out reported")
                except klgen.DeviceError as e:
                    say("waiting for rank 1" in str(e), f"rank 0: {e}")
            dist.barrier()
    for g in gathers:
        g.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"{'FAIL' if failures else 'ok'}: tp{tp} checks done, {failures} failure(s) on rank 0",
              flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
