"""What both drop-ins share: the gathers of one engine layer, made on first use,
and the torch implementation of klgen's contract that stands in for libklrt
where there is no GPU (backend "torch": CPU tests, gloo groups).

A layer learns its shard width and dtype only from its first logits, so its
gathers are made then, one per spec (creation is collective: every TP rank
asks for the same spec in the same call, as it does for the gather itself).
"""

import collections
import weakref

import torch
import torch.distributed as dist

from . import check_backend

# The one-shot path serves up to this many rows per step; more rows take
# libklrt's NCCL path (same result). Receive memory grows with it:
# 3 x tp x MAX_TOKENS rows of a shard per rank.
MAX_TOKENS = 64

# kl_topk's k is at most 64 (specs/README.md); a larger k stays with the engine.
MAX_TOPK = 64


_live = weakref.WeakSet()


def stats(what):
    """Gathers.stats() of every live Gathers of the engine `what`."""
    return [g.stats() for g in list(_live) if g.what == what]


class Gathers:
    """The gathers of one engine layer, keyed by spec, each made on first use.

    Gathers(backend, group, log, what, **about): backend "klgen" (LogitsGather
    on the layer's GPU) or "torch" (TorchGather); group the TP group's
    torch.distributed group; log a logging.Logger; what names the engine in
    log lines and specs; about (the layer's vocabulary...) goes into stats().
    Counts its calls by use ("forward", "argmax", ...).
    """

    def __init__(self, backend, group, log, what, **about):
        self.backend = check_backend(backend, "Gathers")
        self.group, self.log, self.what, self.about = group, log, what, about
        self.tp = dist.get_world_size(group)
        self.specs = {}
        self._by_call = {}  # get()'s arguments -> the gather of their spec
        self.calls = collections.Counter()
        self.declined = collections.Counter()
        self._told = set()
        _live.add(self)

    def unfit(self, rows, device, gather=True):
        """Why a call on `rows` rows on `device` cannot take klgen, or None.
        gather=False: a selection or a sample, which klgen also serves at TP
        1 (from the whole row, faster than the engines' torch there)."""
        if gather and self.tp == 1:
            return "TP 1: nothing to gather"
        if rows == 0:
            return "no rows"
        if self.backend == "klgen" and device.type != "cuda":
            return f"logits on {device}, not a CUDA device"
        return None

    def get(self, use, logits, **fields):
        """The gather of the spec `fields` for shards like `logits` ([rows,
        shard]), counted as a call of `use`."""
        call = (logits.shape[-1], logits.dtype, logits.device, *fields.items())
        g = self._by_call.get(call)
        if g is None:
            g = self._by_call[call] = self._spec_gather(logits, fields)
        self.calls[use] += 1
        return g

    def _spec_gather(self, logits, fields):
        """The gather of a call get() has not seen: one per spec, whatever
        order or None fields a call gives it in."""
        shard = logits.shape[-1]
        fields = {k: v for k, v in fields.items() if v is not None}
        key = (shard, logits.dtype, logits.device, tuple(sorted(fields.items())))
        g = self.specs.get(key)
        if g is None:
            g = self.specs[key] = self._make(shard, logits, fields)
        return g

    def _make(self, shard, logits, fields):
        name = f"{self.what}_v{fields['vocab_size']}_s{shard}_{len(self.specs)}"
        g = new_gather(self.backend, group=self.group, device=logits.device, name=name,
                       padded_vocab=self.tp * shard, dtype=logits.dtype,
                       max_tokens=MAX_TOKENS, **fields)
        self.log.debug("klgen: %s: %s gather %s (%s)", self.what, self.backend, name,
                       ", ".join(f"{k} {v}" for k, v in sorted(fields.items())))
        return g

    def decline(self, use, reason):
        """Counts a call of `use` left to the engine, logging each reason once."""
        self.declined[use] += 1
        if (use, reason) not in self._told:
            self._told.add((use, reason))
            self.log.debug("klgen: %s: %s stays with the engine: %s", self.what, use, reason)

    def stats(self):
        """Calls served by klgen and left to the engine, by use, and each
        gather's own stats() (libklrt's path counts)."""
        return {**self.about, "backend": self.backend, "calls": dict(self.calls),
                "declined": dict(self.declined),
                "gathers": {g.name: g.stats() for g in self.specs.values()}}

    def close(self):
        """Collective, as LogitsGather.close is."""
        for g in self.specs.values():
            g.close()
        self.specs.clear()
        self._by_call.clear()


def new_gather(backend, **fields):
    """A LogitsGather ("klgen") or a TorchGather ("torch") of the same fields."""
    if check_backend(backend, "new_gather") == "torch":
        return TorchGather(**fields)
    from .._torch import LogitsGather
    return LogitsGather(**fields)


