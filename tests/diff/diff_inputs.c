/* A step's inputs and their reference (see diff_case.h): hostile rows
 * split into each rank's shard, the values the gather must deliver (the
 * epilogue with the device's tanhf), kl_sample's parameters per row, and
 * the selections and samples diff_ref.c and diff_sample.c give for them. */
#include <math.h>
#include <string.h>

#include "diff_case.h"

static void make_inputs(case_run *run, rng *r, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  int64_t padded = c->layout.padded_vocab, shard = c->layout.shard;
  int elem = c->layout.elem_bytes;
  for (int t = 0; t < tokens; t++)
    diff_fill_row(r, (int)c->spec.dtype, (int)rng_below(r, (uint64_t)diff_row_kinds()),
                  ref->rows + (size_t)t * (size_t)padded, c->spec.vocab_size, padded);
  for (int k = 0; k < run->tp; k++) {
    unsigned char *h = run->env->slots[k].h_in;
    for (int t = 0; t < tokens; t++) {
      const uint32_t *src = ref->rows + (size_t)t * (size_t)padded + (size_t)k * (size_t)shard;
      for (int64_t j = 0; j < shard; j++) {
        size_t at_ = ((size_t)t * (size_t)shard + (size_t)j) * (size_t)elem;
        if (elem == 2) {
          uint16_t v = (uint16_t)src[j];
          memcpy(h + at_, &v, 2);
        } else {
          memcpy(h + at_, &src[j], 4);
        }
      }
    }
  }
}

/* The epilogue's outputs, with tanhf from the device. */
static void reference_values(case_run *run, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  diff_env *env = run->env;
  epilogue e;
  epilogue_of(&c->spec, &e);
  int64_t vocab = c->spec.vocab_size, padded = c->layout.padded_vocab;
  size_t n = (size_t)tokens * (size_t)vocab;
  for (int t = 0; t < tokens; t++)
    for (int64_t j = 0; j < vocab; j++) {
      uint32_t b = ref->rows[(size_t)t * (size_t)padded + (size_t)j];
      if (b == neg_zero(e.dtype)) b = 0; /* the selections read -0 as +0, as the gather has it */
      float x = elem_to_f(e.dtype, b);
      size_t i = (size_t)t * (size_t)vocab + (size_t)j;
      ref->vals[i] = x;
      if (e.has_cap) env->h_targ[i] = epilogue_arg(&e, x);
    }
  if (!e.on) return;
  if (e.has_cap) diff_device_tanh(env, n);
  for (size_t i = 0; i < n; i++) {
    uint32_t o = epilogue_finish(&e, ref->vals[i], e.has_cap ? env->h_tout[i] : 0.0f);
    ref->gbits[i] = o;
    ref->vals[i] = e.out_dtype == KL_FP32 ? elem_to_f(KL_FP32, o) : elem_to_f(e.dtype, o);
  }
}

/* Entries of a table a row reads through an index array of `bits`-bit
 * entries: mostly one of the n, now and then one outside (the row must
 * draw -1). */
static void draw_rows(rng *r, void *rows, int bits, int tokens, int n) {
  for (int t = 0; t < tokens; t++) {
    int64_t i = (int64_t)rng_below(r, (uint64_t)n);
    if (rng_chance(r, 0.02)) i = rng_chance(r, 0.5) ? -1 : (rng_chance(r, 0.5) ? n : INT32_MIN);
    if (bits == 32) ((int32_t *)rows)[t] = (int32_t)i;
    else ((int64_t *)rows)[t] = i == INT32_MIN ? INT64_MIN : i;
  }
}

/* kl_sample's parameters for the step's rows, into the pinned block every
 * rank uploads: each filter alone and together, their edges, greedy rows,
 * and now and then a row outside the domain (it must draw -1); with the
 * plan's tables, entries past the rows' and the rows' indices into them. */
