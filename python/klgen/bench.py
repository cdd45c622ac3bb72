"""python -m klgen.bench SPEC: klgen's Python API against vLLM's stock logits gather.

One process per GPU (spawned here, or under torchrun). For each token count,
every path is captured `--steps` deep in a CUDA graph per rank; the graphs are
replayed in turn (rotating which goes first), the ranks together; CUDA events
time each replay; a path's figure is the median over replays, the max over
ranks (docs/BENCHMARKS.md, "Method"). Paths:

  vllm    vLLM's stock path: NCCL all-gather into [tp * tokens, shard] (through
          NCCL directly, as vLLM's PyNccl does under graphs), the movedim/reshape
          copy to [tokens, tp * shard], and the [..., :vocab_size] slice
  klgen   klgen.LogitsGather through the custom op (torch's current stream)
  raw     kl_gather called directly through ctypes into a preallocated output:
          what the C benchmark times; klgen - raw is what the Python API adds

Then the eager host cost of one klgen call (no graph), in microseconds. A spec
for more ranks than GPUs is measured at its per-rank shard on the GPUs present.

--select measures instead, the same way, the fused epilogue and the sampling-
ready gathers against the engines' torch ops:

  plain          LogitsGather, no epilogue
  fused          LogitsGather with out_dtype fp32 and softcap 30 (engine numerics)
  plain+ops      plain, then vLLM's soft-cap ops: / 30, tanh, * 30, .float()
  argmax         LogitsGather.argmax
  gather+argmax  plain, then torch.argmax
  NCCL pairs     torch.max of the shard, the (value, index) pairs through one
                 all_gather_into_tensor, the final argmax across ranks
  top-k          LogitsGather.topk (--topk, default 8), with the log-sum-exp

--sample measures LogitsGather.sample against the gather and vLLM's torch
sampler after it (its PyTorch path: temperature, the top-k/top-p sort mask,
softmax, an exponential race), with T = 0.7, top_k = 50, top_p = 0.9 and with
plain temperature, and greedy against NCCL pairs; each klgen draw is first
checked against klgen.reference.sample on the gathered logits.

--grid (no SPEC) measures klbench --grid's grid in one process on GPU 0, tp 1:
the same specs and kernels (gather, fused, argmax, topk8, topk64, greedy,
plain, filtered, minp) over widths x dtypes x tokens, through klgen's Python
API, beside what an engine runs in torch on the same rows (a copy for the
gather at tp 1; the soft-cap ops; torch.argmax and NCCL pairs; torch.topk;
vLLM's torch sampler, with min-p as vLLM applies it) and, with --flashinfer
LIB, FlashInfer's kernels through libkl_flashinfer (bench/flashinfer.sh) on
the same tensors. Each cell is checked first (klgen against torch and
klgen.reference), then timed as above, a graph holding at most --steps steps
and about 20 ms of its slowest variant. --csv writes a row a kernel and cell
in klbench --grid's columns where they overlap; bench/grid_table.py takes
both files.
"""

import argparse
import ctypes
import math
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ModuleNotFoundError as e:  # the benchmark is of the PyTorch part
    from klgen import _torch_missing
    if __name__ == "__main__":
        sys.exit(str(_torch_missing("python -m klgen.bench", e)))
    raise _torch_missing("klgen.bench", e) from None

import klgen
from klgen import _capi, _libs

PATHS = ("vllm", "klgen", "raw")


GRID_KERNELS = ("gather", "fused", "argmax", "topk8", "topk64", "greedy", "plain", "filtered",
                "minp")
GRID_WIDTHS = (20480, 64128, 163840, 262144)
GRID_TOKENS = "1,2,4,8,16,32,64,128,256,512"
QUICK = dict(widths=(20480, 163840), dtypes=("bf16",), tokens="1,8,64,256")


def _list(p, opt, text, ok, what):
    items = text.split(",")
    if any(not i or not ok(i) for i in items) or len(set(items)) != len(items):
        p.error(f"{opt}: expected {what}")
    return items


