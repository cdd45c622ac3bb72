"""LogitsGather: libklrt's gather on torch tensors, over a torch.distributed group.

    g = klgen.LogitsGather("specs/kimi_k3_tp8.lua")   # collective, every rank
    logits = g(shard)                                  # [tokens, vocab_size]

    index = g.argmax(shard)                            # [tokens] int64, greedy
    top = g.topk(shard)                                # spec with topk = K
    out = g.sample(shard, 0.7, top_p=0.9, seed=seeds)  # spec with topk = K

The calls run on torch's current stream, through custom ops (klgen::gather,
klgen::argmax, klgen::topk, klgen::sample, with fake implementations), so they
work eagerly, inside torch.cuda.graph capture, and under
torch.compile(fullgraph=True).
"""

import collections
import ctypes
import itertools
import math
import os
import struct
import threading
from typing import Optional

import torch
import torch.distributed as dist

from . import _capi, _fields_source, _libs, _name_arg, _source_args
from ._errors import DeviceError, Error

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

TopK = collections.namedtuple("TopK", "values indices lse")
TopK.__doc__ = """kl_topk's result: values and indices [tokens, k] (largest first, ties
to the lowest column; values in fp32), lse [tokens] (the log-sum-exp of the
whole row, fp32)."""
Sample = collections.namedtuple("Sample", "tokens logprobs top_logprobs ranks",
                                defaults=(None,))
Sample.__doc__ = """kl_sample's result: tokens [tokens] int64 (the same on every rank; -1
for a row whose per-row parameters are outside the domain), logprobs [tokens]
fp32 (the token's log-probability under the logits after the epilogue, before
temperature and filters; with logprobs_mode "raw_logits" its logit, as the top
logprobs' values), top_logprobs None (logprobs=0) or a TopLogprobs of
the n largest of those logits, ranks None (ranks=False) or [tokens] int64:
how many columns of those logits are >= the token's (vLLM's rank; -1 where
the token is). klgen.reference.Sample holds the same per row as tokens,
logprob, top_logprobs and top_indices, and rank."""
TopLogprobs = collections.namedtuple("TopLogprobs", "values indices")
TopLogprobs.__doc__ = """The n largest raw logits' log-probabilities [tokens, n] fp32 and
columns [tokens, n] int64, largest first, ties to the lowest column."""
_BY_NAME = {v: k for k, v in _DTYPES.items()}

# Live gathers by handle: what the custom op (which takes plain values) calls.
# The handle is a str: an int argument could be made symbolic by torch.compile.
_live = {}
_handles = itertools.count(1)
_lock = threading.Lock()


def _spec_source(fields):
    """A spec's Lua source from keyword fields (dtype may be a torch.dtype)."""
    fields = dict(fields)
    for key in ("dtype", "out_dtype"):
        if isinstance(fields.get(key), torch.dtype):
            if fields[key] not in _DTYPES:
                raise TypeError(f"{key} {fields[key]} is not one of torch.bfloat16, float16, float32")
            fields[key] = _DTYPES[fields[key]]
    return _fields_source(fields)


def _raw_stream(index):
    """torch's current stream on device `index`, as a cudaStream_t (an int)."""
    return torch.cuda.current_stream(index).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):  # the same, without a Stream object
    _raw_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811


