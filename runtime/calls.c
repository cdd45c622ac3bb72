/* The step calls: kl_gather, kl_argmax, kl_topk and kl_sample, each its
 * route and arguments, through one entry into the dispatch layer. */
#include <stddef.h>
#include <stdint.h>

#include "rt.h"

/* What every call's arguments must be, and the route's own condition. */
static kl_result check_call(const kl_ctx *c, const kl_call *k) {
  const char *fn = k->route->fn;
  if (!k->in || !k->out[0].p)
    return kl_rt_fail(KLRT_EINVAL, "%s: %s is NULL", fn,
                      kl_arg_name(k->in ? k->out[0].arg : KL_ARG_SHARD));
  if (k->tokens <= 0)
    return kl_rt_fail(KLRT_EINVAL, "%s: tokens is %d (must be > 0)", fn, k->tokens);
  return k->route->usable ? k->route->usable(c) : KLRT_OK;
}

/* One step's call (kl_gather, kl_argmax, kl_topk, kl_sample): the context
 * taken, the arguments, the context entered, the stream ordered after the
 * previous call, the call's route through the dispatch layer (which refuses
 * a one-shot call once this rank knows of the group's fault), and its mark. */
static kl_result step(kl_ctx *c, kl_call *k, kl_stream stream) {
  if (!c) return kl_rt_fail(KLRT_EINVAL, "%s: ctx is NULL", k->route->fn);
  kl_result res = kl_ctx_acquire(c, 0, k->route->fn);
  if (res) return res;
  int pushed;
  res = check_call(c, k);
  if (!res && !(res = kl_ctx_enter(c, &pushed))) {
    int outside = 0; /* not capturing a graph */
    res = kl_order_streams(c, (CUstream)stream, &outside);
    if (!res) res = kl_dispatch(c, k, (CUstream)stream);
    if (!res && outside) res = kl_order_mark(c, (CUstream)stream);
    kl_ctx_leave(c, pushed);
  }
  kl_ctx_release(c);
  return res;
}

kl_result kl_gather(kl_ctx *c, const void *in, void *out, int tokens, kl_stream stream) {
  kl_call k = {.route = &kl_gather_route, .in = in, .out = {{out, 0, KL_ARG_OUT}}, .tokens = tokens};
  return step(c, &k, stream);
}

kl_result kl_argmax(kl_ctx *c, const void *shard, int64_t *index, float *value, int tokens,
                    kl_stream stream) {
  kl_call k = {.route = &kl_argmax_route, .in = shard,
               .out = {{index, 0, KL_ARG_INDEX}, {value, 0, KL_ARG_VALUE}, {NULL, 0, KL_ARG_LSE}},
               .tokens = tokens};
  return step(c, &k, stream);
}

kl_result kl_topk(kl_ctx *c, const void *shard, int64_t *index, float *value, float *lse,
                  int tokens, kl_stream stream) {
  kl_call k = {.route = &kl_topk_route, .in = shard,
               .out = {{index, 0, KL_ARG_INDEX}, {value, 0, KL_ARG_VALUE}, {lse, 0, KL_ARG_LSE}},
               .tokens = tokens};
  return step(c, &k, stream);
}

kl_result kl_sample(kl_ctx *c, const void *shard, const kl_sampling *params, int64_t *token,
                    float *logprob, int64_t *top_index, float *top_logprob, int n_top, int tokens,
                    kl_stream stream) {
  kl_sample_call x = {.n_top = n_top};
  if (!c) return kl_rt_fail(KLRT_EINVAL, "kl_sample: ctx is NULL");
  if (!params) return kl_rt_fail(KLRT_EINVAL, "kl_sample: params is NULL");
  /* from the struct before its bitmask on, the fields a caller lacks are off */
  kl_result res = kl_read_input(&x.p, sizeof x.p, offsetof(kl_sampling, bitmask), params,
                                "kl_sample", "params", "kl_sampling",
                                "KL_SAMPLING_INIT");
  if (res) return res;
  kl_call k = {.route = &kl_sample_route, .in = shard, .tokens = tokens, .extra = &x,
               .out = {{token, 0, KL_ARG_TOKEN}, {logprob, 0, KL_ARG_LOGPROB},
                       {top_index, 0, KL_ARG_TOP_INDEX}, {top_logprob, 0, KL_ARG_TOP_LOGPROB},
                       {x.p.rank, 0, KL_ARG_RANK}}};
  return step(c, &k, stream);
}