def _width(w):
    return w.isdigit() and 1024 <= int(w) <= 1 << 21 and int(w) % 8 == 0


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m klgen.bench", description=__doc__.split("\n")[0])
    p.add_argument("spec", nargs="?",
                   help="a spec file, or the stem of a shipped one (kimi_k3_tp8); none with --grid")
    p.add_argument("name", nargs="?", help="which spec of a file that defines several")
    p.add_argument("--tokens", default=None,
                   help="token counts, e.g. 1,8,64 (default 1..256 by powers of two; --grid: "
                        "1..512; --grid --quick: 1,8,64,256)")
    p.add_argument("--steps", type=int, default=200,
                   help="steps per captured graph (--grid: at most)")
    p.add_argument("--replays", type=int, default=None, help="replays timed (default 7; --grid: 5)")
    p.add_argument("--host-calls", type=int, default=2000, help="eager calls timed on the host")
    p.add_argument("--select", action="store_true",
                   help="the fused epilogue, argmax and top-k against torch ops instead")
    p.add_argument("--topk", type=int, default=8, help="k for --select")
    p.add_argument("--sample", action="store_true",
                   help="LogitsGather.sample against the gather and vLLM's torch sampler instead")
    p.add_argument("--grid", action="store_true",
                   help="every kernel at every size on GPU 0 against torch and FlashInfer instead")
    p.add_argument("--quick", action="store_true",
                   help="--grid's smoke subset: widths 20480,163840, bf16, tokens 1,8,64,256")
    p.add_argument("--widths", help="--grid's row widths, multiples of 8 from 1024 to 2097152 "
                                    "(default 20480,64128,163840,262144)")
    p.add_argument("--dtypes", help="--grid's dtypes: bf16, fp32 or bf16,fp32 (default both)")
    p.add_argument("--kernels", help="--grid's kernels, some of " + ",".join(GRID_KERNELS))
    p.add_argument("--flashinfer", metavar="LIB",
                   help="--grid: libkl_flashinfer.so, for FlashInfer's columns (default: none)")
    p.add_argument("--csv", metavar="FILE", help="--grid: the cells as CSV too")
    a = p.parse_args(argv)
    grid_only = [o for o in ("quick", "widths", "dtypes", "kernels", "flashinfer", "csv")
                 if getattr(a, o)]
    if a.grid:
        if a.spec or a.select or a.sample:
            p.error("--grid makes its own specs: give no SPEC, --select or --sample")
        a.widths = [int(w) for w in _list(p, "--widths", a.widths, _width,
                                          "distinct multiples of 8 from 1024 to 2097152")] \
            if a.widths else list(QUICK["widths"] if a.quick else GRID_WIDTHS)
        a.dtypes = _list(p, "--dtypes", a.dtypes, lambda d: d in ("bf16", "fp32"),
                         "bf16, fp32 or bf16,fp32") if a.dtypes else \
            list(QUICK["dtypes"] if a.quick else ("bf16", "fp32"))
        a.kernels = _list(p, "--kernels", a.kernels, lambda k: k in GRID_KERNELS,
                          "distinct names of " + ", ".join(GRID_KERNELS)) if a.kernels else \
            list(GRID_KERNELS)
        if a.flashinfer == "none":
            a.flashinfer = None
        if a.flashinfer and not os.access(a.flashinfer, os.R_OK):
            p.error(f"--flashinfer: cannot read {a.flashinfer}")
        a.tokens = a.tokens or (QUICK["tokens"] if a.quick else GRID_TOKENS)
        a.replays = a.replays or 5
    else:
        if grid_only:
            p.error(f"--{grid_only[0]} goes with --grid")
        if not a.spec:
            p.error("a SPEC is needed (or --grid)")
        if not os.path.exists(a.spec):
            a.spec = klgen.spec_path(a.spec)
        a.tokens = a.tokens or "1,2,4,8,16,32,64,128,256"
        a.replays = a.replays or 7
    try:
        a.tokens = sorted({int(t) for t in a.tokens.split(",")})
    except ValueError:
        p.error("--tokens: expected a list like 1,8,64")
    if a.steps < 1 or a.replays < 1 or min(a.tokens) < 1 or (a.grid and max(a.tokens) > 65535):
        p.error("--steps, --replays and every token count must be at least 1 "
                "(--grid: tokens up to 65535)")
    return a


def _stock(nccl, comm, x, every, tp, vocab, stream):
    """vLLM's path: all-gather along dim 0, ranks' blocks moved next to the
    columns (a copy), then the slice to the org vocabulary (a view)."""
    r = nccl.ncclAllGather(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(every.data_ptr()),
                           ctypes.c_size_t(x.numel() * x.element_size()), 0, comm,
                           ctypes.c_void_p(stream))
    if r != 0:
        raise RuntimeError(f"ncclAllGather: {nccl.ncclGetErrorString(r).decode()}")
    tokens, cols = x.shape
    return every.view(tp, tokens, cols).movedim(0, 1).reshape(tokens, tp * cols)[..., :vocab]


def _unsigned_zero(t):
    """t with -0.0 as +0.0 (the one-shot path writes it so), as a contiguous copy."""
    return torch.where(t == 0, torch.zeros_like(t), t).contiguous()


def _graphs(fns, steps):
    graphs = []
    for fn in fns:
        fn()  # eager first, as engines warm up before capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(steps):
                fn()
        graphs.append(g)
    return graphs


def _time(graphs, steps, replays):
    """Median µs per step of each graph, replayed in turn (rotating), ranks together."""
    times = [[] for _ in graphs]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(replays):
        for k in range(len(graphs)):
            i = (k + r) % len(graphs)
            torch.cuda.synchronize()
            dist.barrier()
            e0.record()
            graphs[i].replay()
            e1.record()
            e1.synchronize()
            times[i].append(e0.elapsed_time(e1) * 1000.0 / steps)
    return [statistics.median(t) for t in times]


def _worst(values):
    t = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed(fns, a, steps=None):
    """µs per step of each fn: captured (steps deep, default --steps), replayed
    in turn, the max over ranks."""
    steps = steps or a.steps
    graphs = _graphs(fns, steps)
    return _worst(_time(graphs, steps, a.replays))


