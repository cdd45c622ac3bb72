"""SGLang's own LogitsProcessor (the installed sglang, 0.5.23 in CI:
.ci/engines.sh) with klgen's drop-in off and on, on CPU: two gloo processes,
the drop-in turned on the way a user does it (KLGEN_SGLANG, read by klgen's
sglang.srt.plugins entry point), on the torch backend (TorchGather, klgen's contract in torch ops:
there is no GPU). Equal outputs, and the drop-in's stats show that klgen
served each call. Skipped without SGLang.

Three things make SGLang run here without a GPU, none of them in the code
under test: the TP group is built without PyNccl and custom all-reduce (both
need CUDA); SGLang's CPU soft-cap (torch ops) is selected, as
SGLANG_USE_CPU_ENGINE would, which cannot be set itself (it loads the CPU
build of sgl-kernel, which PyPI does not have); the config is ServerArgs'
"dummy" model."""

import contextlib
import functools
import os
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
import engine_util as data  # noqa: E402
from engine_util import TP  # noqa: E402


@contextlib.contextmanager
def _setup(rank, port):
    """Rank `rank` of TP over gloo, as the engine sets it up."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import logits_processor
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy", tp_size=TP, device="cpu", skip_tokenizer_init=True),
            role="scheduler", ranks=SpawnRanks(world_rank=rank))
    parallel_state.init_model_parallel_group = functools.partial(
        parallel_state.init_model_parallel_group, use_pynccl=False)
    parallel_state.set_custom_all_reduce(False)
    parallel_state.init_distributed_environment(
        world_size=TP, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}")
    parallel_state.initialize_model_parallel()
    logits_processor._is_cpu = True
    yield
    data.leave_together(parallel_state.destroy_model_parallel,
                        parallel_state.destroy_distributed_environment)


def _head(vocab, rows, dtype, logits):
    """SGLang's ParallelLMHead and hidden states for which it computes exactly
    `logits` [rows, padded vocab] (engine_util's recipe)."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(vocab, rows, params_dtype=dtype)
    shard = head.num_embeddings_per_partition
    rank = torch.distributed.get_rank()  # the world is the TP group
    head.weight.copy_(data.head_weight(logits)[rank * shard:][:shard])
    return head, data.hidden(rows, dtype)


# (vocab, dtype, final_logit_softcapping, logit_scale, fp32 LM head)
HEADS = [
    (50257, torch.bfloat16, None, None, False),
    (50257, torch.bfloat16, 30.0, 0.5, False),
    (32000, torch.float16, None, 0.75, False),
    (50257, torch.bfloat16, 30.0, None, True),
]


def _processor(vocab, cap, scale, fp32):
    from sglang.srt.layers.logits_processor import LogitsProcessor

    config = types.SimpleNamespace(vocab_size=vocab, final_logit_softcapping=cap,
                                   enable_lm_head_fp32=fp32)
    return LogitsProcessor(config, logit_scale=scale)


def _heads(rows=12, nan_column=None):
    return [_head(vocab, rows, dtype,
                  data.hostile_rows(rows, data.padded(vocab, TP), vocab, dtype, seed=i,
                                    nan_column=nan_column))
            for i, (vocab, dtype, *_) in enumerate(HEADS)]


def _turn_on():
    """The user's step: KLGEN_SGLANG in the environment, which klgen's entry
    point reads when SGLang loads its plugins (in every process it starts)."""
    from sglang.srt.plugins import load_plugins

    os.environ["KLGEN_SGLANG"] = "torch"
    load_plugins()


def _processors():
    """SGLang's processors of HEADS, as they are and with the drop-in on."""
    stock = [_processor(vocab, cap, scale, fp32) for vocab, _, cap, scale, fp32 in HEADS]
    _turn_on()
    ours = [_processor(vocab, cap, scale, fp32) for vocab, _, cap, scale, fp32 in HEADS]
    return stock, ours


def _metadata(buffer=None):
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return LogitsMetadata(forward_mode=ForwardMode.DECODE, next_token_logits_buffer=buffer)


def _served(layer, use):
    assert getattr(layer, "klgen", None) is not None, "not the drop-in"
    return layer.klgen.stats()["calls"].get(use, 0)


def _get_logits_and_forward(rank):
    lines = data.debug_lines("sglang.klgen")
    heads, (stock, ours) = _heads(), _processors()
    for (head, hidden), off, on, spec in zip(heads, stock, ours, HEADS):
        for n in (1, 5, 12):
            h = hidden[:n]
            # logit_scale works in place on the shard: each side its own copy
            data.assert_same(on._get_logits(h.clone(), head, _metadata()),
                             off._get_logits(h.clone(), head, _metadata()),
                             f"_get_logits {spec} rows {n}")
            buffers = [torch.full((n, spec[0]), 7.0) for _ in range(2)]
            got = on._get_logits(h.clone(), head, _metadata(buffers[0]))
            want = off._get_logits(h.clone(), head, _metadata(buffers[1]))
            data.assert_same(got, want, f"_get_logits into the buffer {spec} rows {n}")
            data.assert_same(buffers[0], buffers[1], f"the buffer {spec} rows {n}")
            ids = torch.zeros(n, dtype=torch.long)
            data.assert_same(on(ids, h.clone(), head, _metadata()).next_token_logits,
                             off(ids, h.clone(), head, _metadata()).next_token_logits,
                             f"forward {spec} rows {n}")
        assert _served(on, "gather") == 9
    # the debug line that says it took effect
    assert any("torch gather sglang_v32000_s16000" in line for line in lines), lines


def test_get_logits_and_forward():
    data.spawn(_setup, _get_logits_and_forward)


def _deferred_argmax(rank):
    """SGLang's own deferred_argmax is a Triton kernel (no GPU here); its
    contract, in its docstring, is torch.argmax over the soft-capped row that
    the gather gives, which SGLang's _get_logits computes here."""
    stock, ours = _processors()
    off, on = stock[3], ours[3]  # the fp32 head
    for nan_column in (None, 30000):
        head, hidden = _heads(nan_column=nan_column)[3]
        shard = on._compute_lm_head(hidden, head)
        want = off._get_logits(hidden, head, _metadata()).argmax(dim=-1)
        got = on.deferred_argmax(shard)
        assert torch.equal(got, want), (nan_column, got, want)
    assert _served(on, "argmax") == 2


def test_deferred_argmax():
    data.spawn(_setup, _deferred_argmax)


def _softcap_gather_and_all_to_all(rank):
    """SGLang's fp32 soft-cap fused gather is klgen's, into the logits buffer
    where it fits; its LM-head all-to-all stays SGLang's, counted. SGLang
    takes both on the GPU only, through collectives registered for CUDA
    alone (and the fused kernel's tanh is not in Triton's interpreter): here
    _gather_softcap_fused is called as _get_logits calls it and compared
    with SGLang's unfused path on the CPU, the gather then cap * tanh(x /
    cap) in fp32, which the fused kernel computes in one pass."""
    stock, ours = _processors()
    off, on, vocab = stock[3], ours[3], HEADS[3][0]  # the soft-capped fp32 head
    head, hidden = _heads()[3]
    shard = on._compute_lm_head(hidden, head)
    assert shard.dtype == torch.float32
    want = off._get_logits(hidden, head, _metadata())
    for buffered in (False, True):
        buffer = torch.full((shard.shape[0], vocab), 7.0)
        got = on._gather_softcap_fused(shard, _metadata(buffer), buffered)
        data.assert_same(got, want, f"the soft-cap gather, buffered {buffered}")
        assert (got.data_ptr() == buffer.data_ptr()) == buffered
    assert _served(on, "softcap gather") == 2
    # SGLang's own all-to-all: its CUDA-only collective is what fails here
    for layer in (stock[3], on):
        with pytest.raises(NotImplementedError, match="reg_all_to_all_single"):
            layer._tp_lm_head_all_to_all(torch.zeros(2 * TP, shard.shape[1]))
    assert on.klgen.stats()["declined"] == {"gather": 1}


def test_softcap_gather_and_all_to_all():
    data.spawn(_setup, _softcap_gather_and_all_to_all)


def _device_error(rank):
    """A DeviceError from the gather reaches the caller."""
    import klgen
    from klgen.integrations import _gathers

    (head, hidden), on = _heads()[0], _processors()[1][0]

    def fail(self, shard):
        raise klgen.DeviceError("rank 1 timed out at step 7")

    _gathers.TorchGather.__call__ = fail
    with pytest.raises(klgen.DeviceError, match="timed out"):
        on._get_logits(hidden, head, _metadata())


def test_device_error_propagates():
    data.spawn(_setup, _device_error)


def _off(rank):
    """Without KLGEN_SGLANG the entry point changes nothing."""
    from sglang.srt.plugins import load_plugins

    os.environ.pop("KLGEN_SGLANG", None)
    load_plugins()
    layer = _processor(50257, None, None, False)
    assert not hasattr(layer, "klgen") and type(layer._logits_gatherer).__name__ != "LogitsGatherer"


def test_entry_point_does_nothing_unasked():
    data.spawn(_setup, _off)
