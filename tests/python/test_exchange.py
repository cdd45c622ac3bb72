"""LogitsGather's handle exchange (kl_config.allgather) over a gloo group, on CPU:
two processes, each record travels to both, in rank order. Skipped without torch."""

import ctypes
import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, results):
    from klgen._torch import _Exchange

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ex = _Exchange(dist.group.WORLD, None)
    send = (ctypes.c_ubyte * 37)(*[(rank * 50 + i) % 256 for i in range(37)])
    recv = (ctypes.c_ubyte * 74)()
    rc = ex.fn(ctypes.addressof(send), ctypes.addressof(recv), 37, None)
    results[rank] = (rc, bytes(recv), repr(ex.error))
    dist.destroy_process_group()


def test_exchange_over_gloo():
    with mp.Manager() as m:
        results = m.dict()
        mp.spawn(_rank, args=(_port(), results), nprocs=2, join=True)
        want = bytes((r * 50 + i) % 256 for r in (0, 1) for i in range(37))
        for rank in (0, 1):
            rc, got, err = results[rank]
            assert rc == 0, err
            assert got == want
