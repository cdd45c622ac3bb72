/* kl_sample's route (docs/design/samplers.md). A call without top-n
 * logprobs goes to the shard sampler (shards.cu.tmpl), a select kernel: its
 * rows never move, only each part's record does (select.c's paths). With
 * filters (top_k, top_p or min_p given) only the one-shot path serves it:
 * the records carry each part's candidates, and a row they cannot decide is
 * copied from every rank's staged rows into the context's scratch and
 * sampled there by the CTA that merged it, as the row sampler would, in the
 * same kernel (the device counts such a call in sample_gathered). Every
 * other call takes the gathering path, counted in sample_gathered when its
 * path is chosen: the logits are gathered into
 * the scratch by the gather's own paths (one-shot, or NCCL and the
 * relayout; the layer chooses as for kl_gather, every rank alike), then the
 * row sampler draws each row's token there, a greedy, plain-temperature or
 * min-p-alone row over up to the layout's sample_slices CTAs (slices_for). Either way
 * every rank draws with the same noise from the same values, so every rank
 * gets the same tokens, and both samplers give the same ones. The choice
 * depends on which arguments are NULL and on the path, alike on every
 * rank. */
#include <stdint.h>
#include <stdio.h>

#include "rt.h"

static size_t row_bytes(const kl_ctx *c) {
  return (size_t)c->spec.vocab_size * (size_t)c->layout.out_elem_bytes;
}

/* A bitmask row's int32 words: a bit for each column of the vocabulary. */
static int64_t mask_words(const kl_ctx *c) { return ((int64_t)c->spec.vocab_size + 31) / 32; }

/* Whether the call has a penalty (repetition, frequency or presence). */
static int has_penalties(const kl_sampling *p) {
  return p->repetition_penalty || p->frequency_penalty || p->presence_penalty;
}

/* Whether the call has lists (allowed ids, logit bias, min_tokens, banned). */
static int has_lists(const kl_sampling *p) {
  return p->allowed_count || p->bias_count || p->stop_count || p->banned;
}

/* Whether the call has processors beyond the grammar: its draws and its
 * logprobs then read different logits (the logprobs the raw ones, the
 * grammar applied). */
static int has_processors(const kl_sampling *p) { return has_penalties(p) || has_lists(p); }

/* token [tokens] int64, logprob [tokens] fp32, top_index and top_logprob
 * [tokens, n_top] int64 and fp32, rank [tokens] int64. Before check: an
 * n_top it refuses sizes nothing here. */
static void measure(const kl_ctx *c, kl_call *k) {
  (void)c;
  const int n_top = ((const kl_sample_call *)k->extra)->n_top;
  const size_t n = (size_t)k->tokens, top = n * (size_t)(n_top > 0 ? n_top : 0);
  k->out[0].bytes = n * 8;
  k->out[1].bytes = n * 4;
  k->out[2].bytes = top * 8;
  k->out[3].bytes = top * 4;
  k->out[4].bytes = n * 8;
}

static kl_result has_topk(const kl_ctx *c) {
  if (c->spec.topk) return KLRT_OK;
  return kl_rt_fail(KLRT_EINVAL, "kl_sample: spec '%s' has no topk field (add topk = K to it: "
                    "the sampler's capacity for top-n logprobs)", c->spec.name);
}

/* An index array's table count and entry width: the count given exactly
 * with it, >= 1; the width 0, 32 or 64 (0 and 64: int64), 32 only with it. */
static kl_result check_index(const void *rows, int64_t n, int bits, const char *rows_name,
                             const char *n_name) {
  if (!rows && n)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s is %lld without params->%s", n_name,
                      (long long)n, rows_name);
  if (rows && n < 1)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s is %lld (must be >= 1 with "
                      "params->%s)", n_name, (long long)n, rows_name);
  if (bits != 0 && bits != 64 && (bits != 32 || !rows))
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s_bits is %d (must be 64, or 0, or 32 "
                      "with params->%s)", rows_name, bits, rows_name);
  return KLRT_OK;
}