def _header(mode, info, tp, a, what):
    """What was measured, where, and how: the lines above a table."""
    return (f"klgen.bench {mode}: {info.name} shard ({info.shard} columns, {info.dtype}) at tp {tp} "
            f"on {torch.cuda.get_device_name()}, torch {torch.__version__}; {what}\n"
            f"method: each variant captured {a.steps} steps deep in a CUDA graph per rank, "
            f"replayed in turn, median of {a.replays} replays, max over ranks; us per step\n")


SELECT = ("plain", "fused", "plain+ops", "argmax", "gather+argmax", "NCCL pairs", "top-k")


def _pairs_argmax(x, offset, valid, every):
    """The engines' greedy across ranks: each rank's (value, index), packed in
    an int64, all-gathered, then the best rank's index (ties: lowest rank)."""
    v, i = x[:, :valid].max(dim=1)
    mine = torch.stack([v.float().view(torch.int32), (i + offset).to(torch.int32)], dim=1)
    dist.all_gather_into_tensor(every, mine.view(torch.int64)[:, 0])
    pairs = every.view(-1, x.shape[0], 1).view(torch.int32)
    best = pairs[..., 0].view(torch.float32).argmax(dim=0)
    return pairs[..., 1].gather(0, best[None])[0].long()


def _select_main(rank, tp, a, info, dtype):
    vocab, padded = (info.shard * tp, info.shard * tp) if info.tp != tp else (info.vocab_size,
                                                                              info.shard * tp)
    common = dict(vocab_size=vocab, padded_vocab=padded, dtype=dtype, max_tokens=max(a.tokens))
    g = klgen.LogitsGather(name="plain", topk=a.topk, **common)
    ge = klgen.LogitsGather(name="fused", out_dtype="fp32", softcap=30.0, **common)
    offset, valid = rank * info.shard, min(info.shard, vocab - rank * info.shard)
    rows = []
    for T in a.tokens:
        x = (torch.randn((T, info.shard), device="cuda") * 4).to(dtype)
        every = torch.empty((tp * T,), dtype=torch.int64, device="cuda")

        def ops():
            y = g(x)
            return (torch.tanh(y / 30.0) * 30.0).float()

        want = torch.argmax(g(x), dim=1)
        same = [torch.equal(ge(x), ops()), torch.equal(g.argmax(x), want),
                torch.equal(_pairs_argmax(x, offset, valid, every), want),
                torch.equal(g.topk(x).indices[:, 0], want)]
        if not all(same):
            raise SystemExit(f"klgen.bench: rank {rank}: results differ at {T} tokens: {same}")
        fns = [lambda: g(x), lambda: ge(x), ops, lambda: g.argmax(x),
               lambda: torch.argmax(g(x), dim=1), lambda: _pairs_argmax(x, offset, valid, every),
               lambda: g.topk(x)]
        rows.append((T, *_timed(fns, a)))
    if rank == 0:
        print(_header("--select", info, tp, a, f"soft-cap 30, fp32 out; top-{a.topk}"))
        print(f"{'tokens':<8}" + "".join(f"{n:>15}" for n in SELECT) +
              f"{'fused x':>9}{'x g+argmax':>12}{'x pairs':>9}")
        for T, *t in rows:
            print(f"{T:<8}" + "".join(f"{v:>15.2f}" for v in t) +
                  f"{t[2] / t[1]:>8.2f}x{t[4] / t[3]:>11.2f}x{t[5] / t[3]:>8.2f}x")
    g.close()
    ge.close()


SAMPLE = ("sample", "gather+torch", "sample T", "gather+torch T", "sample T=0", "NCCL pairs")


