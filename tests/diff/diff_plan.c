/* A step's plan (see diff_case.h): which calls in which order, where their
 * outputs lie, which a rank is late for. */
#include <string.h>

#include "diff_case.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* An offset for a buffer of element size `elem`: aligned most of the time,
 * else off by whole elements, now and then by any byte count. */
static size_t misalign(rng *r, size_t elem) {
  double u = rng_unit(r);
  if (u < 0.65) return 0;
  if (u < 0.95) return elem * (size_t)rng_range(r, 1, 15);
  return (size_t)rng_range(r, 1, 15);
}

/* An output placed on the shard: out (the gather's) or an index (argmax's or
 * top-k's). The runtime must stage the shard; the test uploads it again
 * before each op, and runs the op whose output overlaps last, so that no
 * upload lands on an output that is still to be read back. */
static void overlap(case_run *run, rng *r, step_plan *p, size_t ib, size_t ob) {
  int op = (int)rng_below(r, 3);
  int present = -1;
  for (int i = 0; i < p->nops; i++)
    if (p->ops[i] == op) present = i;
  if (present < 0 || (op == OP_TOPK && !run->c->spec.topk)) return;
  p->overlap = 1;
  p->ops[present] = p->ops[p->nops - 1];
  p->ops[p->nops - 1] = op;
  if (op == OP_GATHER) {
    size_t oelem = (size_t)run->c->layout.out_elem_bytes;
    size_t lo = p->in_at + 1 > ob ? p->in_at + 1 - ob : 0, hi = p->in_at + ib - 1;
    size_t o = (lo + (size_t)rng_below(r, (uint64_t)(hi - lo + 1))) / oelem * oelem;
    p->out_at = o < lo ? o + oelem : o;
  } else {
    p->sel_at[op == OP_ARGMAX ? 0 : 2] = align_up(p->in_at + ib / 3, 8);
  }
}