/* One parameter array of `entries` rows of `per` elements of elem bytes (a
 * table of params->`count` entries, or with count NULL one a row): aligned,
 * on this GPU within its allocation, and apart from the outputs as measured
 * (the sampler reads it while it writes those). */
static kl_result check_array(kl_ctx *c, const kl_call *k, const void *p, size_t elem,
                             int64_t entries, int64_t per, const char *count, kl_arg arg) {
  /* the kernels load them as 4- and 8-byte words: a misaligned load would
   * end the process's CUDA context, not just this call (checked first, as
   * the outputs are: the more telling message when both hold) */
  if ((uintptr_t)p % elem)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s is not %zu-byte aligned",
                      kl_arg_name(arg), elem);
  const size_t bytes = elem * (size_t)entries * (size_t)per;
  kl_result res = kl_check_ptr(c, k, p, bytes, arg);
  if (res && count) {
    char why[512], each[64] = "";
    snprintf(why, sizeof why, "%s", kl_last_error());
    if (per > 1) snprintf(each, sizeof each, " of %lld elements", (long long)per);
    return kl_rt_fail(res, "%s (a table of params->%s = %lld entries%s)", why, count,
                      (long long)entries, each);
  }
  if (res) return res;
  for (int o = 0; o < k->route->nouts; o++)
    if (k->out[o].p && kl_overlaps((uintptr_t)p, bytes, (uintptr_t)k->out[o].p, k->out[o].bytes))
      return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s overlaps %s", kl_arg_name(arg),
                        kl_arg_name(k->out[o].arg));
  return KLRT_OK;
}

/* A row's hash table of special columns: 2^bits slots, at least twice its
 * entries (every bias and banned entry a column at most), so that a probe
 * ends soon; 32 at least. */
static int slot_bits(const kl_sampling *p) {
  const int64_t entries = (p->bias_count ? p->bias_width : 0) + (p->banned ? p->banned_width : 0);
  int bits = 5;
  while (((int64_t)1 << bits) < 2 * entries) bits++;
  return bits;
}

/* A list's n arrays (its count, ids and maybe values) given together,
 * with a width of at least 1 (never below 0). */
static kl_result check_list(const void *const *arrays, int n, int width, const char *name,
                            const char *together) {
  int given = 0;
  for (int i = 0; i < n; i++) given += arrays[i] != NULL;
  if (given && given < n)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: the %s list needs %s together", name, together);
  if (width < 0 || (given && width < 1))
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->%s_width is %d (must be >= 1 with its "
                      "arrays, >= 0 without)", name, width);
  return KLRT_OK;
}

/* The lists' arrays come together, each with its width; position only with
 * min_tokens, which reads it. */
static kl_result check_lists(const kl_sampling *p) {
  const void *allowed[] = {p->allowed_count, p->allowed_ids};
  const void *bias[] = {p->bias_count, p->bias_ids, p->bias_values};
  const void *stop[] = {p->min_len, p->stop_count, p->stop_ids};
  const void *banned[] = {p->banned};
  kl_result res = check_list(allowed, 2, p->allowed_width, "allowed",
                             "allowed_count and allowed_ids");
  if (!res) res = check_list(bias, 3, p->bias_width, "bias", "bias_count, bias_ids and bias_values");
  if (!res) res = check_list(stop, 3, p->stop_width, "stop", "min_len, stop_count and stop_ids");
  if (!res) res = check_list(banned, 1, p->banned_width, "banned", "banned");
  if (!res && p->position && !p->min_len)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->position is read by min_tokens alone: "
                      "pass min_len, stop_count and stop_ids with it");
  if (!res && slot_bits(p) > 20) /* a row's table: process.cuh.tmpl keeps its size in 4 bits */
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: bias_width + banned_width is %lld (at most %d)",
                      (long long)((p->bias_count ? p->bias_width : 0) +
                                  (int64_t)(p->banned ? p->banned_width : 0)), 1 << 19);
  return res;
}