def _torch_sampler(logits, t, k, p, min_p=None):
    """vLLM's sampler on gathered logits, its PyTorch path (no FlashInfer):
    temperature, min-p (columns whose probability is below min_p times the
    row's largest masked), the top-k and top-p mask by an ascending sort,
    softmax, and the exponential race (probs / Exp(1), argmax)."""
    x = logits.float() / t
    if min_p is not None:
        probs = x.softmax(dim=-1)
        keep = probs >= min_p[:, None] * probs.amax(dim=-1, keepdim=True)
        x = x.masked_fill(~keep, -float("inf"))
    if k is not None or p is not None:
        x_sort, x_idx = x.sort(dim=-1, descending=False)
        if k is not None:
            cut = x_sort.gather(-1, (x_sort.shape[-1] - k.long()).clamp(min=0)[:, None])
            x_sort.masked_fill_(x_sort < cut, -float("inf"))
        if p is not None:
            cum = x_sort.softmax(dim=-1).cumsum(dim=-1)
            mask = cum <= 1 - p[:, None]
            mask[:, -1] = False
            x_sort.masked_fill_(mask, -float("inf"))
        x = x_sort.scatter(-1, x_idx, x_sort)
    probs = x.softmax(dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div(q).argmax(dim=-1)


def _sample_main(rank, tp, a, info, dtype):
    from klgen import reference
    vocab, padded = (info.shard * tp, info.shard * tp) if info.tp != tp else (info.vocab_size,
                                                                              info.shard * tp)
    g = klgen.LogitsGather(name="sample", vocab_size=vocab, padded_vocab=padded, dtype=dtype,
                           max_tokens=max(a.tokens), topk=64)
    offset, valid = rank * info.shard, min(info.shard, vocab - rank * info.shard)
    rows = []
    for T in a.tokens:
        x = (torch.randn((T, info.shard), device="cuda") * 4).to(dtype)
        every = torch.empty((tp * T,), dtype=torch.int64, device="cuda")
        temp = torch.full((T,), 0.7, device="cuda")
        k = torch.full((T,), 50, dtype=torch.int32, device="cuda")
        p = torch.full((T,), 0.9, device="cuda")
        zero = torch.zeros((T,), device="cuda")
        seed = torch.arange(T, device="cuda") + 1000
        for kw in (dict(top_k=k, top_p=p), dict()):
            want = reference.sample(g(x), temp, seed=seed, **kw).tokens
            if not torch.equal(g.sample(x, temp, seed=seed, **kw).tokens, want):
                raise SystemExit(f"klgen.bench: rank {rank}: sample differs from the reference "
                                 f"at {T} tokens ({kw and 'top-k, top-p' or 'temperature'})")
        fns = [lambda: g.sample(x, temp, k, p, seed=seed, token_logprobs=False),
               lambda: _torch_sampler(g(x), temp[:, None], k, p),
               lambda: g.sample(x, temp, seed=seed, token_logprobs=False),
               lambda: _torch_sampler(g(x), temp[:, None], None, None),
               lambda: g.sample(x, zero, seed=seed, token_logprobs=False),
               lambda: _pairs_argmax(x, offset, valid, every)]
        rows.append((T, *_timed(fns, a)))
    if rank == 0:
        print(_header("--sample", info, tp, a, "T 0.7, top_k 50, top_p 0.9; and T 0.7 alone"))
        print(f"{'tokens':<8}" + "".join(f"{n:>16}" for n in SAMPLE) + f"{'x torch':>9}{'x T':>7}")
        for T, *t in rows:
            print(f"{T:<8}" + "".join(f"{v:>16.2f}" for v in t) +
                  f"{t[1] / t[0]:>8.1f}x{t[3] / t[2]:>6.1f}x")
    g.close()


def _rank_main(rank, world, a):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    info = klgen.spec_info(a.spec, a.name)
    if a.select or a.sample:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[info.dtype]
        (_sample_main if a.sample else _select_main)(rank, world, a, info, dtype)
        dist.barrier()
        dist.destroy_process_group()
        return
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[info.dtype]
    tp = world
    # this rank's shard as the spec has it, at the group size present
    vocab = info.shard * tp if info.tp != tp else info.vocab_size
    padded = info.shard * tp
    g = klgen.LogitsGather(vocab_size=vocab, padded_vocab=padded, dtype=dtype,
                           max_tokens=max(max(a.tokens), info.max_tokens), name=info.name)
    nccl = _libs.nccl()
    nccl.ncclAllGather.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p]
    comm = g._own_comm
    # warm-up: clocks up and every kernel loaded before the first size is timed
    x = torch.randn((a.tokens[0], info.shard), device="cuda").to(dtype)
    every = torch.empty((tp * a.tokens[0], info.shard), dtype=dtype, device="cuda")
    for _ in range(2000):
        g(x)
        _stock(nccl, comm, x, every, tp, vocab, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    rows = []
    for T in a.tokens:
        x = torch.randn((T, info.shard), device="cuda").to(dtype)
        every = torch.empty((tp * T, info.shard), dtype=dtype, device="cuda")
        out = torch.empty((T, vocab), dtype=dtype, device="cuda")
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        ref = _stock(nccl, comm, x, every, tp, vocab, stream())
        if not torch.equal(_unsigned_zero(g(x)), _unsigned_zero(ref)):
            raise SystemExit(f"klgen.bench: rank {rank}: klgen and the stock path differ at {T} tokens")
        fns = [lambda: _stock(nccl, comm, x, every, tp, vocab, stream()),
               lambda: g(x),
               lambda: _capi.check(_capi.lib.kl_gather(g._ctx, x.data_ptr(), out.data_ptr(), T,
                                                       stream()))]
        graphs = _graphs(fns, a.steps)
        times = _worst(_time(graphs, a.steps, a.replays))
        del graphs
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.host_calls):
            g(x)
        host = (time.perf_counter() - t0) * 1e6 / a.host_calls
        torch.cuda.synchronize()
        host = _worst([host])[0]
        rows.append((T, T * info.shard * x.element_size(), *times, host))
    if rank == 0:
        _report(a, info, tp, rows, g.stats())
    g.close()
    dist.barrier()
    dist.destroy_process_group()


