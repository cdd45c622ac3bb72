"""What the real-engine tests (test_vllm.py, test_sglang.py) share: their
processes, logits the same on every rank (seeded), and the comparison.

The engines compute logits with their LM head, so the tests make a head whose
logits are these: hidden states 4 * eye(rows) and weight logits / 4 (exact in
every dtype for these values). A product 0 * x with x non-finite is NaN, so
+-Inf come from a finite weight that overflows when multiplied by 4, and a
NaN only as a whole column (a NaN weight spoils every row's dot product)."""

import logging
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TP = 2
HUGE = {torch.bfloat16: 1e38, torch.float32: 1e38, torch.float16: 60000.0}


def spawn(setup, fn, ranks=TP):
    """fn(rank) without autograd inside the context setup(rank, port), in
    `ranks` processes that meet at a free port on 127.0.0.1; a failed assert
    in any of them fails the caller with its traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, setup, fn), nprocs=ranks, join=True)


def _rank(rank, port, setup, fn):
    with setup(rank, port), torch.no_grad():
        fn(rank)


def leave_together(*teardown):
    """After a rank's test passed: wait for every rank, then run the engine's
    teardown. A rank that exits with its gloo groups alive closes sockets
    that a slower peer's gloo threads still use, and that peer can abort at
    exit ("terminate called without an active exception") although its test
    passed. A rank that failed skips this (its peers fail on their own)."""
    torch.distributed.barrier()
    for step in teardown:
        step()


def debug_lines(logger):
    """A list that collects what `logger` logs from now on, debug included."""
    lines = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger(logger).addHandler(handler)
    logging.getLogger(logger).setLevel(logging.DEBUG)
    return lines


def padded(vocab, tp, pad_to=64):
    """The engines' padded vocabulary: a multiple of pad_to (and of tp)."""
    step = pad_to * tp // _gcd(pad_to, tp)
    return -(-vocab // step) * step


def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def hostile_rows(rows, width, vocab, dtype, seed, nan_column=None):
    """[rows, width] logits of kinds that break naive code, by row: random,
    all equal, ties across the ranks' halves, +Inf at two columns, all -Inf,
    values a soft-cap saturates, the largest at the last real column. The
    padding columns (vocab ...) hold values larger than any real one. With
    nan_column, that column is NaN in every row."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, width, generator=gen) * 4).to(dtype).float()
    half = vocab // 2
    for t in range(rows):
        kind = t % 7
        a, b = (t * 7919) % half, half + (t * 104729) % (vocab - half)
        if kind == 1:
            x[t, :vocab] = 1.5
        elif kind == 2:
            x[t, a] = x[t, b] = 50.0
        elif kind == 3:
            x[t, a] = x[t, b] = float("inf")
        elif kind == 4:
            x[t, :vocab] = float("-inf")
        elif kind == 5:
            x[t, :vocab] = 200 + 800 * torch.rand(vocab, generator=gen)
        elif kind == 6:
            x[t, vocab - 1] = 60.0
    x[:, vocab:] = 1e4 if dtype != torch.float16 else 6e4
    if nan_column is not None:
        x[:, nan_column] = float("nan")
    return x.to(dtype)


def ranked_rows(rows, width, vocab, dtype, top, seed):
    """[rows, width] random logits whose `top` largest real values are
    distinct and far apart (their order is defined without ties), at random
    columns; the padding columns hold larger values still."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, width, generator=gen) * 2).to(dtype).float()
    for t in range(rows):
        cols = torch.randperm(vocab, generator=gen)[:top]
        x[t, cols] = 16.0 + 2.0 * torch.arange(top, 0, -1, dtype=torch.float32)
    x[:, vocab:] = 1e4 if dtype != torch.float16 else 6e4
    return x.to(dtype)


def head_weight(logits):
    """The weight [width, rows] whose product with 4 * eye(rows) is logits."""
    w = logits.float() / 4
    huge = HUGE[logits.dtype]
    w = torch.where(w == float("inf"), huge, torch.where(w == float("-inf"), -huge, w))
    return w.t().to(logits.dtype)


def hidden(rows, dtype):
    return (4 * torch.eye(rows)).to(dtype)


def assert_same(got, want, what):
    """Same shape, dtype and values; NaN equals NaN, -0.0 equals +0.0 (klgen
    reads an input -0.0 as +0.0, the one-shot path's rule)."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    same = (got == want) | (got.isnan() & want.isnan())
    if not bool(same.all()):
        where = (~same).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int((~same).sum())} differ, first at {where}: "
                             f"{got[tuple(where)].item()!r}, want {want[tuple(where)].item()!r}")


def per_call(fn):
    """Microseconds per fn() on rank 0, the median of 7 timeit repeats, the
    other ranks idle meanwhile (for the glue benches); None elsewhere."""
    import timeit

    fn()
    dist.barrier()
    if dist.get_rank() != 0:
        dist.barrier()
        return None
    timer = timeit.Timer(fn)
    number = max(1, int(0.2 / max(timer.timeit(10) / 10, 1e-9)))
    us = sorted(timer.repeat(7, number))[3] / number * 1e6
    dist.barrier()
    return us