/* n_top and its outputs agree; the parameter arrays: temperature required,
 * the others NULL or checked by check_array, the per-request ones for
 * `states` entries with state_rows (the penalties' prompt_mask a row of
 * words an entry, output_counts a row of vocab_size counts), offset for
 * `offsets` with offset_rows, the bitmask a row of words a token. */
static kl_result check(kl_ctx *c, const kl_call *k) {
  const kl_sample_call *x = k->extra;
  const kl_sampling *p = &x->p;
  if (x->n_top < 0 || x->n_top > c->spec.topk)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: n_top is %d (must be 0..%d, the spec's topk)",
                      x->n_top, c->spec.topk);
  if ((x->n_top > 0) != (k->out[2].p != NULL) || (!x->n_top && k->out[3].p))
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: top_index must be given exactly when n_top > 0, "
                      "and top_logprob only then");
  if (!p->temperature) return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->temperature is NULL");
  if (p->reserved)
    return kl_rt_fail(KLRT_EINVAL, "kl_sample: params->reserved is %d (must be 0)", p->reserved);
  kl_result res = check_lists(p);
  if (res) return res;
  res = check_index(p->state_rows, p->states, p->state_rows_bits, "state_rows",
                              "states");
  if (!res)
    res = check_index(p->offset_rows, p->offsets, p->offset_rows_bits, "offset_rows", "offsets");
  if (res) return res;
  const char *st = p->state_rows ? "states" : NULL, *of = p->offset_rows ? "offsets" : NULL;
  const int64_t per_state = st ? p->states : k->tokens, per_offset = of ? p->offsets : k->tokens;
  const int64_t words = mask_words(c), vocab = c->spec.vocab_size;
  const struct {
    const void *p;
    size_t elem;
    int64_t entries, per;
    const char *count;
  } arrays[] = {{p->temperature, 4, per_state, 1, st},
                {p->top_k, 4, per_state, 1, st},
                {p->top_p, 4, per_state, 1, st},
                {p->min_p, 4, per_state, 1, st},
                {p->seed, 8, per_state, 1, st},
                {p->offset, 8, per_offset, 1, of},
                {p->state_rows, p->state_rows_bits == 32 ? 4 : 8, k->tokens, 1, NULL},
                {p->offset_rows, p->offset_rows_bits == 32 ? 4 : 8, k->tokens, 1, NULL},
                {p->bitmask, 4, k->tokens, words, NULL},
                {p->repetition_penalty, 4, per_state, 1, st},
                {p->frequency_penalty, 4, per_state, 1, st},
                {p->presence_penalty, 4, per_state, 1, st},
                {p->prompt_mask, 4, per_state, words, st},
                {p->output_counts, 4, per_state, vocab, st},
                {p->allowed_count, 4, per_state, 1, st},
                {p->allowed_ids, 4, per_state, p->allowed_width, st},
                {p->bias_count, 4, per_state, 1, st},
                {p->bias_ids, 4, per_state, p->bias_width, st},
                {p->bias_values, 4, per_state, p->bias_width, st},
                {p->min_len, 4, per_state, 1, st},
                {p->stop_count, 4, per_state, 1, st},
                {p->stop_ids, 4, per_state, p->stop_width, st},
                {p->position, 8, k->tokens, 1, NULL},
                {p->banned, 4, k->tokens, p->banned_width, NULL}};
  for (int i = 0; i < (int)(sizeof arrays / sizeof arrays[0]) && !res; i++)
    if (arrays[i].p)
      res = check_array(c, k, arrays[i].p, arrays[i].elem, arrays[i].entries, arrays[i].per,
                        arrays[i].count, (kl_arg)(KL_ARG_TEMPERATURE + i));
  return res;
}

/* The scratch rows for k's tokens (gathered, or a row the candidates cannot
 * decide), before the kernel that writes them is queued (only a staged
 * input's copy may precede it); with `slices`, the sliced rows' slice
 * results too (the row sampler's). */