class TorchGather:
    """klgen's contract in torch ops, for machines without a GPU.

    TorchGather(*, vocab_size, padded_vocab, dtype, max_tokens, name,
    group=None, device=None, out_dtype=None, softcap=None, scale=1.0,
    topk=0, noise="philox"): what LogitsGather of the same fields returns, computed from a
    torch.distributed all-gather of the shards (any backend, gloo included):

    - g(shard, out=None): the rank-order concat, sliced to vocab_size, through the
      epilogue: the engine's own torch ops (x / softcap, tanh, * softcap,
      * scale, each in dtype, then out_dtype) -- what numerics "engine" is
      defined to equal; -0.0 comes out as +0.0, as from the one-shot path;
      written into out ([tokens, vocab_size] of out_dtype) where given;
    - g.argmax(shard): over those values, NaN largest, ties to the lowest
      column; values in fp32;
    - g.topk(shard): the k largest, ties to the lowest column, NaN largest and
      canonical, values in fp32, and the log-sum-exp of the whole row;
    - g.sample(shard, temperature, ...): klgen.reference.sample of those
      values with the spec's noise, top_k at most k; a parameter outside the domain raises
      ValueError here (LogitsGather's device gives such a row token -1).

    max_tokens has no effect (there is no one-shot path); stats() counts calls.
    """

    def __init__(self, *, vocab_size, padded_vocab, dtype, max_tokens, name, group=None,
                 device=None, out_dtype=None, softcap=None, scale=1.0, topk=0,
                 noise="philox"):
        self.group = group if group is not None else dist.group.WORLD
        self.tp = dist.get_world_size(self.group)
        if padded_vocab % self.tp or not 0 < vocab_size <= padded_vocab:
            raise ValueError(f"{name}: vocab {vocab_size} padded to {padded_vocab} does not "
                             f"split over {self.tp} ranks")
        self.name, self.vocab_size, self.shard = name, vocab_size, padded_vocab // self.tp
        self.dtype, self.out_dtype = dtype, out_dtype or dtype
        self.max_tokens, self.device = max_tokens, device
        self.softcap, self.scale, self.k, self.noise = softcap, scale, topk, noise
        self.calls = 0

    def __call__(self, shard, out=None):
        x = self._gathered(shard)
        if self.softcap is not None:
            x = x / self.softcap
            x = torch.tanh(x)
            x = x * self.softcap
        if self.scale != 1.0:
            x = x * self.scale
        if out is None:
            return x.to(self.out_dtype)
        if out.shape != x.shape or out.dtype != self.out_dtype:
            raise ValueError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}, expected "
                             f"{list(x.shape)} of {self.out_dtype}")
        return out.copy_(x)

    def argmax(self, shard, *, values=False):
        x = self(shard).float()
        cols = torch.arange(x.shape[1], device=x.device).expand_as(x)
        nan = x.isnan()
        best = torch.where(nan, float("-inf"), x).amax(dim=1, keepdim=True)
        # the first NaN if the row has one, else the first of the largest
        hit = torch.where(nan.any(dim=1, keepdim=True), nan, x == best)
        index = torch.where(hit, cols, x.shape[1]).amin(dim=1)
        if not values:
            return index
        return index, x.gather(1, index[:, None])[:, 0]

    def topk(self, shard):
        if not self.k:
            raise ValueError(f"spec '{self.name}' has no topk field")
        from .._torch import TopK
        x = self(shard).float()
        # one NaN and one zero, so that equal values tie (a sort orders bits)
        x = torch.where(x.isnan(), float("nan"), torch.where(x == 0, 0.0, x))
        order = torch.sort(x, dim=1, descending=True, stable=True)
        return TopK(order.values[:, :self.k], order.indices[:, :self.k],
                    torch.logsumexp(x, dim=1))

    def sample(self, shard, temperature, top_k=None, top_p=None, min_p=None, *, seed=0,
               offset=0, state_rows=None, offset_rows=None, bitmask=None, logprobs=0,
               token_logprobs=True, ranks=False, logprobs_mode="raw_logprobs", **penalties):
        if not self.k:
            raise ValueError(f"spec '{self.name}' has no topk field")
        if not 0 <= logprobs <= min(self.k, self.vocab_size):
            raise ValueError(f"logprobs must be in [0, {min(self.k, self.vocab_size)}] (the "
                             f"spec's topk), not {logprobs}")
        from .. import reference
        from .._torch import Sample, TopLogprobs, _logit_values
        _logit_values(logprobs_mode)  # kl_sample's modes alone, as LogitsGather
        x = self(shard)
        reference.check_sampling_args(x.shape[0], self.vocab_size, x.device, temperature, top_k,
                                      top_p, min_p, seed, offset, logprobs, max_top_k=self.k,
                                      state_rows=state_rows, offset_rows=offset_rows)
        out = reference.sample(x, temperature, top_k, top_p, min_p, seed=seed, offset=offset,
                               state_rows=state_rows, offset_rows=offset_rows,
                               bitmask=bitmask, logprobs=logprobs, noise=self.noise,
                               logprobs_mode=logprobs_mode, **penalties)
        top = TopLogprobs(out.top_logprobs, out.top_indices) if logprobs else None
        return Sample(out.tokens, out.logprob if token_logprobs else None, top,
                      out.rank if ranks else None)

    def _gathered(self, shard):
        if shard.dim() != 2 or shard.shape[1] != self.shard or shard.dtype != self.dtype:
            raise ValueError(f"shard has shape {tuple(shard.shape)} and dtype {shard.dtype}, "
                             f"expected [tokens, {self.shard}] of {self.dtype}")
        self.calls += 1
        parts = [torch.empty_like(shard) for _ in range(self.tp)]
        dist.all_gather(parts, shard.contiguous(), group=self.group)
        x = torch.cat(parts, dim=1)[:, :self.vocab_size]
        return torch.where(x == 0, torch.zeros_like(x), x)  # -0.0 as +0.0

    def stats(self):
        return {"torch": self.calls}

    def close(self):
        pass