def _report(a, info, tp, rows, stats):
    print(f"klgen.bench: {info.name} ({info.vocab_size} vocab, tp {info.tp}, {info.dtype}, "
          f"{info.shard * (2 if info.dtype != 'fp32' else 4)} B per rank per token) on {tp} x "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, klgen {klgen.__version__}")
    if info.tp != tp:
        print(f"note: the spec is for tp {info.tp}; measured its per-rank shard at tp {tp}")
    print(f"method: each path captured {a.steps} steps deep in a CUDA graph per rank, replayed "
          f"in turn, median of {a.replays} replays, max over ranks; host: {a.host_calls} eager "
          f"calls, no graph")
    print()
    print(f"{'tokens':<8}{'bytes/rank':>12}{'vLLM stock':>12}{'klgen':>10}{'raw C':>10}"
          f"{'klgen-raw':>11}{'speedup':>9}{'host/call':>11}")
    print(f"{'':<8}{'':>12}{'us':>12}{'us':>10}{'us':>10}{'us':>11}{'':>9}{'us':>11}")
    for T, nbytes, stock, kl, raw, host in rows:
        size = f"{nbytes / 1024:.0f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.2f} MiB"
        print(f"{T:<8}{size:>12}{stock:>12.2f}{kl:>10.2f}{raw:>10.2f}{kl - raw:>11.2f}"
              f"{stock / kl:>8.2f}x{host:>11.1f}")
    print(f"\nklgen path counts on rank 0: one-shot {stats['oneshot']}, NCCL {stats['nccl']}")


# ---- --grid: klbench --grid's cells through the Python API, beside torch and FlashInfer ----

GRAPH_US = 20000.0  # a graph of the slowest variant in a cell
MIN_STEPS = 5
_GRID_EXTRA = {"k8": "topk = 8", "k64": "topk = 64",
               "epi": "out_dtype = 'fp32', softcap = 30.0, numerics = 'engine'"}
_GRID_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _grid_source(width, dtype, kind, max_tokens):
    """The spec klbench --grid makes (bench/grid.c, make_spec), to the
    character: the same source, so the same kernels and JIT cache entries."""
    return (f"return {{ name = 'grid_w{width}_{dtype}_{kind}', vocab_size = {width}, "
            f"padded_vocab = {width}, tp = 1, dtype = '{dtype}', max_tokens = {max_tokens}, "
            f"{_GRID_EXTRA[kind]} }}")


def _grid_spec(width, dtype, kind, want):
    """The spec with max_tokens the most rows up to want its one-shot buffers
    hold, as klbench --grid finds it."""
    def fits(m):
        try:
            klgen.spec_info(source=_grid_source(width, dtype, kind, m))
            return True
        except klgen.Error:
            return False
    lo, hi = 1, want
    if fits(want):
        lo = want
    else:
        klgen.spec_info(source=_grid_source(width, dtype, kind, 1))  # raises what is wrong
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return _grid_source(width, dtype, kind, lo)


def _compile_one(source):
    """In a process of its own: a spec's kernels into the JIT cache (a
    LogitsGather made and closed). True if they were there already."""
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        g = klgen.LogitsGather(source)
        hit = g.stats()["cache_hit"]
        g.close()
    finally:
        dist.destroy_process_group()
    return hit


def _precompile(sources):
    """Every spec's kernels at once, a process each (NVRTC takes seconds a
    spec with topk): the cells' LogitsGathers then load them from the cache."""
    import concurrent.futures
    workers = max(1, min(len(sources), os.cpu_count() or 1))
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        hits = list(ex.map(_compile_one, sources))
    print(f"kernels: {len(sources)} specs, {sum(hits)} from the JIT cache, "
          f"{time.perf_counter() - t0:.0f} s in {workers} processes", flush=True)


class _FlashInfer:
    """libkl_flashinfer (bench/flashinfer_sampling.h) through ctypes, on
    torch tensors and torch's current stream."""

    ABI = 1

    def __init__(self, path):
        lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_LOCAL)
        vp, i = ctypes.c_void_p, ctypes.c_int
        lib.kl_fi_abi.restype = i
        lib.kl_fi_about.restype = lib.kl_fi_error.restype = ctypes.c_char_p
        lib.kl_fi_create.argtypes = [ctypes.POINTER(vp), i, i, i, i, i]
        lib.kl_fi_destroy.argtypes = [vp]
        lib.kl_fi_top_k.argtypes = [vp, vp, i, i, vp, vp, vp]
        lib.kl_fi_plain.argtypes = [vp, vp, i, vp, vp, vp, vp, vp]
        lib.kl_fi_filtered.argtypes = [vp, vp, i, vp, vp, vp, vp, vp, vp, vp]
        lib.kl_fi_min_p.argtypes = [vp, vp, i, vp, vp, vp, vp, vp, vp]
        if lib.kl_fi_abi() != self.ABI:
            raise SystemExit(f"klgen.bench: {path}: ABI {lib.kl_fi_abi()}, this bench wants "
                             f"{self.ABI}: rebuild it (bash bench/flashinfer.sh)")
        self.lib, self.about = lib, f"{path} ({lib.kl_fi_about().decode()})"

    def check(self, rc, what):
        if rc:
            raise RuntimeError(f"FlashInfer {what}: {self.lib.kl_fi_error().decode()}")

    def open(self, dtype, rows, cols, k):
        h = ctypes.c_void_p()
        self.check(self.lib.kl_fi_create(ctypes.byref(h), torch.cuda.current_device(),
                                         0 if dtype == "bf16" else 2, rows, cols, k), "create")
        return h

    def calls(self, h, x, c):
        """The comparators on rows x, as klbench --grid's (c: the cell's tensors)."""
        T, lib, ptr = x.shape[0], self.lib, lambda t: t.data_ptr()

        def s():
            return torch.cuda.current_stream().cuda_stream

        def top(k):
            return lambda: self.check(lib.kl_fi_top_k(h, ptr(x), T, k, ptr(c["fi_val"]),
                                                      ptr(c["fi_idx"]), s()), "top_k")
        common = (ptr(c["seed"]), ptr(c["offset"]))
        return {
            "top_k(k=1)": (top(1), ("argmax", "greedy")),
            "top_k(k=8)": (top(8), ("topk8",)),
            "top_k(k=64)": (top(64), ("topk64",)),
            "sampling_from_logits": (lambda: self.check(lib.kl_fi_plain(
                h, ptr(x), T, ptr(c["temp"]), *common, ptr(c["fi_tok"][0]), s()), "plain"),
                ("plain",)),
            "top_k_top_p_sampling_from_logits": (lambda: self.check(lib.kl_fi_filtered(
                h, ptr(x), T, ptr(c["temp"]), ptr(c["k"]), ptr(c["p"]), *common,
                ptr(c["fi_tok"][1]), s()), "filtered"), ("filtered",)),
            "min_p_sampling_from_probs": (lambda: self.check(lib.kl_fi_min_p(
                h, ptr(x), T, ptr(c["temp"]), ptr(c["min_p"]), *common, ptr(c["fi_tok"][2]),
                s()), "min_p"), ("minp",)),
        }