def _cuda_device(device):
    """torch.device('cuda', i) for None (torch's current device), an int, or a device."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device must be a CUDA device, not {d}")
    return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())


class _Exchange:
    """kl_config.allgather over a torch.distributed group (called during creation
    and destruction, on the calling thread)."""

    def __init__(self, group, device):
        self.group, self.device = group, device
        self.size = dist.get_world_size(group)
        self.error = None
        self.fn = _capi.ALLGATHER_FN(self._call)  # kept alive as long as self

    def _call(self, send, recv, nbytes, user):
        try:
            mine = torch.empty(nbytes, dtype=torch.uint8)
            ctypes.memmove(mine.data_ptr(), send, nbytes)
            if dist.get_backend(self.group) == "nccl":
                mine = mine.to(self.device)
                every = torch.empty(self.size * nbytes, dtype=torch.uint8, device=self.device)
                dist.all_gather_into_tensor(every, mine, group=self.group)
            else:  # gloo and others: the list form every backend has
                parts = [torch.empty_like(mine) for _ in range(self.size)]
                dist.all_gather(parts, mine, group=self.group)
                every = torch.cat(parts)
            every = every.cpu()
            ctypes.memmove(recv, every.data_ptr(), self.size * nbytes)
            return 0
        except BaseException as e:  # never let an exception unwind through C
            self.error = e
            return 1


def _nccl_comm(group, rank, size, device):
    """A communicator for libklrt's NCCL path, from a unique id broadcast over the
    group (vLLM's PyNccl does the same), on torch's NCCL."""
    nccl = _libs.nccl()
    uid = _libs.UniqueId()
    if rank == 0:
        r = nccl.ncclGetUniqueId(ctypes.byref(uid))
        if r != 0:
            raise Error(f"ncclGetUniqueId: {nccl.ncclGetErrorString(r).decode()}")
    raw = torch.frombuffer(bytearray(bytes(uid.internal)), dtype=torch.uint8)
    raw = raw.to(device) if dist.get_backend(group) == "nccl" else raw
    dist.broadcast(raw, src=dist.get_global_rank(group, 0), group=group)
    ctypes.memmove(ctypes.addressof(uid), bytes(raw.cpu().tolist()), 128)
    comm = ctypes.c_void_p()
    with torch.cuda.device(device):
        r = nccl.ncclCommInitRank(ctypes.byref(comm), size, uid, rank)
    if r != 0:
        raise Error(f"ncclCommInitRank: {nccl.ncclGetErrorString(r).decode()}")
    return nccl, comm


class LogitsGather:
    """The tensor-parallel logits all-gather of one spec, for this rank.

    LogitsGather(spec=None, *, group=None, device=None, nccl_comm=None, **fields)

    spec: a spec file's path, a shipped spec's name ('kimi_k3_tp8'), a
    spec's Lua source, or None with the fields
    given as keywords (vocab_size, tp, dtype, pad_to or padded_vocab,
    max_tokens, timeout_ms, name, and the epilogue's out_dtype, softcap,
    scale, numerics, and topk and noise; dtype may be a torch.dtype, tp defaults to
    the group's size). name: with a spec, the one to use of several it
    defines; with fields, the spec's name (default "logits"). group: a torch.distributed process group (default: the
    world). device: this rank's GPU (default: torch's current device).
    nccl_comm: an existing ncclComm_t (an int) for the NCCL fallback; without
    one, a communicator is made from the group. Creation is collective.
    """

    def __init__(self, spec=None, *, group=None, device=None, nccl_comm=None, name=None,
                 **fields):
        if not torch.cuda.is_available():  # before torch's own error from deep inside
            raise DeviceError("LogitsGather needs a CUDA GPU and its driver: torch finds none "
                              "(torch.cuda.is_available() is False)")
        if not dist.is_available() or not dist.is_initialized():
            raise Error("torch.distributed is not initialized: call init_process_group first")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.nranks = dist.get_world_size(self.group)
        self.device = _cuda_device(device)
        self._ctx = ctypes.c_void_p()
        self._nccl = self._own_comm = None
        if spec is None:
            fields.setdefault("tp", self.nranks)
            if name is not None:
                fields["name"] = name  # the spec's own name; nothing to select
            name = None
            source, path = _spec_source(fields), None
        elif fields:
            raise TypeError("give a spec or the spec's fields, not both")
        elif isinstance(spec, os.PathLike) or (isinstance(spec, str) and "return" not in spec):
            source, path = None, spec
        elif isinstance(spec, str):
            source, path = spec, None
        else:
            raise TypeError(f"spec must be a path, a Lua source string or None, not {type(spec).__name__}")
        # what C would read less of (a NUL) or not at all is refused here, before
        # anything collective starts
        file, text, name = _source_args(path, source, "LogitsGather", name)
        cname = _name_arg(name) if name else None
        _libs.nvrtc()  # before libklrt looks for it (it takes the copy loaded)
        if nccl_comm is None:
            self._nccl, self._own_comm = _nccl_comm(self.group, self.rank, self.nranks, self.device)
            nccl_comm = self._own_comm.value
        self._exchange = _Exchange(self.group, self.device)
        cfg = _capi.Config(size=ctypes.sizeof(_capi.Config), rank=self.rank, nranks=self.nranks,
                           device=self.device.index, nccl=nccl_comm, allgather=self._exchange.fn)
        with torch.cuda.device(self.device):
            if file is not None:
                r = _capi.lib.kl_ctx_create_file(ctypes.byref(self._ctx), file, cname,
                                                 ctypes.byref(cfg))
            else:
                r = _capi.lib.kl_ctx_create_string(ctypes.byref(self._ctx), text, cname,
                                                   ctypes.byref(cfg))
        if r != _capi.OK:
            self._drop_comm()
            if self._exchange.error is not None:
                raise Error(f"exchanging buffer handles over the group failed: "
                            f"{self._exchange.error!r}") from self._exchange.error
            _capi.check(r)
        info = _capi.Info(size=ctypes.sizeof(_capi.Info))
        _capi.check(_capi.lib.kl_ctx_info(self._ctx, ctypes.byref(info)))
        self.name = info.name.decode()
        self.vocab_size, self.shard = info.vocab_size, info.shard
        self.max_tokens, self.dtype = info.max_tokens, _BY_NAME[("bf16", "fp16", "fp32")[info.dtype]]
        self.out_dtype = _BY_NAME[("bf16", "fp16", "fp32")[info.out_dtype]]
        self.k = info.topk
        self.noise = _capi.NOISES[info.noise]  # sample's noise, as reference.sample names it
        with _lock:
            self._handle = f"klgen-{next(_handles)}"
            _live[self._handle] = self

    # ---- the gather ----

    def __call__(self, shard, out=None):
        """shard [tokens, shard] -> [tokens, vocab_size] (into out if given)."""
        # The op's schema would refuse these too, but with a message about the op.
        if not isinstance(shard, torch.Tensor):
            raise TypeError(f"shard must be a torch.Tensor, not {type(shard).__name__}")
        if out is not None and not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, not {type(out).__name__}")
        # Only torch.compile needs the op (to trace it); eager calls and graph
        # capture call the gather directly: the op's dispatch costs host time.
        if not torch.compiler.is_compiling():
            return self._run(shard, out)
        if out is None:
            return torch.ops.klgen.gather(shard, self._handle)
        torch.ops.klgen.gather_out(shard, out, self._handle)
        return out

    # ---- greedy and top-k: the vocabulary never moves ----

    def argmax(self, shard, *, values=False):
        """Index of each row's largest logit (through the spec's epilogue) over
        the whole vocabulary: [tokens] int64, as torch.argmax gives it (ties
        to the lowest index, NaN largest). values=True: (index, value) with
        the values in fp32."""
        if not torch.compiler.is_compiling():
            index, value = self._select(shard, 0, values)
        else:
            index, value = torch.ops.klgen.argmax(shard, self._handle)
        return (index, value) if values else index

    def topk(self, shard):
        """A TopK of each row: the spec's k largest values and their indices,
        and the log-sum-exp of the whole row (a spec with topk = K)."""
        if not self.k:
            raise Error(f"spec '{self.name}' has no topk field (add topk = K to it)")
        if not torch.compiler.is_compiling():
            return TopK(*self._select(shard, 1, True))
        return TopK(*torch.ops.klgen.topk(shard, self._handle))

    # ---- sampling: the vocabulary's rows drawn, as klgen.reference.sample ----

    def sample(self, shard, temperature, top_k=None, top_p=None, min_p=None, *, seed=0,
               offset=0, state_rows=None, offset_rows=None, bitmask=None,
               repetition_penalty=None, frequency_penalty=None, presence_penalty=None,
               prompt_mask=None, output_counts=None, logit_bias=None, allowed_token_ids=None,
               min_tokens=None, position=None, banned=None, logprobs=0, token_logprobs=True,
               ranks=False, logprobs_mode="raw_logprobs"):
        """A Sample of each row: temperature, min-p, top-k, top-p and a
        Gumbel-max draw keyed by (seed, offset, column), as
        klgen.reference.sample defines it (a spec with topk = K), with the
        spec's noise (g.noise: "philox", or "vllm": vLLM's own draws).

        Each parameter is a number (every row) or a [tokens] tensor on this
        device (one per row; what a CUDA graph replays with new values):
        temperature >= 0 (0: greedy), top_k 0..K or >= vocab_size (0 and
        None: off), top_p in (0, 1], min_p in [0, 1], seed and offset 64-bit
        ints (int64 tensors). state_rows (int32 or int64 [tokens]): tensor
        temperature, top_k, top_p, min_p and seed are per-request tables of
        one length instead, row t reading entry state_rows[t]; offset_rows
        (likewise) for a tensor offset (vLLM's sampling states with
        its idx_mapping, its positions with logits_indices: no index or cast
        kernel a step). Numbers are checked here (but float ones under
        torch.compile); a tensor's values are checked on the device, where a
        row outside the domain (or an index outside its table) gets token -1
        and NaN logprobs. bitmask: a structured-output grammar's mask,
        int32 [tokens, ceil(vocab_size / 32)] as vLLM and xgrammar pack it
        (column c of row t kept where bit c % 32 of word [t, c // 32] is
        set, else -inf, the logprobs' logits included), or None.
        repetition_penalty, frequency_penalty, presence_penalty: vLLM's
        penalties (klgen.reference.sample), numbers or float tensors of one
        per row (per entry of the tables, with state_rows), with
        output_counts (int32 [entries, vocab_size], each request's count of
        every token in its output) and, for repetition_penalty, prompt_mask
        (int32 [entries, ceil(vocab_size / 32)], its prompt's tokens as
        bitmask's bits): they change what is drawn, not the logprobs, which
        are of the logits with the grammar alone (vLLM's raw_logprobs).
        allowed_token_ids (count, ids), logit_bias (count, ids, values),
        min_tokens (min_len, count, stop_ids, None), position and banned:
        vLLM's other processors, as klgen.reference.sample takes them (the
        per-request arrays int32 [entries] and [entries, width], values
        float32, position int64 [tokens] (default: offset), banned int32
        [tokens, width] with negative padding); vLLM's
        restore_when_all_masked (min_tokens' fourth) is not served: pass
        None. Like the penalties, they change what is drawn, not the
        logprobs. logprobs: n top logprobs, 0..K. token_logprobs=False: no logprob of
        the tokens (Sample.logprobs is None), and the sampler skips the sums
        it needs. ranks=True: each token's rank among those logits
        (Sample.ranks), vLLM's selected_token_ranks; like top logprobs, it
        gathers the rows. logprobs_mode: what the logprobs hold, as vLLM's
        option of that name: "raw_logprobs" (those logits' log-softmax) or
        "raw_logits" (the logits themselves); the tokens, top indices and
        ranks are the same either way. vLLM's processed modes are
        klgen.reference.sample's alone."""
        if not self.k:
            raise Error(f"spec '{self.name}' has no topk field (add topk = K to it)")
        self._check(shard, None)
        params = _sampling_args(self, shard.shape[0], temperature, top_k, top_p, min_p, seed,
                                offset, state_rows, offset_rows, logprobs)
        params.append(_bitmask(bitmask, shard.shape[0], self))
        entries = shard.shape[0] if state_rows is None else params[0].shape[0]
        params += _penalties(self, entries, (repetition_penalty, frequency_penalty,
                                             presence_penalty), prompt_mask, output_counts)
        params += _lists(self, entries, shard.shape[0], allowed_token_ids, logit_bias,
                         min_tokens, position, banned)
        want, want_rank = bool(token_logprobs), bool(ranks)
        logits = _logit_values(logprobs_mode)
        if not torch.compiler.is_compiling():
            token, lp, values, indices, rank = self._sample(shard, *params, logprobs, want,
                                                            want_rank, logits)
        else:
            token, lp, values, indices, rank = torch.ops.klgen.sample(
                shard, *params, logprobs, want, want_rank, logits, self._handle)
        return Sample(token, lp if want else None,
                      TopLogprobs(values, indices) if logprobs else None,
                      rank if want_rank else None)

    def _sample(self, shard, temperature, top_k, top_p, min_p, seed, offset, state_rows,
                offset_rows, bitmask, repetition, frequency, presence, prompt_mask,
                output_counts, allowed_count, allowed_ids, bias_count, bias_ids, bias_values,
                min_len, stop_count, stop_ids, position, banned, n, want=True, want_rank=False,
                logit_values=False):
        shard = shard.contiguous()
        tokens = shard.shape[0]
        token = torch.empty((tokens,), dtype=torch.int64, device=self.device)
        lp = torch.empty((tokens if want else 0,), dtype=torch.float32, device=self.device)
        rank = torch.empty((tokens if want_rank else 0,), dtype=torch.int64, device=self.device)
        values = torch.empty((tokens, n), dtype=torch.float32, device=self.device)
        indices = torch.empty((tokens, n), dtype=torch.int64, device=self.device)
        # None (off) is NULL, which kl_sample reads as off without a tensor
        ptrs = [None if t is None else t.data_ptr()
                for t in (temperature, top_k, top_p, min_p, seed, offset, state_rows)]
        bits = [8 * t.element_size() if t is not None else 0 for t in (state_rows, offset_rows)]
        p = _capi.Sampling(ctypes.sizeof(_capi.Sampling), *ptrs,
                           0 if state_rows is None else temperature.shape[0],
                           None if offset_rows is None else offset_rows.data_ptr(),
                           0 if offset_rows is None else offset.shape[0], *bits,
                           *[None if t is None else t.data_ptr()
                             for t in (bitmask, repetition, frequency, presence, prompt_mask,
                                       output_counts)])
        lists = dict(allowed_count=allowed_count, allowed_ids=allowed_ids, bias_count=bias_count,
                     bias_ids=bias_ids, bias_values=bias_values, min_len=min_len,
                     stop_count=stop_count, stop_ids=stop_ids, position=position, banned=banned)
        for name, t in lists.items():
            if t is not None:
                setattr(p, name, t.data_ptr())
        for name, t in (("allowed", allowed_ids), ("bias", bias_ids), ("stop", stop_ids),
                        ("banned", banned)):
            if t is not None:
                setattr(p, name + "_width", t.shape[1])
        if want_rank:
            p.rank = rank.data_ptr()
        p.logit_values = int(logit_values)
        _capi.check(_capi.lib.kl_sample(
            self._ctx, shard.data_ptr(), ctypes.byref(p), token.data_ptr(),
            lp.data_ptr() if want else None,
            indices.data_ptr() if n else None, values.data_ptr() if n else None, n, tokens,
            _raw_stream(self.device.index)))
        return token, lp, values, indices, rank

    def _select(self, shard, topk, values):
        self._check(shard, None)
        shard = shard.contiguous()
        tokens, k = shard.shape[0], self.k if topk else 1
        shape = (tokens, k) if topk else (tokens,)
        index = torch.empty(shape, dtype=torch.int64, device=self.device)
        value = torch.empty(shape, dtype=torch.float32, device=self.device) if values else None
        vp = value.data_ptr() if value is not None else None
        stream = _raw_stream(self.device.index)
        if topk:
            lse = torch.empty((tokens,), dtype=torch.float32, device=self.device)
            _capi.check(_capi.lib.kl_topk(self._ctx, shard.data_ptr(), index.data_ptr(), vp,
                                          lse.data_ptr(), tokens, stream))
            return value, index, lse
        _capi.check(_capi.lib.kl_argmax(self._ctx, shard.data_ptr(), index.data_ptr(), vp, tokens,
                                        stream))
        return index, value

    def _check(self, shard, out):
        if self._ctx is None or not self._ctx.value:
            raise Error("this LogitsGather is closed")
        if not isinstance(shard, torch.Tensor):
            raise TypeError(f"shard must be a torch.Tensor, not {type(shard).__name__}")
        if shard.dtype != self.dtype:
            raise TypeError(f"shard has dtype {shard.dtype}, expected {self.dtype} (the spec's)")
        if shard.device != self.device:
            raise ValueError(f"shard is on {shard.device}, expected {self.device}")
        if shard.dim() != 2 or shard.shape[1] != self.shard or shard.shape[0] < 1:
            raise ValueError(f"shard has shape {tuple(shard.shape)}, expected [tokens >= 1, "
                             f"{self.shard}]")
        if out is None:
            return
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, not {type(out).__name__}")
        if out.dtype != self.out_dtype:
            raise TypeError(f"out has dtype {out.dtype}, expected {self.out_dtype}")
        if out.device != self.device:
            raise ValueError(f"out is on {out.device}, expected {self.device}")
        if tuple(out.shape) != (shard.shape[0], self.vocab_size):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected "
                             f"[{shard.shape[0]}, {self.vocab_size}]")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")

    def _run(self, shard, out):
        self._check(shard, out)
        shard = shard.contiguous()  # documented: a strided shard is copied first
        if out is None:
            out = torch.empty((shard.shape[0], self.vocab_size), dtype=self.out_dtype,
                              device=self.device)
        _capi.check(_capi.lib.kl_gather(self._ctx, shard.data_ptr(), out.data_ptr(),
                                        shard.shape[0], _raw_stream(self.device.index)))
        return out

    # ---- state ----

    def stats(self):
        """Calls per path, declines by reason, kl_sample calls the shards could not
        serve alone (sample_gathered), and what creation agreed."""
        st = _capi.Stats(size=ctypes.sizeof(_capi.Stats))
        _capi.check(_capi.lib.kl_ctx_stats(self._ctx, ctypes.byref(st)))
        return {
            "oneshot": st.oneshot, "nccl": st.nccl,
            "declined": dict(zip(_capi.DECLINES, st.declined)),
            "sample_gathered": st.sample_gathered, "staged": st.staged,
            "oneshot_ready": bool(st.oneshot_ready), "cache_hit": bool(st.cache_hit),
            "crossover_bytes": st.crossover_bytes, "not_ready": st.not_ready.decode(),
            "arch": st.arch.decode(),
        }

    def status(self):
        """Raises DeviceError, naming the peer and step, once a one-shot step timed out
        anywhere in the group (this rank's GPU holds the group's fault word). The fault
        is kept: this rank's later one-shot calls raise DeviceError too, while calls on
        the NCCL path run on, on every rank alike. close() on every rank to rebuild."""
        _capi.check(_capi.lib.kl_ctx_status(self._ctx))

    def close(self):
        """Collective: every rank closes. Waits for this rank's queued gathers."""
        if self._ctx is not None and self._ctx.value:
            with _lock:
                _live.pop(self._handle, None)
            r = _capi.lib.kl_ctx_destroy(self._ctx)
            self._ctx = None
            self._drop_comm()
            _capi.check(r)

    def _drop_comm(self):
        if self._own_comm is not None and self._own_comm.value:
            self._nccl.ncclCommDestroy(self._own_comm)
        self._own_comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if not (self._ctx and self._ctx.value) else f"rank {self.rank}/{self.nranks}"
        return f"<klgen.LogitsGather {getattr(self, 'name', '?')} {state} on {self.device}>"


def _gather(handle):
    g = _live.get(handle)
    if g is None:
        raise Error(f"no live LogitsGather with handle {handle} (closed?)")
    return g


@torch.library.custom_op("klgen::gather", mutates_args=())
def _gather_op(shard: torch.Tensor, handle: str) -> torch.Tensor:
    return _gather(handle)._run(shard, None)


def _fake_check(shard, g):
    if shard.dtype != g.dtype:
        raise TypeError(f"shard has dtype {shard.dtype}, expected {g.dtype} (the spec's)")
    if shard.dim() != 2:
        raise ValueError(f"shard has {shard.dim()} dimensions, expected [tokens, {g.shard}]")


@_gather_op.register_fake
def _(shard, handle):
    g = _gather(handle)
    _fake_check(shard, g)
    return shard.new_empty((shard.shape[0], g.vocab_size), dtype=g.out_dtype)


@torch.library.custom_op("klgen::argmax", mutates_args=())
def _argmax_op(shard: torch.Tensor, handle: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _gather(handle)._select(shard, 0, True)


@_argmax_op.register_fake
def _(shard, handle):
    _fake_check(shard, _gather(handle))
    return (shard.new_empty((shard.shape[0],), dtype=torch.int64),
            shard.new_empty((shard.shape[0],), dtype=torch.float32))


@torch.library.custom_op("klgen::topk", mutates_args=())
def _topk_op(shard: torch.Tensor, handle: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gather(handle)._select(shard, 1, True)


@_topk_op.register_fake
def _(shard, handle):
    g = _gather(handle)
    _fake_check(shard, g)
    tokens = shard.shape[0]
    return (shard.new_empty((tokens, g.k), dtype=torch.float32),
            shard.new_empty((tokens, g.k), dtype=torch.int64),
            shard.new_empty((tokens,), dtype=torch.float32))


# ---- sampling's arguments ----

_PER_ROW = (("temperature", torch.float32), ("top_k", torch.int32), ("top_p", torch.float32),
            ("min_p", torch.float32), ("seed", torch.int64), ("offset", torch.int64))
_OFF = {"temperature": None, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0, "offset": 0}


def _f32(x):
    """x rounded to float32 (beyond its range: an infinity)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _number(name, value, g):
    """A parameter given as a number, checked by the definition's rules
    (klgen.reference.check_sampling_args) in plain Python, so that
    torch.compile sees constants; returns the value each row gets."""
    if name in ("top_k", "seed", "offset"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or a tensor of one per row, not "
                            f"{type(value).__name__}")
        if name == "top_k":
            k = 0 if value >= g.vocab_size else value
            if not 0 <= k <= g.k:
                raise ValueError(f"top_k must be 0..{g.k} (the spec's topk), or >= the vocabulary "
                                 f"({g.vocab_size}: off), not {value}")
            return k
        if not -(1 << 63) <= value < 1 << 64:
            raise ValueError(f"{name} {value} is outside [-2**63, 2**64)")
        return value - (1 << 64) if value >= 1 << 63 else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a tensor of one per row, not "
                        f"{type(value).__name__}")
    if torch.compiler.is_compiling():
        # torch.compile may make a float symbolic: no Python test of its value
        # traces, so it is checked on the device, as a tensor's is
        return value
    v = _f32(float(value)) if abs(value) < 2**1024 else math.copysign(math.inf, value)
    ok = {"temperature": math.isfinite(v) and v >= 0, "top_p": 0 < v <= 1,
          "min_p": 0 <= v <= 1}[name]
    if not ok:
        rule = {"temperature": "finite and >= 0", "top_p": "in (0, 1]",
                "min_p": "in [0, 1]"}[name]
        raise ValueError(f"{name} must be {rule} (as a float32), not {value!r}")
    return v


def _logit_values(mode):
    """kl_sampling's logit_values for g.sample's logprobs_mode."""
    if mode == "raw_logprobs" or mode == "raw_logits":
        return mode == "raw_logits"
    if mode in ("processed_logprobs", "processed_logits"):
        raise ValueError(f"logprobs_mode {mode!r} is not kl_sample's (klgen.reference.sample "
                         "computes it): use 'raw_logprobs' or 'raw_logits'")
    raise ValueError(f"logprobs_mode must be 'raw_logprobs' or 'raw_logits', not {mode!r}")


def _sampling_args(g, tokens, *values):
    """kl_sampling's arrays from g.sample's arguments (the last of values is
    logprobs, the two before it state_rows and offset_rows): numbers checked
    here, tensors for dtype, shape and device (their values on the device).
    A parameter that is off (None, or a number whose value is the off one)
    is None, which kl_sample takes as NULL: a call with temperature alone
    fills one tensor, not six. Returns the six, then state_rows and
    offset_rows."""
    *params, state_rows, offset_rows, logprobs = values
    if isinstance(logprobs, bool) or not isinstance(logprobs, int):
        raise TypeError(f"logprobs must be an int, not {type(logprobs).__name__}")
    most = min(g.k, g.vocab_size)
    if not 0 <= logprobs <= most:
        raise ValueError(f"logprobs must be in [0, {most}] (the spec's topk), not {logprobs}")
    state_rows = _index_tensor(state_rows, "state_rows", tokens, g.device)
    offset_rows = _index_tensor(offset_rows, "offset_rows", tokens, g.device)
    states = _table_entries(params[:5], state_rows, "state_rows", _PER_ROW[:5],
                            "temperature, top_k, top_p, min_p or seed")
    offsets = _table_entries(params[5:], offset_rows, "offset_rows", _PER_ROW[5:], "offset")
    out = []
    for i, ((name, dtype), value) in enumerate(zip(_PER_ROW, params)):
        n = (states if i < 5 else offsets) or tokens
        if value is None:
            if _OFF[name] is None:
                raise TypeError(f"{name} is required")
            out.append(None)
        elif isinstance(value, torch.Tensor):
            out.append(_param_tensor(value, name, dtype, n, g))
        else:
            v = _number(name, value, g)
            # a symbolic float (torch.compile) is not compared: it is filled
            off = type(v) in (int, float) and v == _OFF[name]
            out.append(None if off else torch.full((n,), v, dtype=dtype, device=g.device))
    return out + [state_rows, offset_rows]


def _bitmask(t, tokens, g):
    """g.sample's bitmask: None, or an int32 tensor [tokens, ceil(vocab_size
    / 32)] on g's device, contiguous as kl_sample reads it."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        kind = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"bitmask must be an int32 tensor, not {kind}")
    words = (g.vocab_size + 31) // 32
    if t.dim() != 2 or tuple(t.shape) != (tokens, words):
        raise ValueError(f"bitmask has shape {tuple(t.shape)}, expected [{tokens}, {words}] "
                         f"(a row of ceil({g.vocab_size} / 32) words per token)")
    if t.device != g.device:
        raise ValueError(f"bitmask is on {t.device}, expected {g.device} (the shard's)")
    return t.contiguous()


_PENALTIES = (("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
              ("presence_penalty", 0.0))


def _penalty_number(name, value):
    """A penalty given as a number, checked as klgen.reference does (but
    under torch.compile, where it is checked on the device)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a float tensor, not {type(value).__name__}")
    if torch.compiler.is_compiling():
        return value
    v = _f32(float(value)) if abs(value) < 2**1024 else math.copysign(math.inf, value)
    rep = name == "repetition_penalty"
    if not math.isfinite(v) or (rep and v <= 0):
        rule = "finite and > 0" if rep else "finite"
        raise ValueError(f"{name} must be {rule} (as a float32), not {value!r}")
    return v


def _penalties(g, n, values, prompt_mask, output_counts):
    """kl_sampling's penalties from g.sample's (n: the tables' entries, or
    the rows): repetition, frequency, presence (None where off), then
    prompt_mask and output_counts. As klgen.reference.sample asks, a penalty
    comes with output_counts, repetition_penalty with prompt_mask too."""
    out = []
    for (name, off), value in zip(_PENALTIES, values):
        if value is None:
            out.append(None)
        elif isinstance(value, torch.Tensor):
            out.append(_param_tensor(value, name, torch.float32, n, g))
        else:
            v = _penalty_number(name, value)
            off = type(v) in (int, float) and v == off
            out.append(None if off else torch.full((n,), v, dtype=torch.float32, device=g.device))
    if all(v is None for v in values):
        if prompt_mask is not None or output_counts is not None:
            raise ValueError("prompt_mask and output_counts are the penalties' tables: pass "
                             "repetition_penalty, frequency_penalty or presence_penalty with them")
        return out + [None, None]
    if output_counts is None:
        raise ValueError("the penalties need output_counts (each request's output token counts)")
    if values[0] is not None and prompt_mask is None:
        raise ValueError("repetition_penalty needs prompt_mask (each request's prompt tokens)")
    prompt = None if prompt_mask is None else _table(
        prompt_mask, "prompt_mask", torch.int32, (n, (g.vocab_size + 31) // 32), g)
    return out + [prompt, _table(output_counts, "output_counts", torch.int32, (n, g.vocab_size),
                                 g)]


def _table(t, name, dtype, shape, g):
    """A penalty's or a list's array: a tensor of dtype and shape (None: any
    width, >= 1) on g's device, contiguous as kl_sample reads it."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype:
        kind = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a {dtype} tensor, not {kind}")
    if t.dim() != len(shape) or any(w is not None and w != v for w, v in zip(shape, t.shape)) \
            or (len(shape) == 2 and t.shape[1] < 1):
        want = ", ".join("width >= 1" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [{want}]")
    if t.device != g.device:
        raise ValueError(f"{name} is on {t.device}, expected {g.device} (the shard's)")
    return t.contiguous()


def _id_list(value, name, n, g, with_values=False):
    """A per-request list (count [n], ids [n, width][, values]): its tensors."""
    parts = 3 if with_values else 2
    if not isinstance(value, (tuple, list)) or len(value) != parts:
        kind = "(count, ids, values)" if with_values else "(count, ids)"
        raise TypeError(f"{name} must be a tuple {kind} of tensors")
    count = _table(value[0], f"{name} count", torch.int32, (n,), g)
    ids = _table(value[1], f"{name} ids", torch.int32, (n, None), g)
    if not with_values:
        return [count, ids]
    values = _table(value[2], f"{name} values", torch.float32, (n, ids.shape[1]), g)
    return [count, ids, values]


def _lists(g, n, tokens, allowed_token_ids, logit_bias, min_tokens, position, banned):
    """kl_sampling's lists from g.sample's (n: the tables' entries, or the
    rows): allowed count and ids, bias count, ids and values, min_len, stop
    count and ids, position, banned; None where off."""
    out = [None] * 10
    if allowed_token_ids is not None:
        out[0:2] = _id_list(allowed_token_ids, "allowed_token_ids", n, g)
    if logit_bias is not None:
        out[2:5] = _id_list(logit_bias, "logit_bias", n, g, with_values=True)
    if min_tokens is not None:
        if not isinstance(min_tokens, (tuple, list)) or len(min_tokens) != 4:
            raise TypeError("min_tokens must be a tuple (min_len, count, stop_ids, restore) of "
                            "tensors (restore None)")
        if min_tokens[3] is not None:
            raise ValueError("min_tokens' restore (vLLM's restore_when_all_masked) is not served "
                             "on the shards: it is not a function of a column; pass None")
        out[5] = _table(min_tokens[0], "min_tokens min_len", torch.int32, (n,), g)
        out[6:8] = _id_list(min_tokens[1:3], "min_tokens stop", n, g)
    if position is not None:
        if min_tokens is None:
            raise ValueError("position is used by min_tokens only: pass min_tokens with it")
        out[8] = _table(position, "position", torch.int64, (tokens,), g)
    if banned is not None:
        out[9] = _table(banned, "banned", torch.int32, (tokens, None), g)
    return out


def _index_tensor(t, name, tokens, device):
    """state_rows or offset_rows: None, or an int32 or int64 tensor [tokens]
    on device (kl_sample reads either as it is)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        kind = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be an int32 or int64 tensor, not {kind}")
    if t.dim() != 1 or t.shape[0] != tokens:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [{tokens}] (one per row)")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the shard's)")
    return t.contiguous()


def _table_entries(values, index, index_name, names, which):
    """The entries of the tables index reads (None without it): the length
    every tensor among values has."""
    if index is None:
        return None
    tables = [(n, v) for (n, _), v in zip(names, values) if isinstance(v, torch.Tensor)]
    if not tables:
        raise ValueError(f"{index_name} indexes tables: pass {which} as a tensor")
    n = tables[0][1].shape[0] if tables[0][1].dim() == 1 else 0
    for name, v in tables:
        if v.dim() != 1 or v.shape[0] != n or n < 1:
            raise ValueError(f"with {index_name}, {', '.join(t for t, _ in tables)} must be 1-D "
                             f"tables of one length >= 1; {name} has shape {tuple(v.shape)}")
    return n


def _param_tensor(t, name, dtype, n, g):
    """A parameter tensor of n entries as kl_sample reads it: top_k as int32
    (a k outside int32 clamped to one of the same meaning: negative, or >=
    the vocabulary), the others of their dtype."""
    if dtype.is_floating_point != t.dtype.is_floating_point or (
            name in ("seed", "offset") and t.dtype != torch.int64):
        want = "an int64" if name in ("seed", "offset") else (
            "a floating-point" if dtype.is_floating_point else "an integer")
        raise TypeError(f"{name} must be {want} tensor, not {t.dtype}")
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [{n}] (one per row, or "
                         f"per entry of the tables state_rows or offset_rows index)")
    if t.device != g.device:
        raise ValueError(f"{name} is on {t.device}, expected {g.device} (the shard's)")
    if name == "top_k" and t.dtype != torch.int32:
        t = t.clamp(-1, g.vocab_size)
    return t.to(dtype).contiguous()


@torch.library.custom_op("klgen::sample", mutates_args=())
def _sample_op(shard: torch.Tensor, temperature: torch.Tensor, top_k: Optional[torch.Tensor],
               top_p: Optional[torch.Tensor], min_p: Optional[torch.Tensor],
               seed: Optional[torch.Tensor], offset: Optional[torch.Tensor],
               state_rows: Optional[torch.Tensor], offset_rows: Optional[torch.Tensor],
               bitmask: Optional[torch.Tensor], repetition: Optional[torch.Tensor],
               frequency: Optional[torch.Tensor], presence: Optional[torch.Tensor],
               prompt_mask: Optional[torch.Tensor], output_counts: Optional[torch.Tensor],
               allowed_count: Optional[torch.Tensor], allowed_ids: Optional[torch.Tensor],
               bias_count: Optional[torch.Tensor], bias_ids: Optional[torch.Tensor],
               bias_values: Optional[torch.Tensor], min_len: Optional[torch.Tensor],
               stop_count: Optional[torch.Tensor], stop_ids: Optional[torch.Tensor],
               position: Optional[torch.Tensor], banned: Optional[torch.Tensor],
               logprobs: int, token_logprobs: bool, ranks: bool, logit_values: bool,
               handle: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     torch.Tensor]:
    g = _gather(handle)
    g._check(shard, None)
    return g._sample(shard, temperature, top_k, top_p, min_p, seed, offset, state_rows,
                     offset_rows, bitmask, repetition, frequency, presence, prompt_mask,
                     output_counts, allowed_count, allowed_ids, bias_count, bias_ids,
                     bias_values, min_len, stop_count, stop_ids, position, banned, logprobs,
                     token_logprobs, ranks, logit_values)


@_sample_op.register_fake
def _(shard, temperature, top_k, top_p, min_p, seed, offset, state_rows, offset_rows, bitmask,
      repetition, frequency, presence, prompt_mask, output_counts, allowed_count, allowed_ids,
      bias_count, bias_ids, bias_values, min_len, stop_count, stop_ids, position, banned,
      logprobs, token_logprobs, ranks, logit_values, handle):
    _fake_check(shard, _gather(handle))
    tokens = shard.shape[0]
    return (shard.new_empty((tokens,), dtype=torch.int64),
            shard.new_empty((tokens if token_logprobs else 0,), dtype=torch.float32),
            shard.new_empty((tokens, logprobs), dtype=torch.float32),
            shard.new_empty((tokens, logprobs), dtype=torch.int64),
            shard.new_empty((tokens if ranks else 0,), dtype=torch.int64))


@torch.library.custom_op("klgen::gather_out", mutates_args=("out",))
def _gather_out_op(shard: torch.Tensor, out: torch.Tensor, handle: str) -> None:
    _gather(handle)._run(shard, out)


@_gather_out_op.register_fake
def _(shard, out, handle):
    return None
