"""kl_sample's parameter tables in pinned host memory the GPU maps (vLLM's
UvaBackedTensor, made here through cupy), read through state_rows and
offset_rows, against the same values per row on the device. Skipped
without a GPU or cupy."""

import os

import pytest

torch = pytest.importorskip("torch")


def uva(t):
    """A CUDA tensor over pinned host tensor t's memory (t stays alive)."""
    import cupy
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, 0)
    dt = {torch.float32: cupy.float32, torch.int32: cupy.int32, torch.int64: cupy.int64}[t.dtype]
    a = cupy.ndarray(t.shape, dt, cupy.cuda.MemoryPointer(mem, 0))
    v = torch.as_tensor(a, device="cuda")
    assert v.data_ptr() == t.data_ptr(), "not the same address"
    return v


@pytest.mark.gpu
def test_tables_in_mapped_host_memory():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    pytest.importorskip("cupy")
    import torch.distributed as dist
    import klgen
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        _check(klgen)
    finally:
        dist.destroy_process_group()


def _check(klgen):
    gen = torch.Generator().manual_seed(3)
    vocab, rows, states = 163840, 64, 200
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16).cuda()
    host = dict(temperature=torch.tensor([0.0, 0.5, 1.0, 1.3])[torch.randint(4, (states,), generator=gen)],
                top_k=torch.tensor([0, 5, 64, vocab], dtype=torch.int32)[torch.randint(4, (states,), generator=gen)],
                top_p=torch.tensor([1.0, 0.9, 0.5])[torch.randint(3, (states,), generator=gen)],
                min_p=torch.tensor([0.0, 0.05])[torch.randint(2, (states,), generator=gen)],
                seed=torch.randint(-2**63, 2**63 - 1, (states,), generator=gen))
    pos = torch.randint(0, 2**30, (3 * rows,), generator=gen)
    srows = torch.randperm(states, generator=gen)[:rows]
    orows = torch.randperm(3 * rows, generator=gen)[:rows].int()
    pinned = {k: v.pin_memory() for k, v in host.items()}
    tables = {k: uva(v) for k, v in pinned.items()}
    ppos = pos.pin_memory()
    with klgen.LogitsGather(vocab_size=vocab, dtype=torch.bfloat16, max_tokens=rows, topk=64,
                            noise="vllm", name="uva_check") as g:
        for n in (1, 8, rows):
            want = g.sample(logits[:n], **{k: v[srows[:n]].cuda() for k, v in host.items()},
                            offset=pos[orows[:n].long()].cuda()).tokens
            got = g.sample(logits[:n], **tables, state_rows=srows[:n].cuda(), offset=uva(ppos),
                           offset_rows=orows[:n].cuda()).tokens
            dev = g.sample(logits[:n], **{k: v.cuda() for k, v in host.items()},
                           state_rows=srows[:n].cuda(), offset=pos.cuda(),
                           offset_rows=orows[:n].cuda()).tokens
            torch.cuda.synchronize()
            print(f"{n} rows: host-mapped tables vs per-row: {int((got != want).sum())} differ; "
                  f"device tables vs per-row: {int((dev != want).sum())}; -1 tokens "
                  f"{int((want < 0).sum())}", flush=True)
            assert torch.equal(got, want) and torch.equal(dev, want)