def _eager_us(fn):
    """One call, after a first: µs, outside a graph (what sizes the graphs)."""
    fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1000.0


def _kept(x, tokens, kernel, top50, row_max):
    """What is wrong with draws at T 0.7 under kernel's filter, or None:
    in range, within the top 50 (filtered), above the min-p threshold."""
    tokens = tokens.long()
    if not bool(((tokens >= 0) & (tokens < x.shape[1])).all()):
        return "token out of range"
    picked = x.float().gather(1, tokens[:, None])[:, 0]
    if kernel == "filtered" and not bool((picked >= top50).all()):
        return "token outside the top 50"
    if kernel == "minp" and not bool((picked >= row_max + 0.7 * math.log(0.1) - 1e-3).all()):
        return "token below the min-p threshold"
    return None


def _grid_checks(x, c, kl, torch_v, fi_v, kernels):
    """Each kernel's results against torch's and klgen.reference's on the
    same rows: {kernel: what is wrong} for those that fail."""
    from klgen import reference
    bad = {}

    def want(ok, kernel, what):
        if not ok:
            bad.setdefault(kernel, []).append(what)
    T, sel = x.shape[0], set(kernels)
    best = torch.argmax(x, dim=1)
    k64 = torch.topk(x.float(), 64, dim=1).values
    n = min(T, 4)  # rows are independent: the reference on the first few
    ref = dict(seed=c["seed"][:n], offset=c["offset"][:n])
    rows = dict(plain={}, filtered=dict(top_k=c["k"][:n], top_p=c["p"][:n]),
                minp=dict(min_p=c["min_p"][:n]))
    for kernel in sel:
        got = kl[kernel][0]()
        if kernel == "gather":
            want(torch.equal(_unsigned_zero(got), _unsigned_zero(x)), kernel, "output != input")
        elif kernel == "fused":
            want(torch.equal(got, torch_v["soft-cap ops"][0]()), kernel, "!= the soft-cap ops")
        elif kernel == "argmax":
            want(torch.equal(got, best), kernel, "!= torch.argmax")
            want(torch.equal(torch_v["NCCL pairs"][0](), best), kernel,
                 "NCCL pairs != torch.argmax")
        elif kernel in ("topk8", "topk64"):
            k = 8 if kernel == "topk8" else 64
            want(torch.equal(got.values, k64[:, :k]), kernel, "values != torch.topk's")
        elif kernel == "greedy":
            want(torch.equal(got.tokens, best), kernel, "!= torch.argmax")
        else:
            r = reference.sample(x[:n], c["temp"][:n], **rows[kernel], **ref).tokens
            want(torch.equal(got.tokens[:n], r), kernel, "!= klgen.reference.sample")
    for name, (fn, served) in fi_v.items():
        fn()
        for kernel in set(served) & sel:
            if name.startswith("top_k("):
                k = int(name[8:-1])
                vals = c["fi_val"].view(-1)[:T * k].view(T, k).float()  # [T, k], unsorted
                vals = vals.sort(dim=1, descending=True).values
                want(torch.equal(vals, k64[:, :k]), kernel, f"FlashInfer {name}: values "
                     f"!= torch.topk's")
            else:
                tok = c["fi_tok"][("plain", "filtered", "minp").index(kernel)][:T]
                why = _kept(x, tok, kernel, k64[:, 49], k64[:, 0])
                want(why is None, kernel, f"FlashInfer {name}: {why}")
    for name, (fn, served) in torch_v.items():
        for kernel in set(served) & sel & {"plain", "filtered", "minp"}:
            why = _kept(x, fn(), kernel, k64[:, 49], k64[:, 0])
            want(why is None, kernel, f"torch {name}: {why}")
    return {k: "; ".join(v) for k, v in bad.items()}


