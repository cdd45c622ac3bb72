"""Host time of klgen's SGLang sampling glue per decode step, on the CPU.

    VENV/bin/python bench/sglang_glue.py    (VENV: a venv with SGLang and klgen,
                                             .ci/engines.sh's)

Two gloo processes (TP 2), SGLang 0.5.23's own ModelRunner.sample and
Sampler (test_sglang's stand-in runner around them) with the requests of
each case, klgen's glue on the torch backend with the klgen call stubbed
(the gather's sample and argmax return fixed tokens), so that what is timed
is the glue's Python and the torch work it launches, not a kernel. Timed:
ModelRunner.sample as the plugin wraps it, of a deferred decode step; and
SGLang's own ModelRunner.sample of the same step on a narrow gathered row
(so that the CPU's arithmetic on it stays out of the figure), its sampler's
torch work on the CPU standing in for its launches on a GPU. Rank 0 times
while rank 1 waits, and prints microseconds per call, the median of 7
timeit repeats, after an untimed round.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))

import engine_util as data  # noqa: E402

CASES = (("1 request, T 1", 1, {}), ("1 request, top-k 50", 1, dict(top_k=50)),
         ("1 request, top-p 0.9", 1, dict(top_p=0.9)),
         ("1 request, greedy", 1, dict(temperature=0.0)), ("64 requests, T 1", 64, {}),
         ("64 requests, top-k 50", 64, dict(top_k=50)))


def _run(rank):
    import torch
    from klgen.integrations import sglang as glue
    from test_sglang import HEADS, _head, _metadata, _processors, _requests, _Runner, _step

    stock, ours = _processors()
    vocab, dtype = HEADS[0][0], HEADS[0][1]
    on, off = ours[0], stock[0]
    runner, theirs = _Runner(on), _Runner(off)
    glue._loaded(None, runner)
    for told, (name, rows, params) in ((t, c) for t in (False, True) for c in CASES):
        gen = torch.Generator().manual_seed(rows)
        head, hidden = _head(vocab, rows, dtype, (torch.randn(rows, data.padded(vocab, data.TP),
                                                              generator=gen) * 3).to(dtype))
        out = on(torch.zeros(rows, dtype=torch.long), hidden, head, _metadata())
        shard = out.next_token_logits
        step = _step(runner, _requests([dict(temperature=1.0) | params] * rows), vocab)
        runner.sample(out, step)  # makes the gathers
        tokens = torch.zeros(rows, dtype=torch.int64)
        for g in on.klgen.specs.values():
            g.sample = lambda x, **args: types_sample(tokens)
            g.argmax = lambda x: tokens
        us = data.per_call(lambda: runner.sample(out, step))
        assert on.klgen.stats()["declined"] == {}, on.klgen.stats()
        narrow = torch.zeros(rows, 128)
        row = types_output(narrow)
        theirs_step = _step(theirs, _requests([dict(temperature=1.0) | params] * rows), vocab)
        own = data.per_call(lambda: theirs.sample(row, theirs_step))
        assert shard.shape[-1] < vocab
        if told and rank == 0:
            print(f"{name:34s} wrapped ModelRunner.sample {us:6.1f} us, SGLang's own "
                  f"{own:6.1f} us")
    data.leave_together()


def types_sample(tokens):
    from klgen._torch import Sample

    return Sample(tokens, None, None)


def types_output(logits):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    return LogitsProcessorOutput(next_token_logits=logits)


if __name__ == "__main__":
    from test_sglang import _setup

    data.spawn(_setup, _run)