static kl_result ensure_scratch(kl_ctx *c, const kl_call *k, CUstream s, int slices) {
  const long long most = k->tokens > c->spec.max_tokens ? k->tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, KL_BUF_SAMPLE, (size_t)k->tokens * row_bytes(c),
                            (size_t)most * row_bytes(c), s);
  if (res || !slices) return res;
  return kl_ensure(c, KL_BUF_SLICE_RESULTS, kl_slice_results_bytes(c, k->tokens),
                   kl_slice_results_bytes(c, most), s);
}

/* ---- the lists: turned into bits and a table by their own kernel ---- */

/* A row's block (kl_abi.h's kl_row_params): its kept words, its special
 * words from a multiple of 4 words, then its table of 4-word slots. */
static int64_t row_words(const kl_ctx *c, int bits) {
  return 2 * ((mask_words(c) + 3) / 4 * 4) + ((int64_t)4 << bits);
}

/* KL_BUF_LISTS for `tokens` rows: their flags, then (from a multiple of 16
 * bytes) their blocks. */
static size_t flags_bytes(int64_t tokens) { return ((size_t)tokens * 4 + 15) / 16 * 16; }
static size_t lists_bytes(const kl_ctx *c, int64_t tokens, int bits) {
  return flags_bytes(tokens) + (size_t)tokens * (size_t)row_words(c, bits) * 4;
}

/* The call's lists, where it has any: its rows' flags and blocks written by
 * the lists kernel on s before the samplers, which find them in the row
 * parameters (kl_row_params_of). The buffer for max_tokens rows: grown
 * outside capture, as the scratch. */
static kl_result lists(kl_ctx *c, kl_call *k, CUstream s) {
  kl_sample_call *x = k->extra;
  if (!has_lists(&x->p) || k->tokens < 1) return KLRT_OK;
  const int bits = slot_bits(&x->p);
  const int64_t most = k->tokens > c->spec.max_tokens ? k->tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, KL_BUF_LISTS, lists_bytes(c, k->tokens, bits),
                            lists_bytes(c, most, bits), s);
  if (res) return res;
  const CUdeviceptr base = c->buf[KL_BUF_LISTS].p;
  x->list_flags = (unsigned *)base;
  x->list_rows = (unsigned *)(base + flags_bytes(k->tokens));
  x->list_row_words = row_words(c, bits);
  x->list_slot_bits = bits;
  const kl_sampling *p = &x->p;
  c->kern[KL_K_LISTS].prm.lists = (kl_lists_args){
      kl_row_params_of(x), p->allowed_count, p->allowed_ids, p->bias_count, p->bias_ids,
      p->bias_values, p->min_len, p->stop_count, p->stop_ids, (const long long *)p->position,
      p->banned, p->allowed_width, p->bias_width, p->stop_width, p->banned_width,
      x->list_flags, x->list_rows, x->list_row_words, bits, k->tokens};
  /* PDL: it waits for the kernel before it (the lists may come from it);
   * the samplers after it start when it ends */
  CUresult r = kl_launch(c, KL_K_LISTS, kl_grid(c, KL_K_LISTS, k->tokens, 1), 1, s);
  if (r == CUDA_SUCCESS) return KLRT_OK;
  return kl_rt_fail(KLRT_ECUDA, "launching the lists kernel: %s", kl_cu_errstr(r));
}

/* The gathered rows in the scratch, by the gather route's path `oneshot`. */
static kl_result gather_rows(kl_ctx *c, kl_call *k, CUstream s, int oneshot) {
  const size_t need = (size_t)k->tokens * row_bytes(c);
  kl_result res = ensure_scratch(c, k, s, 1);
  if (res) return res;
  kl_call g = {.route = &kl_gather_route, .in = (const void *)k->kin, .tokens = k->tokens,
               .out = {{(void *)c->buf[KL_BUF_SAMPLE].p, need, KL_ARG_OUT}},
               .in_bytes = k->in_bytes, .kin = k->kin};
  return oneshot ? kl_gather_route.oneshot(c, &g, s) : kl_gather_route.nccl(c, &g, s);
}