def _grid_cell(a, T, gs, xs, c, fi, fih, width, kernels):
    """One cell: the variants, checked, then timed. Returns {kernel: row}."""
    g8, g64, ge = gs
    x, out, out32 = xs[0][:T], xs[1][:T], xs[2][:T]
    t = {k: v[:T] for k, v in c.items() if k not in ("fi_val", "fi_idx", "fi_tok")}
    t.update(fi_val=c["fi_val"], fi_idx=c["fi_idx"], fi_tok=c["fi_tok"])
    every = c["every"][:T]
    # no token logprobs: neither the torch path nor FlashInfer makes them
    samp = dict(seed=t["seed"], offset=t["offset"], token_logprobs=False)
    kl = {
        "gather": (lambda: g8(x, out=out), g8), "fused": (lambda: ge(x, out=out32), ge),
        "argmax": (lambda: g8.argmax(x), g8), "topk8": (lambda: g8.topk(x), g8),
        "topk64": (lambda: g64.topk(x), g64),
        "greedy": (lambda: g64.sample(x, t["zero"], **samp), g64),
        "plain": (lambda: g64.sample(x, t["temp"], **samp), g64),
        "filtered": (lambda: g64.sample(x, t["temp"], t["k"], t["p"], **samp), g64),
        "minp": (lambda: g64.sample(x, t["temp"], min_p=t["min_p"], **samp), g64),
    }
    temp = t["temp"][:, None]
    torch_v = {
        "copy_": (lambda: out.copy_(x), ("gather",)),
        "soft-cap ops": (lambda: (torch.tanh(x / 30.0) * 30.0).float(), ("fused",)),
        "torch.argmax": (lambda: torch.argmax(x, dim=1), ("argmax", "greedy")),
        "NCCL pairs": (lambda: _pairs_argmax(x, 0, width, every), ("argmax", "greedy")),
        "torch.topk(8)": (lambda: torch.topk(x, 8, dim=1), ("topk8",)),
        "torch.topk(64)": (lambda: torch.topk(x, 64, dim=1), ("topk64",)),
        "vLLM sampler": (lambda: _torch_sampler(x, temp, None, None), ("plain",)),
        "vLLM sampler, top-k top-p": (lambda: _torch_sampler(x, temp, t["k"], t["p"]),
                                      ("filtered",)),
        "vLLM sampler, min-p": (lambda: _torch_sampler(x, temp, None, None, t["min_p"]),
                                ("minp",)),
    }
    sel = set(kernels)
    torch_v = {n: v for n, v in torch_v.items() if sel & set(v[1])}
    fi_v = {n: v for n, v in fi.calls(fih, x, t).items() if sel & set(v[1])} if fi else {}
    checks = _grid_checks(x, t, kl, torch_v, fi_v, kernels)
    names, fns, paths, slowest = [], [], {}, 0.0
    for kernel in kernels:
        before = kl[kernel][1].stats()
        slowest = max(slowest, _eager_us(kl[kernel][0]))
        after = kl[kernel][1].stats()
        paths[kernel] = ("nccl" if after["nccl"] > before["nccl"] else
                         "oneshot" if after["oneshot"] > before["oneshot"] else "")
        names.append(kernel), fns.append(kl[kernel][0])
    for group in (torch_v, fi_v):
        for name, (fn, _) in group.items():
            slowest = max(slowest, _eager_us(fn))
            names.append(name), fns.append(fn)
    steps = max(MIN_STEPS, min(a.steps, int(GRAPH_US / slowest) if slowest else a.steps))
    us = dict(zip(names, _timed(fns, a, steps)))
    rows = {}
    for kernel in kernels:
        tv = [(us[n], n) for n, (_, served) in torch_v.items() if kernel in served]
        fv = [(us[n], n) for n, (_, served) in fi_v.items() if kernel in served]
        tb, fb = min(tv) if tv else (math.nan, ""), min(fv) if fv else (math.nan, "")
        rows[kernel] = dict(klgen_us=us[kernel], klgen_path=paths[kernel], torch_us=tb[0],
                            torch_call=tb[1], flashinfer_us=fb[0], flashinfer_call=fb[1],
                            steps=steps, check=checks.get(kernel, ""))
    return rows


GRID_COLUMNS = ("width", "dtype", "tokens", "kernel", "copy_gbps", "klgen_us", "klgen_path",
                "torch_us", "torch_call", "flashinfer_us", "flashinfer_call", "steps", "check")


