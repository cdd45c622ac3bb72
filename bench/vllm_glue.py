"""Host time of klgen's vLLM sampling glue per decode step, on the CPU.

    VENV/bin/python bench/vllm_glue.py      (VENV: a venv with vLLM and klgen,
                                             .ci/engines.sh's)

Two gloo processes (TP 2: the glue declines TP 1), vLLM's own v2 Sampler with
the requests of each case, and klgen's glue on the torch backend with the LM
head and the klgen call stubbed: the LM head returns a fixed shard and the
gather's sample returns fixed tokens, so what is timed is the glue's Python
and the torch work it launches, not a matmul or a kernel. Timed: the
processor's sample() (and the same for a step whose batch composition is
new, its verdict made again), and the whole step, GPUModelRunner.sample as the
plugin wraps it (test_vllm's runner and tiny Llama), with vLLM's own count
of sampled tokens (a Triton kernel its sampler launches too) stubbed; and
vLLM's own GPUModelRunner.sample of the same step, its logits stubbed and
its Triton launches no-ops, for the glue's cost on top of vLLM's. Both
ranks make the gathers (collective); rank 0 times while rank 1 waits, and
prints microseconds per call, the median of 7 timeit repeats.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))

import engine_util as data  # noqa: E402

CASES = (("1 request, T 1", 1, {}), ("1 request, top-k 50, top-p 0.9", 1,
         dict(top_k=50, top_p=0.9)), ("1 request, T 1, 5 logprobs", 1, dict(logprobs=5)),
         ("64 requests, T 1", 64, {}),
         ("64 requests, top-k 50, top-p 0.9", 64, dict(top_k=50, top_p=0.9)),
         ("64 requests, T 1, 5 logprobs", 64, dict(logprobs=5)))


def _stubbed(processor, head, rows):
    """processor with its LM head and its klgen sample stubbed, after one
    real call; the sample's stand-in has 5 top logprobs and ranks, for the
    steps that ask for them."""
    import torch

    from klgen._torch import Sample, TopLogprobs

    shard = torch.zeros(rows, head.num_embeddings_per_partition, dtype=torch.bfloat16)
    processor._apply_head = lambda lm_head, hidden, bias: shard
    tokens = torch.zeros(rows, dtype=torch.int64)
    top = TopLogprobs(torch.zeros(rows, 5), torch.zeros(rows, 5, dtype=torch.int64))
    return shard, Sample(tokens, torch.zeros(rows), top, torch.zeros(rows, dtype=torch.int64))


def _run(rank):
    import torch
    import vllm.v1.worker.gpu.input_batch as input_batch
    from test_vllm import _batch, _head, _processors, _v2_sampler
    from vllm.sampling_params import SamplingParams

    counts = {}
    input_batch.get_num_sampled_and_rejected = lambda ones, *args: counts.setdefault(
        ones.shape[0], (ones, torch.zeros_like(ones)))
    import vllm.v1.worker.gpu.model_runner  # noqa: F401 (what the plugin wraps, imported)

    vocab = 50257
    # two rounds, the first untold: the first calls of a process run slower
    for told, (name, rows, params) in ((told, case) for told in (False, True) for case in CASES):
        logits = data.hostile_rows(rows, data.padded(vocab, data.TP), vocab, torch.bfloat16, 0)
        head, hidden = _head(vocab, rows, torch.bfloat16, logits)
        on = _processors()[1][0]
        sampler = _v2_sampler(vocab, [SamplingParams(temperature=1.0, **params)] * rows)
        batch, lp = _batch(list(range(rows))), "logprobs" in params
        on.sample(head, hidden, sampler, batch, None, logprobs=lp)  # makes the gather
        _, out = _stubbed(on, head, rows)
        for g in on.klgen.specs.values():
            g.sample = lambda shard, **args: out
        us = data.per_call(lambda: on.sample(head, hidden, sampler, batch, None, logprobs=lp))
        plans = sampler.__dict__["_klgen_plans"]
        # a step whose composition is new: its verdict and plan made again
        fresh = data.per_call(
            lambda: plans.clear() or on.sample(head, hidden, sampler, batch, None, logprobs=lp))
        assert on.klgen.stats()["declined"] == {}, on.klgen.stats()
        step, own = _runner_step(rows, logits, sampler)
        if told and rank == 0:
            print(f"{name:36s} KlgenLogitsProcessor.sample {us:6.1f} us ({fresh:6.1f} us "
                  f"a new composition), GPUModelRunner.sample {step:6.1f} us, vLLM's own "
                  f"{own:6.1f} us")
    data.leave_together()


def _runner_step(rows, logits, sampler):
    """Microseconds per GPUModelRunner.sample of a decode step of `rows`
    requests, klgen's path, LM head and klgen call stubbed."""
    import torch
    from test_vllm import _decode_batch, _runner, _tiny_llama

    width = max(rows, 8)  # the tiny model's hidden size
    model = _tiny_llama(50257, width, torch.bfloat16,
                        torch.nn.functional.pad(logits, (0, 0, 0, width - rows)))
    runner, batch = _runner(model, sampler), _decode_batch(list(range(rows)), seed=0)
    hidden = data.hidden(width, torch.bfloat16)[:rows]
    processor = model.logits_processor
    runner.sample(hidden, batch, None)
    _, out = _stubbed(processor, model.lm_head, rows)
    for g in processor.klgen.specs.values():
        g.sample = lambda shard, **args: out
    us = data.per_call(lambda: runner.sample(hidden, batch, None))
    assert processor.klgen.stats()["declined"] == {}, processor.klgen.stats()
    return us, _vllms_step(runner, model, hidden, batch, rows)


def _vllms_step(runner, model, hidden, batch, rows):
    """Microseconds per vLLM's own GPUModelRunner.sample (the function the
    plugin wraps) of the same step, its logits stubbed (a narrow row) and
    every Triton launch a no-op: its Python and torch dispatch, as the
    klgen figure has the glue's."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction as kernels

    from vllm.platforms import current_platform

    launch = kernels.run
    kernels.run = lambda self, *args, **kwargs: None
    # its top-k/top-p kernel sizes its grid by the GPU's SMs (an H100's here)
    current_platform.num_compute_units = lambda device_id=0: 132
    compute_logits = model.compute_logits
    # narrow, so that the CPU's arithmetic on it (a GPU's, in a server)
    # stays out of the figure: the launches and the Python are what count
    gathered = torch.zeros(rows, 128)
    model.compute_logits = lambda hidden_states: gathered
    try:
        vllms = type(runner).sample.klgen_wraps
        return data.per_call(lambda: vllms(runner, hidden, batch, None))
    finally:
        kernels.run, model.compute_logits = launch, compute_logits


if __name__ == "__main__":
    # vLLM's kernels as Triton's (interpreted) functions, whose launches
    # _vllms_step makes no-ops: vLLM keeps Triton with no GPU visible and
    # its interpreter on, and defines them as plain functions otherwise
    os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    from test_vllm import _setup

    data.spawn(_setup, _run)
