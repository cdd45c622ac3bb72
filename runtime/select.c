/* kl_argmax's and kl_topk's routes (docs/design/select.md), and the paths of
 * kl_sample's shard sampler, which is a select kernel too: the select kernel in
 * one-shot mode when it can serve the call; otherwise the same kernel in
 * reduce mode, an NCCL all-gather of the records, and the kernel in merge
 * mode. Both paths merge the same records with the same code, so they give
 * the same results. The choice is the gather's rule without the size limit:
 * records are a few bytes a row, never worth NCCL's latency. */
#include <stdint.h>

#include "rt.h"

/* index [tokens, K] int64, value [tokens, K] fp32, lse [tokens] fp32. */
static void measure(const kl_ctx *c, kl_call *k) {
  size_t n = (size_t)k->tokens * (size_t)(k->route->kernel == KL_K_TOPK ? c->spec.topk : 1);
  k->out[0].bytes = n * 8;
  k->out[1].bytes = n * 4;
  k->out[2].bytes = (size_t)k->tokens * 4;
}

static kl_result launched(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return KLRT_OK;
  return kl_rt_fail(KLRT_ECUDA, "launching the select kernel (%s): %s", what, kl_cu_errstr(r));
}

kl_row_params kl_row_params_of(const kl_sample_call *x) {
  const kl_sampling *p = &x->p;
  return (kl_row_params){p->temperature,
                         (const int *)p->top_k,
                         p->top_p,
                         p->min_p,
                         (const unsigned long long *)p->seed,
                         (const unsigned long long *)p->offset,
                         p->state_rows,
                         p->offset_rows,
                         (long long)p->states,
                         (long long)p->offsets,
                         p->state_rows_bits == 32 ? 32 : 64,
                         p->offset_rows_bits == 32 ? 32 : 64,
                         (const unsigned *)p->bitmask,
                         p->repetition_penalty,
                         p->frequency_penalty,
                         p->presence_penalty,
                         (const unsigned *)p->prompt_mask,
                         p->output_counts,
                         x->list_flags,
                         x->list_rows,
                         x->list_row_words,
                         x->list_slot_bits,
                         p->logit_values != 0};
}

/* The call's args in kernel id's parameter, for mode; no step state (the
 * one-shot mode adds it). The shard sampler's outputs are kl_sample's token
 * and logprob (out[0], out[1], set as index and value, whose places the
 * args' token and logprob share; out[2], top_index, is NULL for its calls). */
static kl_select_args *args(kl_ctx *c, kl_kernel_id id, const kl_call *k, int mode) {
  kl_select_args *a = &c->kern[id].prm.select.a;
  *a = (kl_select_args){.in = (const void *)k->kin, .index = (long long *)k->out[0].p,
                        .value = k->out[1].p, .lse = k->out[2].p, .tokens = k->tokens,
                        .rank = c->rank, .mode = mode, .subparts = 1};
  if (id == KL_K_SHARDS || id == KL_K_SHARDS_LISTS || id == KL_K_SHARDS_FILTERED) {
    a->params = kl_row_params_of((const kl_sample_call *)k->extra);
    /* filters only one-shot (sample.c): the rows they cannot decide are
     * copied into the sample scratch from the peers' staged rows and
     * sampled there */
    if (id == KL_K_SHARDS_FILTERED) a->whole_rows = (void *)c->buf[KL_BUF_SAMPLE].p;
    else a->params.top_k = NULL, a->params.top_p = a->params.min_p = NULL;
  }
  return a;
}

kl_result kl_select_oneshot(kl_ctx *c, kl_kernel_id id, kl_call *k, CUstream s, int subparts,
                            int merge_ctas) {
  kl_kernel *kn = &c->kern[id];
  kl_select_args *a = args(c, id, k, KL_SELECT_ONESHOT);
  a->state = (kl_state *)c->state;
  a->fault = kl_fault_word(c);
  a->slots = kn->slots;
  a->nslots = kn->nslots;
  a->subparts = subparts;
  /* parts in subparts: the grid of subparts times the tokens; the
   * CTAs that merge apart after them (the kernel tells them by the grid) */
  int grid = kl_grid(c, id, k->tokens * subparts, 1) + merge_ctas;
  return launched(kl_launch(c, id, grid, 1, s), "one-shot");
}

kl_result kl_select_nccl(kl_ctx *c, kl_kernel_id id, kl_call *k, CUstream s) {
  size_t rec = kl_record_bytes(c, k->tokens);
  long long most = k->tokens > c->spec.max_tokens ? k->tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, KL_BUF_RECORDS, kl_records_scratch_bytes(c, k->tokens),
                            kl_records_scratch_bytes(c, most), s);
  if (res) return res;
  CUdeviceptr mine = c->buf[KL_BUF_RECORDS].p, all = mine + rec;
  kl_select_args *a = args(c, id, k, KL_SELECT_REDUCE);
  a->rec = (void *)mine;
  int grid = kl_grid(c, id, k->tokens, 0);
  if ((res = launched(kl_launch(c, id, grid, 0, s), "reduce")) ||
      (res = kl_allgather(c, mine, all, rec, s)))
    return res;
  a->mode = KL_SELECT_MERGE;
  a->rec = (void *)all;
  return launched(kl_launch(c, id, k->tokens, 0, s), "merge");
}

static kl_result oneshot(kl_ctx *c, kl_call *k, CUstream s) {
  return kl_select_oneshot(c, k->route->kernel, k, s, 1, 0);
}

static kl_result nccl(kl_ctx *c, kl_call *k, CUstream s) {
  return kl_select_nccl(c, k->route->kernel, k, s);
}

static kl_result has_topk(const kl_ctx *c) {
  if (c->spec.topk) return KLRT_OK;
  return kl_rt_fail(KLRT_EINVAL, "kl_topk: spec '%s' has no topk field (add topk = K to it)",
                    c->spec.name);
}

/* The outputs are written in place (never staged): aligned for their type,
 * apart from each other; the input is staged apart from them. */
#define SELECT_ROUTE                                                                  \
  .nouts = 3, .align_mask = {7, 3, 3},                                                \
  .misaligned = "index must be 8-byte aligned, value and lse 4-byte aligned",        \
  .overlap = "index, value and lse overlap",                                         \
  .nccl_kernels = "the NCCL path of kl_argmax/kl_topk needs the generated select "    \
                  "kernels on every rank",                                            \
  .measure = measure, .oneshot = oneshot, .nccl = nccl

const kl_route kl_argmax_route = {.fn = "kl_argmax", .kernel = KL_K_ARGMAX, SELECT_ROUTE};
const kl_route kl_topk_route = {.fn = "kl_topk", .kernel = KL_K_TOPK, .usable = has_topk,
                                SELECT_ROUTE};