def _grid_setting(a, fi, width, dtype, meta, csv):
    rows_max, tdt = max(a.tokens), _GRID_DTYPES[dtype]
    gs = [klgen.LogitsGather(_grid_spec(width, dtype, kind, rows_max))
          for kind in ("k8", "k64", "epi")]
    for g in gs:
        if not g.stats()["cache_hit"]:
            print(f"note: {g.name} was compiled again (not in the JIT cache)", file=sys.stderr)
    print(f"\n{width} columns, {dtype}: max_tokens {gs[0].max_tokens} (topk 8), "
          f"{gs[1].max_tokens} (topk 64), {gs[2].max_tokens} (epilogue)", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(width)
    x = (torch.rand((rows_max, width), device="cuda", generator=gen) * 16 - 8).to(tdt)
    xs = (x, torch.empty_like(x), torch.empty((rows_max, width), device="cuda"))

    def full(v, dt=torch.float32):
        return torch.full((rows_max,), v, dtype=dt, device="cuda")
    c = dict(temp=full(0.7), zero=full(0.0), k=full(50, torch.int32),
             p=full(0.9), min_p=full(0.1), offset=full(0, torch.int64),
             seed=torch.arange(1, rows_max + 1, device="cuda"), every=full(0, torch.int64),
             fi_val=torch.empty((rows_max, 64), dtype=tdt, device="cuda"),
             fi_idx=torch.empty((rows_max, 64), dtype=torch.int64, device="cuda"),
             fi_tok=torch.empty((3, rows_max), dtype=torch.int32, device="cuda"))
    fih = fi.open(dtype, rows_max, width, 64) if fi else None
    table, failed = [], False
    for T in a.tokens:
        print(f"\r{width} {dtype}: tokens {T}   ", end="", file=sys.stderr, flush=True)
        cell = _grid_cell(a, T, gs, xs, c, fi, fih, width, a.kernels)
        table.append((T, cell))
        for kernel, r in cell.items():
            failed |= bool(r["check"])
            if csv:
                row = dict(width=width, dtype=dtype, tokens=T, kernel=kernel,
                           copy_gbps=f"{meta['copy_gbps']:.1f}", **r)
                csv.writerow({k: (f"{v:.3f}" if isinstance(v, float) and not math.isnan(v) else
                                  "" if isinstance(v, float) else v) for k, v in row.items()})
        if csv:
            meta["file"].flush()
    print("\r", end="", file=sys.stderr)
    print(f"{'tokens':<7}" + "".join(f"{k:>24}" for k in a.kernels) +
          "\n" + " " * 7 + "".join(f"{'klgen/torch/FI us':>24}" for _ in a.kernels))
    for T, cell in table:
        line = f"{T:<7}"
        for k in a.kernels:
            r = cell[k]
            line += f"{r['klgen_us']:>10.2f}/{r['torch_us']:.2f}/{r['flashinfer_us']:.2f}".rjust(24)
        print(line)
        for k in a.kernels:
            if cell[k]["check"]:
                print(f"  CHECK FAILED: {k} at {T} tokens: {cell[k]['check']}")
    if fih is not None:
        fi.lib.kl_fi_destroy(fih)
    for g in gs:
        g.close()
    del xs, c
    torch.cuda.empty_cache()
    return failed


def _copy_gbps(a):
    """GB/s of a 512 MiB device-to-device copy, read + written (after one
    round that brings the clocks up)."""
    src = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    _timed([lambda: dst.copy_(src)], a, 10)
    return 2 * src.numel() / (_timed([lambda: dst.copy_(src)], a, 10)[0] * 1e3)


def _grid_main(a):
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    fi = _FlashInfer(a.flashinfer) if a.flashinfer else None
    rows_max = max(a.tokens)
    sources = [_grid_spec(w, d, kind, rows_max) for w in a.widths for d in a.dtypes
               for kind in ("k8", "k64", "epi")]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"klgen.bench --grid on {torch.cuda.get_device_name()} (GPU 0, tp 1), torch "
          f"{torch.__version__}, klgen {klgen.__version__}, {date}")
    absent = "absent (give --flashinfer LIB: bash bench/flashinfer.sh builds it)"
    print(f"FlashInfer: {fi.about if fi else absent}")
    print(f"method: each cell's variants captured up to {a.steps} steps deep (a graph of its "
          f"slowest about {GRAPH_US / 1000:.0f} ms), replayed in turn, median of {a.replays} "
          f"replays; us per step", flush=True)
    _precompile(sources)
    copy_gbps = _copy_gbps(a)
    print(f"copy bandwidth {copy_gbps:.1f} GB/s (tensor.copy_, 512 MiB each way, read + written)")
    meta = dict(copy_gbps=copy_gbps)
    csv_writer, failed = None, False
    if a.csv:
        import csv
        meta["file"] = open(a.csv, "w", newline="")
        f = meta["file"]
        f.write(f"# klgen.bench --grid: us per step, CUDA graphs, median of {a.replays} replays\n"
                f"# gpu: {torch.cuda.get_device_name()}\n"
                f"# date: {date}\n"
                f"# command: python -m klgen.bench {' '.join(sys.argv[1:])}\n"
                f"# torch: {torch.__version__}\n# klgen: {klgen.__version__}\n"
                f"# flashinfer: {fi.about if fi else 'absent'}\n# copy_gbps: {copy_gbps:.1f}\n")
        csv_writer = csv.DictWriter(f, fieldnames=GRID_COLUMNS)
        csv_writer.writeheader()
    for w in a.widths:
        for d in a.dtypes:
            failed |= _grid_setting(a, fi, w, d, meta, csv_writer)
    if a.csv:
        meta["file"].close()
    dist.destroy_process_group()
    if failed:
        sys.exit("klgen.bench: some cells' checks failed (CHECK FAILED above)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    a = _args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts
    if a.grid:
        if torch.cuda.device_count() < 1:
            sys.exit("klgen.bench: no GPU")
        _grid_main(a)
        return
    if "RANK" in os.environ:  # under torchrun
        _rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)
        return
    n = torch.cuda.device_count()
    if n < 1:
        sys.exit("klgen.bench: no GPU")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    mp.spawn(_rank_main, args=(n, a), nprocs=n, join=True)


if __name__ == "__main__":
    main()