static void draw_sample_params(case_run *run, rng *r, int tokens) {
  const diff_env *env = run->env;
  const step_plan *p = &run->plan;
  const long long v = run->c->spec.vocab_size, cap = run->c->spec.topk;
  static const float temps[] = {0.f, 0.f, 1e-3f, 0.37f, 0.7f, 1.f, 1.f, 1.7f, 9.5f};
  static const float ps[] = {1.f, 1.f, 1.f, 1e-7f, 0.05f, 0.5f, 0.9f, 0.99999f};
  static const float mps[] = {0.f, 0.f, 0.f, 1e-6f, 0.05f, 0.3f, 0.999f, 1.f};
  float *T = host_param(env, P_T), *P = host_param(env, P_TOP_P), *MP = host_param(env, P_MIN_P);
  int32_t *K = host_param(env, P_TOP_K);
  uint64_t *S = host_param(env, P_SEED), *O = host_param(env, P_OFFSET);
  /* the tables' entries past the rows, and the indices, from a stream of
   * their own (they came after seeds were replayed) */
  rng ir = rng_for(run->c->seed, 0x57a80000ull + (uint64_t)run->planned);
  const int n = p->states > tokens ? p->states : tokens;
  for (int i = 0; i < n; i++) {
    rng *q = i < tokens ? r : &ir;
    const long long ks[] = {0, 0, 1, 2, cap, v, v + 3, cap + 1};
    T[i] = temps[rng_below(q, sizeof temps / sizeof *temps)];
    P[i] = ps[rng_below(q, sizeof ps / sizeof *ps)];
    MP[i] = mps[rng_below(q, sizeof mps / sizeof *mps)];
    K[i] = (int32_t)ks[rng_below(q, rng_chance(q, 0.95) ? 7 : 8)];
    S[i] = rng_next(q);
    O[i] = rng_below(q, 1ull << 40);
    if (rng_chance(q, 0.03)) T[i] = rng_chance(q, 0.5) ? -1.f : NAN;
  }
  for (int i = tokens; i < p->offsets; i++) O[i] = rng_below(&ir, 1ull << 40);
  if (p->states) draw_rows(&ir, host_param(env, P_STATE_ROWS), p->states_bits, tokens, p->states);
  if (p->offsets)
    draw_rows(&ir, host_param(env, P_OFFSET_ROWS), p->offsets_bits, tokens, p->offsets);
}

/* Row t's entry of a table of n entries (n 0: the row's own), through an
 * index array of `bits`-bit entries, or -1. */
static int64_t entry(const diff_env *env, int which, int bits, int t, int n) {
  if (!n) return t;
  const void *rows = host_param(env, which);
  const int64_t i = bits == 32 ? ((const int32_t *)rows)[t] : ((const int64_t *)rows)[t];
  return i >= 0 && i < n ? i : -1;
}

static int row_penalties(const case_run *run, int t, float v[3]);
static int row_lists_ok(const case_run *run, int t);

/* Row t's parameters as kl_sample reads them (NULL arrays off, 0); 0 where
 * they are outside the domain (its penalties too), or an index outside its
 * table. */
static int row_params(const case_run *run, int t, sample_args *a, uint64_t *seed,
                      uint64_t *offset) {
  const diff_env *env = run->env;
  const unsigned nulls = run->plan.nulls;
  const long long v = run->c->spec.vocab_size;
  const step_plan *pl = &run->plan;
  const int64_t s = entry(env, P_STATE_ROWS, pl->states_bits, t, pl->states);
  const int64_t o = entry(env, P_OFFSET_ROWS, pl->offsets_bits, t, pl->offsets);
  memset(a, 0, sizeof *a);
  *seed = *offset = 0;
  if (s < 0 || o < 0) return 0;
  const int64_t k = (nulls & 1) ? 0 : ((int32_t *)host_param(env, P_TOP_K))[s];
  a->temperature = ((float *)host_param(env, P_T))[s];
  a->top_k = k >= v ? 0 : k;
  a->top_p = (nulls & 2) ? 1.f : ((float *)host_param(env, P_TOP_P))[s];
  a->min_p = (nulls & 4) ? 0.f : ((float *)host_param(env, P_MIN_P))[s];
  *seed = (nulls & 8) ? 0 : ((uint64_t *)host_param(env, P_SEED))[s];
  *offset = (nulls & 16) ? 0 : ((uint64_t *)host_param(env, P_OFFSET))[o];
  float pen[3];
  return a->temperature >= 0.f && isfinite(a->temperature) && a->top_p > 0.f && a->top_p <= 1.f &&
         a->min_p >= 0.f && a->min_p <= 1.f && a->top_k >= 0 && a->top_k <= run->c->spec.topk &&
         row_penalties(run, t, pen) && row_lists_ok(run, t);
}

