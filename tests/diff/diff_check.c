/* A step's outputs against the reference (see diff_case.h): each call's
 * result code and path by the dispatch rule, and every output bit for bit
 * (logprobs and lse within their tolerance); a failure is a fault where the
 * library reported a peer's time-out as it must, else a defect. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "diff_case.h"

static const char *const path_names[] = {"one-shot", "NCCL"};

/* Whether the step's kl_sample goes to the shard sampler (runtime/sample.c):
 * no top-n, and on the NCCL path no filter array. */
static int sample_by_shards(const step_plan *p, int path) {
  return !sample_gathers(p) && (path == PATH_ONESHOT || (p->nulls & 7) == 7);
}

/* The path the dispatch rule gives (docs/design/dispatch.md): the same on every rank. */
static int expected_path(const case_run *run, int op, int tokens, long long crossover) {
  const diff_case *c = run->c;
  if (c->disable || tokens > c->spec.max_tokens) return PATH_NCCL;
  int nccl_everywhere = run->tp == 1 || c->has_nccl;
  long long bytes = (long long)tokens * c->layout.shard_bytes;
  /* kl_sample moves its rows only with top-n, or a logprob and penalties or lists
   * (with filters one-shot, the crossover leaves it alone: runtime/sample.c
   * gathers) */
  int moves = op == OP_GATHER || (op == OP_SAMPLE && sample_gathers(&run->plan));
  if (moves && nccl_everywhere && bytes > crossover) return PATH_NCCL;
  return PATH_ONESHOT;
}

static int is_nan_bits(uint32_t b, int elem) {
  return elem == 4 ? (b & 0x7fffffffu) > 0x7f800000u : (b & 0x7fffu) > 0x7c00u;
}

static int is_nan16(uint32_t b, int dtype) {
  return dtype == KL_BF16 ? (b & 0x7fffu) > 0x7f80u : (b & 0x7fffu) > 0x7c00u;
}

/* Each check returns the count of wrong outputs and adds to *poison those of
 * them that are poison (NaN, index -1): what a dead step must give. */
static long long check_gather(case_run *run, const ref_step *ref, int rank, int path, int tokens,
                              long long *poison, char *first, size_t n) {
  const diff_case *c = run->c;
  epilogue e;
  epilogue_of(&c->spec, &e);
  const unsigned char *got = run->env->slots[rank].h_out;
  int oelem = c->layout.out_elem_bytes;
  int64_t vocab = c->spec.vocab_size, padded = c->layout.padded_vocab;
  long long bad = 0;
  for (int t = 0; t < tokens; t++)
    for (int64_t j = 0; j < vocab; j++) {
      size_t i = (size_t)t * (size_t)vocab + (size_t)j;
      uint32_t g = 0, want;
      memcpy(&g, got + i * (size_t)oelem, (size_t)oelem);
      int ok;
      if (e.on) {
        want = ref->gbits[i];
        ok = g == want || (oelem == 4 ? is_nan_bits(g, 4) && is_nan_bits(want, 4)
                                      : is_nan16(g, e.out_dtype) && is_nan16(want, e.out_dtype));
      } else {
        want = ref->rows[(size_t)t * (size_t)padded + (size_t)j];
        /* the one-shot path reads -0 as +0 (its sentinel); NCCL moves bits */
        if (path == PATH_ONESHOT && want == neg_zero(e.dtype)) want = 0;
        ok = g == want;
      }
      if (ok) continue;
      *poison += oelem == 4 ? is_nan_bits(g, 4) : is_nan16(g, e.out_dtype);
      if (bad++ == 0)
        snprintf(first, n, "row %d col %lld: got 0x%x, want 0x%x", t, (long long)j, g, want);
    }
  return bad;
}