/* A sliced row's slices this call: the layout's (about 2,048 columns each)
 * while every row's fit in one wave of the sampler's grid, else fewer and
 * wider ones, down to one a row: past a wave, narrow slices only queue
 * behind each other, and each wave adds its launch and merge to the step. */
static int slices_for(const kl_ctx *c, int tokens, long long *cols) {
  const int wave = c->kern[KL_K_SAMPLE].wave > 0 ? c->kern[KL_K_SAMPLE].wave : c->sm_count;
  int64_t most = tokens > 0 ? wave / tokens : 1, w = 0;
  if (most > c->layout.sample_slices) most = c->layout.sample_slices;
  const int n = kl_layout_sample_slices(c->spec.vocab_size, most, &w);
  *cols = (long long)w;
  return n;
}

/* A call with top-n logprobs gathers: the shards' candidates are of t, the
 * top-n of x; so does one with ranks, which count over whole rows, and one
 * with penalties or lists and a logprob, which only the row sampler takes
 * from the logits without them. (A call with filters gathers
 * only where the path is NCCL, a choice the crossover leaves alone:
 * one-shot, it moves records.) */
static int gathers(const kl_call *k) {
  const kl_sample_call *x = k->extra;
  return x->n_top > 0 || k->out[4].p || (k->out[1].p && has_processors(&x->p));
}

/* The row sampler over the scratch's rows, gathered by the one-shot path
 * (`oneshot`) or NCCL's. */
static kl_result draw(kl_ctx *c, kl_call *k, CUstream s, int oneshot) {
  const kl_sample_call *x = k->extra;
  /* the rows of a call that gathers for its logprobs are taken whole: the
   * raw logits' pass beside the draw (sample.cu.tmpl sliced_row) */
  const int sliced = !gathers(k);
  kl_slice_result *results =
      sliced ? (kl_slice_result *)c->buf[KL_BUF_SLICE_RESULTS].p : NULL;
  unsigned *arrived = sliced ? kl_slice_counters(c) : NULL;
  /* Only a one-shot gather can have run dead and left poison in the rows;
   * NCCL's rows are results, fault or not, on every rank alike. */
  const unsigned long long *fault = oneshot && c->recv ? kl_fault_word(c) : NULL;
  c->kern[KL_K_SAMPLE].prm.sample = (kl_sample_args){
      (const void *)c->buf[KL_BUF_SAMPLE].p, kl_row_params_of(x), (long long *)k->out[0].p,
      k->out[1].p,
      (long long *)k->out[2].p, k->out[3].p, (long long *)k->out[4].p, fault, results, arrived,
      k->tokens, x->n_top, 1, (long long)c->spec.vocab_size};
  kl_sample_args *a = &c->kern[KL_K_SAMPLE].prm.sample;
  if (sliced) a->slices = slices_for(c, k->tokens, &a->slice_cols);
  /* items: every row's slices (a row a CTA takes whole is one of them) */
  const int grid = kl_grid(c, KL_K_SAMPLE, k->tokens * a->slices, 1);
  /* PDL: launched while the kernel before it runs (the one-shot gather lets
   * its dependents start), it waits for that kernel before it reads
   * anything; its launch's latency hides behind that run. */
  CUresult r = kl_launch(c, KL_K_SAMPLE, grid, 1, s);
  if (r == CUDA_SUCCESS) return KLRT_OK;
  return kl_rt_fail(KLRT_ECUDA, "launching the row sampler: %s", kl_cu_errstr(r));
}

static int has_filters(const kl_call *k) {
  const kl_sampling *p = &((const kl_sample_call *)k->extra)->p;
  return p->top_k || p->top_p || p->min_p;
}

/* Whether the call takes the gathering path on `path`: with top-n logprobs
 * always; with filters where the peers' staged rows are out of reach. */
static int gathering(const kl_call *k, int path) {
  return gathers(k) || (path == PATH_NCCL && has_filters(k));
}

/* A gathering call is counted when its path is chosen, as the path is:
 * alike on every rank, whether or not the call is refused after. */
static void count(kl_ctx *c, const kl_call *k, int path) {
  if (gathering(k, path)) c->stats.sample_gathered++;
}