/* The step's bitmask, row by row (diff_env's h_mask): no grammar (all
 * ones), nothing kept, a few columns, half of them, nearly all; the bits
 * past the vocabulary random (kl_sample must not read them). */
static void draw_mask(case_run *run, int tokens) {
  const int64_t vocab = run->c->spec.vocab_size;
  const size_t words = mask_words(run);
  rng mr = rng_for(run->c->seed, 0x6d61736c0000ull + (uint64_t)run->planned);
  for (int t = 0; t < tokens; t++) {
    uint32_t *w = run->env->h_mask + (size_t)t * words;
    const double u = rng_unit(&mr);
    const int kind = u < 0.2 ? 0 : u < 0.3 ? 1 : u < 0.55 ? 2 : u < 0.8 ? 3 : 4;
    for (size_t i = 0; i < words; i++)
      w[i] = kind == 0 ? 0xffffffffu : kind == 3 ? (uint32_t)(rng_next(&mr) >> 32) : 0;
    if (kind == 2)
      for (int64_t k = rng_range(&mr, 1, vocab < 40 ? vocab : 40); k > 0; k--) {
        const uint64_t c = rng_below(&mr, (uint64_t)vocab);
        w[c / 32] |= 1u << (c % 32);
      }
    if (kind == 4)
      for (int64_t c = 0; c < vocab; c++)
        if (!rng_chance(&mr, 0.03)) w[c / 32] |= 1u << (c % 32);
    if (vocab % 32) w[words - 1] |= (uint32_t)(rng_next(&mr) >> 32) << (vocab % 32);
  }
}

/* A penalty value: mostly off or in vLLM's range, now and then outside
 * the domain (the row must draw -1). */
static float draw_penalty(rng *r, int which) {
  static const float reps[] = {1.f, 1.f, 0.5f, 0.9f, 1.1f, 1.3f, 2.f, 1e-3f, 1e3f};
  static const float lins[] = {0.f, 0.f, 0.1f, 0.5f, -0.5f, 1.f, 2.f, -2.f, 1e-30f};
  if (rng_chance(r, 0.02)) {
    static const float bad[] = {NAN, INFINITY, -INFINITY, 0.f, -1.f};
    return bad[rng_below(r, which == 0 ? 5 : 3)];
  }
  if (rng_chance(r, 0.3)) return which == 0 ? (float)(0.2 + 2.8 * rng_unit(r)) : (float)(4 * rng_unit(r) - 2);
  return which == 0 ? reps[rng_below(r, 9)] : lins[rng_below(r, 9)];
}

/* The step's penalties, an entry of the tables at a time (diff_env's h_pen):
 * the three values, the prompt's bits (none, a few, half; random past the
 * vocabulary) and the output counts (none, a few columns, a third of them,
 * now and then one beyond float's 2^24 steps). */
static void draw_penalties(case_run *run) {
  const int64_t vocab = run->c->spec.vocab_size;
  const size_t words = mask_words(run);
  const int n = table_entries(&run->plan);
  rng pr = rng_for(run->c->seed, 0x70656e640000ull + (uint64_t)run->planned);
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 3; k++) pen_values(run->env, k)[i] = draw_penalty(&pr, k);
    uint32_t *w = pen_prompt(run->env) + (size_t)i * words;
    const int pk = (int)rng_below(&pr, 3);
    for (size_t j = 0; j < words; j++) w[j] = pk == 2 ? (uint32_t)(rng_next(&pr) >> 32) : 0;
    if (pk == 1)
      for (int64_t k = rng_range(&pr, 1, 20); k > 0; k--) {
        const uint64_t c = rng_below(&pr, (uint64_t)vocab);
        w[c / 32] |= 1u << (c % 32);
      }
    if (vocab % 32) w[words - 1] |= (uint32_t)(rng_next(&pr) >> 32) << (vocab % 32);
    int32_t *cnt = pen_counts(run->env) + (size_t)i * (size_t)vocab;
    const int ck = (int)rng_below(&pr, 3);
    for (int64_t c = 0; c < vocab; c++)
      cnt[c] = ck == 2 && rng_chance(&pr, 0.33) ? (int32_t)rng_range(&pr, 1, 4) : 0;
    if (ck == 1)
      for (int64_t k = rng_range(&pr, 1, 40); k > 0; k--)
        cnt[rng_below(&pr, (uint64_t)vocab)] += (int32_t)rng_range(&pr, 1, 9);
    if (ck && rng_chance(&pr, 0.1)) cnt[rng_below(&pr, (uint64_t)vocab)] = 20000001;
  }
}

