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
"""

import argparse
import ctypes
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


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m klgen.bench", description=__doc__.split("\n")[0])
    p.add_argument("spec", help="a spec file, or the stem of a shipped one (kimi_k3_tp8)")
    p.add_argument("name", nargs="?", help="which spec of a file that defines several")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--steps", type=int, default=200, help="steps per captured graph")
    p.add_argument("--replays", type=int, default=7)
    p.add_argument("--host-calls", type=int, default=2000, help="eager calls timed on the host")
    p.add_argument("--select", action="store_true",
                   help="the fused epilogue, argmax and top-k against torch ops instead")
    p.add_argument("--topk", type=int, default=8, help="k for --select")
    p.add_argument("--sample", action="store_true",
                   help="LogitsGather.sample against the gather and vLLM's torch sampler instead")
    a = p.parse_args(argv)
    a.tokens = [int(t) for t in a.tokens.split(",")]
    if not os.path.exists(a.spec):
        a.spec = klgen.spec_path(a.spec)
    if a.steps < 1 or a.replays < 1 or min(a.tokens) < 1:
        p.error("--steps, --replays and every token count must be at least 1")
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


def _timed(fns, a):
    """µs per step of each fn: captured, replayed in turn, the max over ranks."""
    graphs = _graphs(fns, a.steps)
    return _worst(_time(graphs, a.steps, a.replays))


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


def _torch_sampler(logits, t, k, p):
    """vLLM's sampler on gathered logits, its PyTorch path (no FlashInfer):
    temperature, the top-k and top-p mask by an ascending sort, softmax, and
    the exponential race (probs / Exp(1), argmax)."""
    x = logits.float() / t
    if k is not None or p is not None:
        x_sort, x_idx = x.sort(dim=-1, descending=False)
        if k is not None:
            cut = x_sort.gather(-1, (x_sort.shape[-1] - k).clamp(min=0)[:, None])
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
        k = torch.full((T,), 50, dtype=torch.int64, device="cuda")
        p = torch.full((T,), 0.9, device="cuda")
        zero = torch.zeros((T,), device="cuda")
        seed = torch.arange(T, device="cuda") + 1000
        for kw in (dict(top_k=k, top_p=p), dict()):
            want = reference.sample(g(x), temp, seed=seed, **kw).tokens
            if not torch.equal(g.sample(x, temp, seed=seed, **kw).tokens, want):
                raise SystemExit(f"klgen.bench: rank {rank}: sample differs from the reference "
                                 f"at {T} tokens ({kw and 'top-k, top-p' or 'temperature'})")
        fns = [lambda: g.sample(x, temp, k, p, seed=seed),
               lambda: _torch_sampler(g(x), temp[:, None], k, p),
               lambda: g.sample(x, temp, seed=seed),
               lambda: _torch_sampler(g(x), temp[:, None], None, None),
               lambda: g.sample(x, zero, seed=seed),
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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    a = _args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts
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