void diff_plan_step(case_run *run, rng *r, step_plan *p, int tokens, int allow_overlap) {
  const diff_case *c = run->c;
  const diff_env *env = run->env;
  memset(p, 0, sizeof *p);
  p->tokens = tokens;
  p->ops[p->nops++] = OP_GATHER;
  if (rng_chance(r, 0.8)) p->ops[p->nops++] = OP_ARGMAX;
  if (c->spec.topk && rng_chance(r, 0.8)) p->ops[p->nops++] = OP_TOPK;
  if (c->spec.topk && rng_chance(r, 0.6)) {
    p->ops[p->nops++] = OP_SAMPLE;
    int most = c->spec.topk < c->spec.vocab_size ? c->spec.topk : (int)c->spec.vocab_size;
    p->n_top = rng_chance(r, 0.5) ? (int)rng_range(r, 1, most) : 0;
    p->want_lp = rng_chance(r, 0.8);
    p->nulls = rng_chance(r, 0.3) ? (unsigned)rng_below(r, 32) : 0;
    /* two in five the shard sampler's calls: no filter, no top-n (a stream
     * of its own: the knob came after seeds were replayed) */
    rng sr = rng_for(c->seed, 0x5a4d0000ull + (uint64_t)run->planned);
    if (rng_chance(&sr, 0.4)) p->nulls |= 7, p->n_top = 0;
    /* per-request tables read through state_rows and offset_rows */
    rng ir = rng_for(c->seed, 0x57a70000ull + (uint64_t)run->planned);
    if (rng_chance(&ir, 0.3)) p->states = (int)rng_range(&ir, 1, DIFF_MAX_ROWS);
    if (rng_chance(&ir, 0.3)) p->offsets = (int)rng_range(&ir, 1, DIFF_MAX_ROWS);
    p->states_bits = rng_chance(&ir, 0.5) ? 32 : 64;
    p->offsets_bits = rng_chance(&ir, 0.5) ? 32 : 64;
    /* a grammar's bitmask, from a stream of its own */
    rng mr = rng_for(c->seed, 0x6d61736b0000ull + (uint64_t)run->planned);
    p->masked = rng_chance(&mr, 0.35);
    /* penalties, where their counts fit the arena: a stream of its own too */
    rng pr = rng_for(c->seed, 0x70656e000000ull + (uint64_t)run->planned);
    const int entries = table_entries(p);
    p->penalized = (size_t)entries * (size_t)c->spec.vocab_size <= DIFF_ELEM_BUDGET &&
                   rng_chance(&pr, 0.35);
    p->pen_nulls = rng_chance(&pr, 0.3) ? (unsigned)rng_below(&pr, 32) : 0;
    /* the tokens' ranks: a stream of their own */
    rng kr = rng_for(c->seed, 0x72616e6b0000ull + (uint64_t)run->planned);
    p->want_rank = rng_chance(&kr, 0.3);
    /* logits instead of logprobs (vLLM's raw_logits): a stream of its own */
    rng vr = rng_for(c->seed, 0x6c6f67697473ull + (uint64_t)run->planned);
    p->logit_values = rng_chance(&vr, 0.25);
    /* lists (allowed ids, logit bias, min_tokens, banned ids): a stream of
     * their own; rows at most the arena's widths, now and then one wide */
    rng lr = rng_for(c->seed, 0x6c6973740000ull + (uint64_t)run->planned);
    p->listed = rng_chance(&lr, 0.35);
    p->lists = p->listed ? (unsigned)rng_range(&lr, 1, 31) : 0;
    if (!(p->lists & 4)) p->lists &= ~16u; /* position is min_tokens' alone */
    static const int widest[4] = {DIFF_LIST_WIDTH_ALLOWED, DIFF_LIST_WIDTH_BIAS,
                                DIFF_LIST_WIDTH_STOP, DIFF_LIST_WIDTH_BANNED};
    for (int i = 0; i < 4; i++)
      p->widths[i] = (int)(rng_chance(&lr, 0.8) ? rng_range(&lr, 1, widest[i] < 12 ? widest[i] : 12)
                                                : rng_range(&lr, 1, widest[i]));
  }
  for (int i = p->nops - 1; i > 0; i--) { /* in any order */
    int j = (int)rng_below(r, (uint64_t)i + 1), t = p->ops[i];
    p->ops[i] = p->ops[j], p->ops[j] = t;
  }
  /* from a stream of its own: the knob came after seeds were replayed */
  rng lr = rng_for(c->seed, 0x1a7e0000ull + (uint64_t)run->planned++);
  p->late_rank = run->tp > 1 && rng_chance(&lr, 0.2) ? (int)rng_below(&lr, (uint64_t)run->tp) : -1;
  p->late_at = (int)rng_below(&lr, (uint64_t)p->nops);
  /* at most a tenth of the poll limit: late, never given up on */
  const int64_t most_us = c->spec.timeout_ms < 200 ? (int64_t)c->spec.timeout_ms * 100 : 20000;
  p->late_us = (int)rng_range(&lr, most_us < 200 ? 0 : 200, most_us);
  p->value = rng_chance(r, 0.85);
  p->lse = rng_chance(r, 0.85);
  size_t elem = (size_t)c->layout.elem_bytes, oelem = (size_t)c->layout.out_elem_bytes;
  size_t ib = in_bytes(run, tokens), ob = out_bytes(run, tokens);
  p->in_at = misalign(r, elem);
  p->out_at = env->out_area + misalign(r, oelem);
  size_t sz[5];
  sel_sizes(run, tokens, sz);
  size_t base = env->sel_area;
  for (int i = 0; i < 5; i++) {
    p->sel_at[i] = base + (rng_chance(r, 0.3) ? (i == 0 || i == 2 ? 8 : 4) * (size_t)rng_range(r, 1, 7) : 0);
    base = align_up(p->sel_at[i] + sz[i] + 1, 256);
  }
  if (allow_overlap && rng_chance(r, 0.12)) overlap(run, r, p, ib, ob);
}

int diff_draw_tokens(const diff_case *c, rng *r) {
  int max = (int)c->spec.max_tokens;
  if (c->extra_tokens > 0 && rng_chance(r, 0.25)) return max + (int)rng_range(r, 1, c->extra_tokens);
  double u = rng_unit(r);
  return u < 0.2 ? 1 : u < 0.35 ? max : (int)rng_range(r, 1, max);
}