/* Row t's penalties (as kl_sample reads them: NULL arrays off); 0 where
 * they are outside the domain. */
static int row_penalties(const case_run *run, int t, float v[3]) {
  const step_plan *p = &run->plan;
  const int64_t s = entry(run->env, P_STATE_ROWS, p->states_bits, t, p->states);
  static const float off[3] = {1.f, 0.f, 0.f};
  for (int k = 0; k < 3; k++)
    v[k] = !p->penalized || (p->pen_nulls >> k & 1) || s < 0 ? off[k] : pen_values(run->env, k)[s];
  return v[0] > 0.f && isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2]);
}

/* ---- the lists: allowed ids, logit bias, min_tokens, banned ids ---- */

/* An id of a list: mostly anywhere in the vocabulary, often among a few
 * (repeats), now and then past it (the row must draw -1). */
static int32_t draw_id(rng *r, int64_t vocab) {
  if (rng_chance(r, 0.004)) return (int32_t)(vocab + (int64_t)rng_below(r, 3));
  if (rng_chance(r, 0.002)) return -1 - (int32_t)rng_below(r, 3);
  if (rng_chance(r, 0.3)) return (int32_t)rng_below(r, (uint64_t)(vocab < 6 ? vocab : 6));
  return (int32_t)rng_below(r, (uint64_t)vocab);
}

/* A list's count: empty, full, in between; now and then outside [0, width]. */
static int32_t draw_count(rng *r, int width) {
  if (rng_chance(r, 0.01)) return rng_chance(r, 0.5) ? -1 : width + 1;
  const double u = rng_unit(r);
  return u < 0.2 ? 0 : u < 0.4 ? width : (int32_t)rng_range(r, 0, width);
}

/* A bias: small, large, tiny; now and then not finite (the row draws -1). */
static float draw_bias(rng *r) {
  if (rng_chance(r, 0.005)) {
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    return bad[rng_below(r, 3)];
  }
  const double u = rng_unit(r);
  if (u < 0.6) return (float)(10 * rng_unit(r) - 5);
  if (u < 0.8) return rng_chance(r, 0.5) ? -100.f : 100.f;
  if (u < 0.9) return rng_chance(r, 0.5) ? -0.f : 0.f;
  return (float)(rng_chance(r, 0.5) ? -1e30 : 3e38);
}

/* The step's lists, entry by entry of their tables (diff_env's h_list):
 * every array drawn whether or not the step passes it. */
static void draw_lists(case_run *run, int tokens) {
  const int64_t vocab = run->c->spec.vocab_size;
  const int n = table_entries(&run->plan), *w = run->plan.widths;
  rng lr = rng_for(run->c->seed, 0x6c6973640000ull + (uint64_t)run->planned);
  int32_t *ac = list_array(run->env, L_ALLOWED_COUNT), *bc = list_array(run->env, L_BIAS_COUNT);
  int32_t *ml = list_array(run->env, L_MIN_LEN), *sc = list_array(run->env, L_STOP_COUNT);
  int32_t *ai = list_array(run->env, L_ALLOWED_IDS), *bi = list_array(run->env, L_BIAS_IDS);
  int32_t *si = list_array(run->env, L_STOP_IDS), *bn = list_array(run->env, L_BANNED);
  float *bv = list_array(run->env, L_BIAS_VALUES);
  int64_t *pos = list_array(run->env, L_POSITION);
  for (int i = 0; i < n; i++) {
    ac[i] = draw_count(&lr, w[0]), bc[i] = draw_count(&lr, w[1]), sc[i] = draw_count(&lr, w[2]);
    for (int j = 0; j < w[0]; j++) ai[i * w[0] + j] = draw_id(&lr, vocab);
    for (int j = 0; j < w[1]; j++) bi[i * w[1] + j] = draw_id(&lr, vocab), bv[i * w[1] + j] = draw_bias(&lr);
    for (int j = 0; j < w[2]; j++) si[i * w[2] + j] = draw_id(&lr, vocab);
    /* around the positions, or past every offset (min_tokens on) */
    ml[i] = rng_chance(&lr, 0.1) ? INT32_MAX : (int32_t)rng_range(&lr, -2, 60);
  }
  for (int t = 0; t < tokens; t++) {
    pos[t] = (int64_t)rng_range(&lr, 0, 58);
    for (int j = 0; j < w[3]; j++) {
      const int32_t id = draw_id(&lr, vocab);
      bn[t * w[3] + j] = rng_chance(&lr, 0.3) ? -1 - (int32_t)rng_below(&lr, 5) : id < 0 ? 0 : id;
    }
  }
}