static long long check_selection(case_run *run, const ref_step *ref, int rank, int op, int tokens,
                                 long long *poison, char *first, size_t n) {
  const diff_case *c = run->c;
  const diff_slot *s = &run->env->slots[rank];
  const step_plan *p = &run->plan;
  int k = op == OP_TOPK ? c->spec.topk : 1;
  const int64_t *gi = op == OP_TOPK ? s->h_idxk : s->h_idx1;
  const uint32_t *gv = op == OP_TOPK ? s->h_valk : s->h_val1;
  const int64_t *wi = op == OP_TOPK ? ref->idxk : ref->idx1;
  const uint32_t *wv = op == OP_TOPK ? ref->valk : ref->val1;
  long long bad = 0;
  for (int t = 0; t < tokens; t++) {
    const long long bad_before = bad;
    float lse_t;
    memcpy(&lse_t, &s->h_lse[t], 4);
    int poisoned = op != OP_TOPK || !p->lse || isnan(lse_t);
    for (int q = 0; q < k; q++) {  /* a dead step poisons a token whole */
      size_t i = (size_t)t * (size_t)k + (size_t)q;
      poisoned &= gi[i] == -1 && (!p->value || is_nan_bits(gv[i], 4));
    }
    for (int q = 0; q < k; q++) {
      size_t i = (size_t)t * (size_t)k + (size_t)q;
      int ok = gi[i] == wi[i] && (!p->value || gv[i] == wv[i]);
      if (ok) continue;
      if (bad++ == 0)
        snprintf(first, n, "row %d [%d]: got index %lld value 0x%08x, want %lld 0x%08x", t, q,
                 (long long)gi[i], p->value ? gv[i] : 0u, (long long)wi[i], p->value ? wv[i] : 0u);
    }
    if (op == OP_TOPK && p->lse) {
      float got;
      memcpy(&got, &s->h_lse[t], 4);
      if (!lse_close(got, ref->lse[t]) && bad++ == 0)
        snprintf(first, n, "row %d: lse %.9g, want %.12g", t, (double)got, ref->lse[t]);
    }
    if (poisoned) *poison += bad - bad_before;
  }
  return bad;
}

/* A logprob output against the reference's: close, or with logit_values
 * (the logits themselves) equal. */
static int lp_close(const step_plan *p, float got, float want) {
  if (isnan(want)) return isnan(got);
  if (got == want) return 1;
  return !p->logit_values && fabsf(got - want) <= 2e-6f * fabsf(want) + 1e-12f;
}

/* A row of kl_sample's outputs as a dead step leaves it: token -1, NaN logprobs. */
static int sample_row_poisoned(const diff_slot *s, const step_plan *p, int t) {
  if (s->h_tok[t] != -1 || (p->want_lp && !isnan(s->h_lp[t])) || (p->want_rank && s->h_rank[t] != -1))
    return 0;
  for (int j = 0; j < p->n_top; j++) {
    const size_t i = (size_t)t * (size_t)p->n_top + (size_t)j;
    if (s->h_tidx[i] != -1 || !isnan(s->h_tlp[i])) return 0;
  }
  return 1;
}

static long long check_sample(case_run *run, const ref_step *ref, int rank, int tokens,
                              long long *poison, char *first, size_t n) {
  const diff_slot *s = &run->env->slots[rank];
  const step_plan *p = &run->plan;
  const int k = p->n_top;
  long long bad = 0;
  for (int t = 0; t < tokens; t++) {
    const int ok = s->h_tok[t] == ref->tok[t] && (!p->want_lp || lp_close(p, s->h_lp[t], ref->lp[t])) &&
                   (!p->want_rank || s->h_rank[t] == ref->rank[t]);
    int top_bad = -1;
    for (int j = 0; j < k && top_bad < 0; j++) {
      const size_t i = (size_t)t * (size_t)k + (size_t)j;
      if (s->h_tidx[i] != ref->tidx[i] || !lp_close(p, s->h_tlp[i], ref->tlp[i])) top_bad = j;
    }
    if (ok && top_bad < 0) continue;
    *poison += sample_row_poisoned(s, p, t);
    if (bad++) continue;
    if (!ok)
      snprintf(first, n, "row %d: token %lld logprob %a rank %lld, want %lld %a %lld", t,
               (long long)s->h_tok[t], p->want_lp ? (double)s->h_lp[t] : 0.0,
               p->want_rank ? (long long)s->h_rank[t] : 0LL, (long long)ref->tok[t],
               (double)ref->lp[t], p->want_rank ? (long long)ref->rank[t] : 0LL);
    else {
      const size_t i = (size_t)t * (size_t)k + (size_t)top_bad;
      snprintf(first, n, "row %d top %d: column %lld logprob %a, want %lld %a", t, top_bad,
               (long long)s->h_tidx[i], (double)s->h_tlp[i], (long long)ref->tidx[i],
               (double)ref->tlp[i]);
    }
  }
  return bad;
}