/* The gathering path: the rows gathered by the gather route's path
 * `oneshot`, then drawn by the row sampler. */
static kl_result gather_and_draw(kl_ctx *c, kl_call *k, CUstream s, int oneshot) {
  kl_result res = gather_rows(c, k, s, oneshot);
  return res ? res : draw(c, k, s, oneshot);
}

/* The call's subparts: without filters at few tokens, each of kl_topk's
 * parts in up to group_subparts subparts, a CTA each (shards.cu.tmpl),
 * while the grid stays within a CTA a multiprocessor of the group's
 * smallest GPU and within the step slots of max_tokens. At few tokens a token's parts take
 * few of the GPU's multiprocessors, each bound by issue on its columns'
 * noise; subparts spread that noise over more of them. Every rank computes
 * the same from what the group agreed. */
static int call_subparts(const kl_ctx *c, int tokens) {
  int sub = c->group_subparts;
  while (sub > 1 && ((int64_t)tokens * c->layout.topk_split * sub > c->group_sms ||
                     (int64_t)tokens * sub > c->spec.max_tokens))
    sub /= 2;
  return sub;
}

/* A call with filters at few tokens: a CTA for each token beyond the
 * parts, which merges that token alone (shards.cu.tmpl), where the whole
 * grid stays resident (the kernel's cap) and within its step slots. A CTA
 * that merges after its own part waits for its part, its fence and its
 * marks first; one that merges alone waits for none of them. The ranks
 * need not agree: a rank's grid decides only which of its CTAs merge. */
static int merge_ctas(const kl_ctx *c, int tokens) {
  const kl_kernel *kn = &c->kern[KL_K_SHARDS_FILTERED];
  const int64_t grid = (int64_t)tokens * (c->layout.topk_split + 1);
  return grid <= kn->cap && grid <= kn->nslots ? tokens : 0;
}

/* The shard sampler without filters: the kernel with the lists' code only
 * for a call that has lists (lists() set their flags). */
static kl_kernel_id shards_kernel(const kl_call *k) {
  return ((const kl_sample_call *)k->extra)->list_flags ? KL_K_SHARDS_LISTS : KL_K_SHARDS;
}

static kl_result oneshot(kl_ctx *c, kl_call *k, CUstream s) {
  kl_result res = lists(c, k, s);
  if (res) return res;
  if (gathering(k, PATH_ONESHOT)) return gather_and_draw(c, k, s, 1);
  if (!has_filters(k))
    return kl_select_oneshot(c, shards_kernel(k), k, s, call_subparts(c, k->tokens), 0);
  /* the scratch before the kernel that writes and reads it */
  res = ensure_scratch(c, k, s, 0);
  return res ? res : kl_select_oneshot(c, KL_K_SHARDS_FILTERED, k, s, 1, merge_ctas(c, k->tokens));
}

/* Without the peers' staged rows, a row with filters needs the gather. */
static kl_result nccl(kl_ctx *c, kl_call *k, CUstream s) {
  kl_result res = lists(c, k, s);
  if (res) return res;
  if (gathering(k, PATH_NCCL)) return gather_and_draw(c, k, s, 0);
  return kl_select_nccl(c, shards_kernel(k), k, s);
}

const kl_route kl_sample_route = {
    .fn = "kl_sample",
    .kernel = KL_K_ONESHOT, /* the gather's one-shot kernel decides the path */
    .nouts = 5,
    .align_mask = {7, 3, 7, 3, 7},
    .misaligned = "token, top_index and rank must be 8-byte aligned, logprob and top_logprob "
                  "4-byte aligned",
    .overlap = "token, logprob, top_index, top_logprob and rank overlap",
    .sized = 1, /* a call that gathers moves the shard, as kl_gather */
    .gathers = gathers,
    .nccl_kernels = "kl_sample needs the generated samplers on every rank",
    .usable = has_topk,
    .check = check,
    .count = count,
    .measure = measure,
    .oneshot = oneshot,
    .nccl = nccl,
};