/* Row t's lists as kl_sample reads them, from the step's arrays: its
 * entry s of the tables (-1: none, the row draws -1 anyway), and whether
 * min_tokens' stop ids are on (its position + 1 below min_len). */
typedef struct row_lists {
  int64_t s;
  int allowed, bias, stop, banned; /* the step passes the list */
  int stopping;                    /* min_tokens is on: the stop ids are -inf */
} row_lists;
static row_lists lists_of(const case_run *run, int t) {
  const step_plan *p = &run->plan;
  const diff_env *env = run->env;
  row_lists l = {entry(env, P_STATE_ROWS, p->states_bits, t, p->states), 0, 0, 0, 0, 0};
  if (!p->listed || l.s < 0) return l;
  l.allowed = p->lists & 1, l.bias = p->lists >> 1 & 1, l.banned = p->lists >> 3 & 1;
  if (p->lists & 4) {
    const int64_t o = entry(env, P_OFFSET_ROWS, p->offsets_bits, t, p->offsets);
    const int64_t pos = (p->lists & 16) ? ((int64_t *)list_array(env, L_POSITION))[t]
                        : o < 0 || (p->nulls & 16) ? 0
                                                   : (int64_t)((uint64_t *)host_param(env, P_OFFSET))[o];
    l.stop = 1;
    l.stopping = pos < (int64_t)((int32_t *)list_array(env, L_MIN_LEN))[l.s] - 1;
  }
  return l;
}

/* Whether ids[0 .. n) lie in the vocabulary (with `padded`, a negative
 * entry is padding). */
static int ids_in(const int32_t *ids, int n, int64_t vocab, int padded) {
  for (int j = 0; j < n; j++)
    if ((ids[j] < 0 && !padded) || ids[j] >= vocab) return 0;
  return 1;
}

/* Entry s's list `which` (0 allowed, 1 bias, 2 stop): its count, ids and
 * (bias) values. */
typedef struct id_list {
  int32_t n;
  const int32_t *ids;
  const float *values;
} id_list;
static id_list list_of(const case_run *run, int which, int64_t s) {
  static const int count_at[3] = {L_ALLOWED_COUNT, L_BIAS_COUNT, L_STOP_COUNT};
  static const int ids_at[3] = {L_ALLOWED_IDS, L_BIAS_IDS, L_STOP_IDS};
  const int w = run->plan.widths[which];
  const diff_env *env = run->env;
  return (id_list){((int32_t *)list_array(env, count_at[which]))[s],
                   (int32_t *)list_array(env, ids_at[which]) + s * w,
                   (float *)list_array(env, L_BIAS_VALUES) + s * w};
}

/* Whether row t's lists are in kl_sample's domain: counts within their
 * widths, ids within the vocabulary, biases finite. */
static int row_lists_ok(const case_run *run, int t) {
  const row_lists l = lists_of(run, t);
  const int64_t vocab = run->c->spec.vocab_size;
  const int *w = run->plan.widths, on[3] = {l.allowed, l.bias, l.stop};
  for (int k = 0; k < 3; k++) {
    if (!on[k]) continue;
    const id_list a = list_of(run, k, l.s);
    if (a.n < 0 || a.n > w[k] || !ids_in(a.ids, a.n, vocab, 0)) return 0;
    for (int j = 0; k == 1 && j < a.n; j++)
      if (!isfinite(a.values[j])) return 0;
  }
  return !l.banned ||
         ids_in((int32_t *)list_array(run->env, L_BANNED) + (int64_t)t * w[3], w[3], vocab, 1);
}

/* vLLM's order before the penalties, on row t's values x: the allowed ids
 * alone where its list is not empty, each listed column's bias (its last
 * entry's; a -0 sum is +0), the stop ids -inf while min_tokens is on. */
