/* What the API tells without a step: a spec's sizes and names, a context's
 * sizes, stats and fault status, the number of GPUs. */
#include <stdio.h>
#include <string.h>

#include "rt.h"

/* Copies a result struct into the caller's, as much as its size says
 * (sized.c reads an input struct). */
static kl_result write_out(void *dst, const void *src, size_t src_size, const char *what) {
  size_t n = *(const size_t *)dst;
  if (n < sizeof(size_t))
    return kl_rt_fail(KLRT_EINVAL, "%s->size is %zu: initialize it with the KL_*_INIT macro", what,
                      n);
  if (n > src_size) n = src_size;
  memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
  return KLRT_OK;
}

static void fill_info(const kl_spec *s, const kl_layout *l, kl_info *info) {
  memset(info, 0, sizeof *info);
  info->size = sizeof *info;
  snprintf(info->name, sizeof info->name, "%s", s->name);
  info->vocab_size = s->vocab_size;
  info->padded_vocab = l->padded_vocab;
  info->shard = l->shard;
  info->max_tokens = s->max_tokens;
  info->tp = s->tp;
  info->dtype = (int)s->dtype;
  info->elem_bytes = l->elem_bytes;
  info->vec_bytes = l->vec_bytes;
  info->buffer_bytes = l->recv_bytes;
  info->out_dtype = (int)s->out_dtype;
  info->out_elem_bytes = l->out_elem_bytes;
  info->topk = s->topk;
  info->noise = (int)s->noise;
}

/* kl_load_specs, the environment checked first. */
static kl_result load_specs(const char *path, const char *src, kl_spec_list *l) {
  kl_result env = kl_check_environment();
  return env ? env : kl_load_specs(path, src, l);
}

/* The named spec of a file or a string, and its layout. */
static kl_result spec_of(const char *path, const char *src, const char *name, kl_spec *s,
                         kl_layout *lay) {
  kl_spec_list l;
  kl_err err;
  kl_result res = load_specs(path, src, &l);
  if (res) return res;
  res = kl_pick_spec(&l, name, s);
  kl_spec_list_free(&l);
  if (!res && kl_layout_derive(s, lay, &err) != 0) res = kl_rt_fail(KLRT_ESPEC, "%s", err.msg);
  return res;
}

static kl_result info_of(const char *path, const char *src, const char *name, kl_info *info) {
  kl_spec s;
  kl_layout lay;
  kl_info mine;
  kl_result res = spec_of(path, src, name, &s, &lay);
  if (res) return res;
  fill_info(&s, &lay, &mine);
  return write_out(info, &mine, sizeof mine, "info");
}

kl_result kl_spec_info_file(const char *path, const char *name, kl_info *info) {
  if (!path || !info) return kl_rt_fail(KLRT_EINVAL, "kl_spec_info_file: NULL argument");
  return info_of(path, NULL, name, info);
}

kl_result kl_spec_info_string(const char *src, const char *name, kl_info *info) {
  if (!src || !info) return kl_rt_fail(KLRT_EINVAL, "kl_spec_info_string: NULL argument");
  return info_of(NULL, src, name, info);
}

static kl_result names_of(const char *path, const char *src, char (*names)[KL_INFO_NAME],
                          int cap, int *count) {
  if (!count || cap < 0 || (cap > 0 && !names))
    return kl_rt_fail(KLRT_EINVAL, "kl_spec_names: count is NULL, cap < 0, or names NULL with "
                      "cap %d", cap);
  kl_spec_list l;
  kl_result res = load_specs(path, src, &l);
  if (res) return res;
  for (int i = 0; i < l.n && i < cap; i++) snprintf(names[i], KL_INFO_NAME, "%s", l.v[i].name);
  *count = l.n;
  kl_spec_list_free(&l);
  return KLRT_OK;
}

kl_result kl_spec_names_file(const char *path, char (*names)[KL_INFO_NAME], int cap, int *count) {
  if (!path) return kl_rt_fail(KLRT_EINVAL, "kl_spec_names_file: spec_path is NULL");
  return names_of(path, NULL, names, cap, count);
}

kl_result kl_spec_names_string(const char *src, char (*names)[KL_INFO_NAME], int cap,
                               int *count) {
  if (!src) return kl_rt_fail(KLRT_EINVAL, "kl_spec_names_string: spec_source is NULL");
  return names_of(NULL, src, names, cap, count);
}

static void read_info(const kl_ctx *c, void *info) { fill_info(&c->spec, &c->layout, info); }

kl_result kl_ctx_info(const kl_ctx *c, kl_info *info) {
  if (!c || !info) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_info: NULL argument");
  /* fixed at creation, so no race with a call; read under the live list's
   * lock, which kl_ctx_destroy takes before it frees */
  kl_info mine;
  if (!kl_ctx_if_live(c, read_info, &mine))
    return kl_rt_fail(KLRT_ESTATE, "kl_ctx_info: ctx was destroyed");
  return write_out(info, &mine, sizeof mine, "info");
}

kl_result kl_ctx_stats(const kl_ctx *c, kl_stats *stats) {
  if (!c || !stats) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_stats: NULL argument");
  kl_result res = kl_ctx_acquire((kl_ctx *)c, 0, "kl_ctx_stats");
  if (res) return res;
  kl_stats mine = c->stats;
  mine.size = sizeof mine;
  /* with the calls of which the device sampled a row whole (sample.c), as
   * far as they have run */
  if (c->mirror) mine.sample_gathered += c->mirror[1];
  kl_ctx_release((kl_ctx *)c);
  return write_out(stats, &mine, sizeof mine, "stats");
}

kl_result kl_ctx_status(kl_ctx *c) {
  if (!c) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_status: ctx is NULL");
  kl_result res = kl_ctx_acquire(c, 0, "kl_ctx_status");
  if (res) return res;
  if (!c->state) return kl_ctx_release(c), KLRT_OK; /* one-shot never ran here */
  /* What this rank knows, else the word itself: a peer may have set it
   * while no kernel of this rank has run since. A fault found there is
   * kept, so the next one-shot call is refused as this call says; only
   * one-shot calls are, which ranks may refuse apart (dispatch.c). */
  uint64_t f = kl_fault_known(c);
  int pushed;
  CUresult r = CUDA_SUCCESS;
  if (!f && !(res = kl_ctx_enter(c, &pushed))) {
    r = c->cu->cuMemcpyDtoHAsync(&f, c->recv + (size_t)c->layout.fault_offset, sizeof f, c->stream);
    if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
    kl_ctx_leave(c, pushed);
    if (r != CUDA_SUCCESS) res = kl_rt_fail(KLRT_ECUDA, "reading the device state: %s", kl_cu_errstr(r));
    else c->fault = f;
  }
  if (!res && f) res = kl_fault_error(c, f);
  kl_ctx_release(c);
  return res;
}

int kl_device_count(void) {
  const char *why;
  const kl_cu *cu = kl_cu_get(&why);
  if (!cu) {
    kl_rt_fail(KLRT_ENODRIVER, "%s", why);
    return -(int)KLRT_ENODRIVER;
  }
  int n = 0;
  cu->cuDeviceGetCount(&n);
  return n;
}