/* Whether a step's group died: a peer's time-out, reported by kl_ctx_status. */
static int step_dead(const case_run *run) {
  for (int rank = 0; rank < run->tp; rank++)
    if (run->rep[rank].status_rc == KLRT_EDEVICE) return 1;
  return 0;
}

void diff_compare(case_run *run, const ref_step *ref, long long crossover, const char *label,
                    int standin_gave_up) {
  diff_env *env = run->env;
  const diff_case *c = run->c;
  const step_plan *p = &run->plan;
  int before = env->case_failures;
  if (step_dead(run)) run->dead = 1;
  if (standin_gave_up) run->standin_broke = 1;
  float late_ms = 0;
  const int late = diff_held_back(run, &late_ms);
  if (late >= 0 && !env->case_stalled) {
    env->case_stalled = 1;
    snprintf(env->stall_note, sizeof env->stall_note,
             "%.60s: rank %d's stream started %.0f ms after the first rank's", label, late,
             (double)late_ms);
  }
  for (int rank = 0; rank < run->tp; rank++) {
    const rank_report *rep = &run->rep[rank];
    if (rep->cuda_failed) diff_failf(env, c, DEFECT, "%s rank %d: %s", label, rank, rep->cuda_err);
    /* a dead group's fault once (every rank says it), any other status always */
    if (rep->status_rc != KLRT_OK &&
        (rep->status_rc != KLRT_EDEVICE || rank == 0 || run->rep[0].status_rc == KLRT_OK))
      diff_failf(env, c, rep->status_rc == KLRT_EDEVICE ? FAULT : DEFECT,
                 "%s rank %d: kl_ctx_status: %s", label, rank, rep->status);
    for (int i = 0; i < p->nops; i++) {
      int op = p->ops[i];
      int want_path = expected_path(run, op, p->tokens, crossover);
      if (rep->rc[op] != KLRT_OK) {
        diff_failf(env, c,
                   rep->rc[op] == KLRT_EDEVICE && run->dead && want_path == PATH_ONESHOT ? FAULT
                                                                                        : DEFECT,
                   "%s rank %d: %s returned %s: %s", label, rank, op_name(op),
                   kl_result_name(rep->rc[op]), rep->err[op]);
        continue;
      }
      if (!p->replay && rep->path[op] != want_path)
        diff_failf(env, c, DEFECT, "%s rank %d: %s took the %s path, the rule says %s", label, rank,
                   op_name(op), rep->path[op] < 0 ? "unknown" : path_names[rep->path[op]],
                   path_names[want_path]);
      if (p->capture) continue; /* nothing ran */
      char first[200] = "";
      long long poison = 0;
      long long bad =
          op == OP_GATHER   ? check_gather(run, ref, rank, want_path, p->tokens, &poison, first,
                                           sizeof first)
          : op == OP_SAMPLE ? check_sample(run, ref, rank, p->tokens, &poison, first, sizeof first)
                            : check_selection(run, ref, rank, op, p->tokens, &poison, first,
                                              sizeof first);
      env->cov.sampled += op == OP_SAMPLE;
      env->cov.by_shards += op == OP_SAMPLE && sample_by_shards(p, want_path);
      env->cov.filtered_shards += op == OP_SAMPLE && sample_by_shards(p, want_path) && (p->nulls & 7) != 7;
      env->cov.masked += op == OP_SAMPLE && p->masked;
      env->cov.penalized += op == OP_SAMPLE && sample_has_penalty(p);
      env->cov.listed += op == OP_SAMPLE && sample_has_lists(p);
      env->cov.ranked += op == OP_SAMPLE && p->want_rank;
      env->cov.logits += op == OP_SAMPLE && p->logit_values && (p->want_lp || p->n_top);
      env->cov.calls++;
      env->cov.path[want_path]++;
      int excused = (run->dead && poison == bad && want_path == PATH_ONESHOT) ||
                    (run->standin_broke && want_path == PATH_NCCL);
      if (bad)
        diff_failf(env, c, excused ? FAULT : DEFECT,
                   "%s rank %d: %s (%s path, tokens %d%s): %lld wrong (%lld poison), first %s (the "
                   "call: %.2f ms on the host, %lld staged)", label, rank, op_name(op),
                   path_names[want_path], p->tokens, p->overlap ? ", overlapping" : "", bad, poison,
                   first, rep->host_ms[op], rep->staged[op]);
    }
  }
  if (before == 0 && env->case_failures > 0 && !p->capture) diff_host_times(run, label);
}