static void lists_before(const case_run *run, int t, float *x) {
  if (!row_lists_ok(run, t)) return; /* it draws -1 */
  const row_lists l = lists_of(run, t);
  const int64_t vocab = run->c->spec.vocab_size;
  if (l.allowed) {
    const id_list a = list_of(run, 0, l.s);
    for (int64_t c = 0; c < vocab && a.n > 0; c++) {
      int listed = 0;
      for (int j = 0; j < a.n && !listed; j++) listed = a.ids[j] == c;
      if (!listed) x[c] = -INFINITY;
    }
  }
  if (l.bias) {
    const id_list b = list_of(run, 1, l.s);
    for (int j = 0; j < b.n; j++) {
      int later = 0; /* a later entry of the same id is the one that counts */
      for (int k = j + 1; k < b.n && !later; k++) later = b.ids[k] == b.ids[j];
      if (!later) x[b.ids[j]] = (x[b.ids[j]] + b.values[j]) + 0.f;
    }
  }
  if (l.stopping) {
    const id_list a = list_of(run, 2, l.s);
    for (int j = 0; j < a.n; j++) x[a.ids[j]] = -INFINITY;
  }
}

/* After the penalties: the banned ids -inf. */
static void lists_after(const case_run *run, int t, float *x) {
  if (!row_lists_ok(run, t)) return;
  const row_lists l = lists_of(run, t);
  const int w = run->plan.widths[3];
  const int32_t *ids = (int32_t *)list_array(run->env, L_BANNED) + (int64_t)t * w;
  for (int j = 0; l.banned && j < w; j++)
    if (ids[j] >= 0) x[ids[j]] = -INFINITY;
}

/* The values kl_sample draws from and those of its logprobs: the gathered
 * ones, with the step's bitmask -inf where a bit is clear, then (the
 * draws') its penalties. */
static const float *sampled_values(const case_run *run, const ref_step *ref) {
  return run->plan.masked || run->plan.penalized || run->plan.listed ? ref->svals : ref->vals;
}
static const float *logprob_values(const case_run *run, const ref_step *ref) {
  return run->plan.masked ? ref->lvals : ref->vals;
}

static void mask_values(case_run *run, ref_step *ref, int tokens) {
  const int64_t vocab = run->c->spec.vocab_size;
  const size_t words = mask_words(run);
  for (int t = 0; t < tokens; t++) {
    const uint32_t *w = run->env->h_mask + (size_t)t * words;
    const size_t o = (size_t)t * (size_t)vocab;
    for (int64_t c = 0; c < vocab; c++)
      ref->lvals[o + (size_t)c] = w[c / 32] >> (c % 32) & 1u ? ref->vals[o + (size_t)c] : -INFINITY;
  }
}

/* The penalties on svals, in place. */
static void penalize_values(case_run *run, ref_step *ref, int tokens) {
  const step_plan *p = &run->plan;
  const int64_t vocab = run->c->spec.vocab_size;
  const size_t words = mask_words(run);
  const float *in = ref->svals;
  for (int t = 0; t < tokens; t++) {
    const size_t o = (size_t)t * (size_t)vocab;
    float v[3];
    const int64_t s = entry(run->env, P_STATE_ROWS, p->states_bits, t, p->states);
    if (!p->penalized || !row_penalties(run, t, v) || s < 0)
      continue;  /* no penalties, or a row that draws -1 */
    const uint32_t *w = (p->pen_nulls & 8) ? NULL : pen_prompt(run->env) + (size_t)s * words;
    const int32_t *cnt = (p->pen_nulls & 16) ? NULL : pen_counts(run->env) + (size_t)s * (size_t)vocab;
    for (int64_t c = 0; c < vocab; c++) {
      const int seen = w && (w[c / 32] >> (c % 32) & 1u);
      ref->svals[o + (size_t)c] = sample_penalized(in[o + (size_t)c], cnt ? cnt[c] : 0, seen, v[0], v[1], v[2]);
    }
  }
}

/* kl_sample's reference inputs, before the ranks start (the main thread
 * makes no CUDA call while they run: an error of theirs must reach compare,
 * not end the run here): each row's parameters, its tempered values t (in
 * h_targ) and the device's noise and expf for them (h_tg, h_tout). */
static void sample_inputs(case_run *run, ref_step *ref, int tokens) {
  diff_env *env = run->env;
  const int64_t vocab = run->c->spec.vocab_size;
  diff_noise_row *rows = env->h_srow;
  if (run->plan.masked) {
    draw_mask(run, tokens);
    mask_values(run, ref, tokens);
  }
  /* svals: the logprobs' values, then in vLLM's order the lists before
   * the penalties, the penalties, the banned ids */
  const size_t row = (size_t)vocab;
  if (run->plan.masked || run->plan.penalized || run->plan.listed)
    memcpy(ref->svals, logprob_values(run, ref), 4 * (size_t)tokens * row);
  if (run->plan.listed) {
    draw_lists(run, tokens);
    for (int t = 0; t < tokens; t++) lists_before(run, t, ref->svals + (size_t)t * row);
  }
  if (run->plan.penalized) {
    draw_penalties(run);
    penalize_values(run, ref, tokens);
  }
  for (int t = 0; run->plan.listed && t < tokens; t++) lists_after(run, t, ref->svals + (size_t)t * row);
  const float *vals = sampled_values(run, ref);
  for (int r = 0; r < tokens; r++) {
    ref->sok[r] = row_params(run, r, &ref->sargs[r], &rows[r].seed, &rows[r].offset);
    ref->sm[r] = sample_tempered(vals + (size_t)r * (size_t)vocab, vocab,
                                 ref->sargs[r].temperature, env->h_targ + (size_t)r * (size_t)vocab);
    rows[r].m = isfinite(ref->sm[r]) ? ref->sm[r] : 0.f;
  }
  diff_device_noise(env, vocab, tokens, (int)run->c->spec.noise);
}

/* What kl_sample's logprob outputs hold for a logit x of a row whose largest
 * is mx and log-sum ls: its logprob, or with logit_values x itself. */
static float logprob_value(const case_run *run, float x, double mx, double ls) {
  return run->plan.logit_values ? x : sample_logprob_at(x, mx, ls);
}

/* kl_sample's reference (diff_sample.c) on the values the gather delivers. */
static void reference_samples(case_run *run, ref_step *ref, int tokens) {
  const diff_env *env = run->env;
  const int64_t vocab = run->c->spec.vocab_size;
  const int n = run->plan.n_top;
  int64_t top[64];
  const float *lvals = logprob_values(run, ref);
  for (int r = 0; r < tokens; r++) {
    const float *x = lvals + (size_t)r * (size_t)vocab;
    const size_t o = (size_t)r * (size_t)vocab;
    const int ok = ref->sok[r];
    double mx;
    const double ls = sample_log_sum(x, vocab, &mx);
    ref->tok[r] = ok ? sample_token(env->h_targ + o, ref->sm[r], vocab, &ref->sargs[r],
                                    env->h_tout + o, env->h_tg + o, NULL)
                     : -1;
    ref->lp[r] = ok ? logprob_value(run, x[ref->tok[r]], mx, ls) : NAN;
    ref->rank[r] = ok ? sample_rank(x, vocab, ref->tok[r]) : -1;
    if (n) sample_top(x, vocab, n, top);
    for (int j = 0; j < n; j++) {
      const size_t i = (size_t)r * (size_t)n + (size_t)j;
      ref->tidx[i] = ok ? top[j] : -1;
      ref->tlp[i] = ok ? logprob_value(run, x[top[j]], mx, ls) : NAN;
    }
  }
}

static void reference_selections(case_run *run, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  int64_t vocab = c->spec.vocab_size;
  int k = c->spec.topk;
  for (int t = 0; t < tokens; t++) {
    const float *v = ref->vals + (size_t)t * (size_t)vocab;
    ref_topk(v, vocab, 1, &ref->idx1[t], &ref->val1[t]);
    if (k) {
      ref_topk(v, vocab, k, ref->idxk + (size_t)t * (size_t)k, ref->valk + (size_t)t * (size_t)k);
      ref->lse[t] = ref_lse(v, vocab);
    }
  }
}

void diff_step_inputs(case_run *run, rng *r, ref_step *ref) {
  const int tokens = run->plan.tokens;
  make_inputs(run, r, ref, tokens);
  reference_values(run, ref, tokens);
  if (has_op(&run->plan, OP_SAMPLE)) {
    draw_sample_params(run, r, tokens);
    sample_inputs(run, ref, tokens);
  }
}

void diff_step_reference(case_run *run, ref_step *ref) {
  reference_selections(run, ref, run->plan.tokens);
  if (has_op(&run->plan, OP_SAMPLE)) reference_samples(run, ref, run->plan.tokens);
}
