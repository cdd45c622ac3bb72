/* A context's life: creation (spec -> layout -> JIT -> transport, every
 * rank alike), the live list every call looks the context up in, and
 * destruction. */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* Live contexts, so that a call after destroy is an error, not a crash. */
#define LIVE_MAX 1024
static kl_ctx *live[LIVE_MAX];
static int live_hi; /* slots in use are below it: the per-call lookup stays short */
static pthread_mutex_t live_m = PTHREAD_MUTEX_INITIALIZER;

static int live_add(kl_ctx *c) {
  pthread_mutex_lock(&live_m);
  int ok = 0;
  for (int i = 0; i < LIVE_MAX && !ok; i++)
    if (!live[i]) {
      live[i] = c, ok = 1;
      if (i >= live_hi) live_hi = i + 1;
    }
  pthread_mutex_unlock(&live_m);
  return ok;
}

static int live_find(const kl_ctx *c) {
  for (int i = 0; i < live_hi; i++)
    if (live[i] == c) return i;
  return -1;
}

kl_result kl_ctx_acquire(kl_ctx *c, int remove, const char *fn) {
  pthread_mutex_lock(&live_m);
  int i = live_find(c);
  kl_result res = KLRT_OK;
  if (i < 0) res = kl_rt_fail(KLRT_ESTATE, "%s: ctx was %sdestroyed", fn,
                              remove ? "already " : "");
  else if (atomic_exchange(&c->busy, 1))
    res = kl_rt_fail(KLRT_EBUSY, "%s: another thread is inside a call on this context", fn);
  else if (remove)
    live[i] = NULL;
  pthread_mutex_unlock(&live_m);
  return res;
}

void kl_ctx_release(kl_ctx *c) { atomic_store(&c->busy, 0); }

int kl_ctx_if_live(const kl_ctx *c, void (*fn)(const kl_ctx *c, void *arg), void *arg) {
  pthread_mutex_lock(&live_m);
  int found = live_find(c) >= 0;
  if (found) fn(c, arg);
  pthread_mutex_unlock(&live_m);
  return found;
}

kl_result kl_ctx_enter(kl_ctx *c, int *pushed) {
  CUcontext cur = NULL;
  *pushed = 0;
  c->cu->cuCtxGetCurrent(&cur);
  if (cur == c->cuctx) return KLRT_OK;
  KL_CU_TRY(c, cuCtxPushCurrent(c->cuctx));
  *pushed = 1;
  return KLRT_OK;
}

void kl_ctx_leave(kl_ctx *c, int pushed) {
  CUcontext dummy;
  if (pushed) c->cu->cuCtxPopCurrent(&dummy);
}

kl_result kl_check_environment(void) {
  char why[KL_PARAM_WHY];
  if (kl_params_check(why, sizeof why) != 0)
    return kl_rt_fail(KLRT_EINVAL, "environment: %s", why);
  return KLRT_OK;
}

/* The host's NCCL, for a context given a communicator (NULL otherwise). */
static kl_result nccl_for(const kl_config *cfg, const kl_nccl_api **api) {
  *api = NULL;
  if (!cfg->nccl) return KLRT_OK;
  char why[1024];
  *api = kl_nccl_api_get(kl_param_str(KL_P_NCCL_LIBRARY), why, sizeof why);
  if (!*api) return kl_rt_fail(KLRT_ENCCL, "cfg.nccl is set, but %s", why);
  return KLRT_OK;
}

static kl_result check_config(const kl_config *cfg, const kl_spec *s, const kl_nccl_api **api) {
  if (cfg->nranks != s->tp)
    return kl_rt_fail(KLRT_ESPEC, "spec '%s' is for tp %d, but the group has %d ranks", s->name,
                      s->tp, cfg->nranks);
  if (cfg->rank < 0 || cfg->rank >= cfg->nranks)
    return kl_rt_fail(KLRT_EINVAL, "rank %d is outside 0..%d", cfg->rank, cfg->nranks - 1);
  if (cfg->nranks > 1 && !cfg->group && !cfg->nccl && !cfg->allgather)
    return kl_rt_fail(KLRT_EINVAL, "%d ranks need a way to meet: set group (threads), nccl or "
                      "allgather in kl_config", cfg->nranks);
  if (cfg->device < -1) return kl_rt_fail(KLRT_EINVAL, "device %d is not an ordinal", cfg->device);
  /* A group sized for fewer ranks would be written past its end. */
  if (cfg->group && kl_group_nranks(cfg->group) != cfg->nranks)
    return kl_rt_fail(KLRT_EINVAL, "cfg.group was made for %d ranks, but cfg.nranks is %d",
                      kl_group_nranks(cfg->group), cfg->nranks);
  /* The communicator decides who is who: a mismatch would pair the wrong
   * buffers, so every rank refuses alike (each sees its own mismatch). */
  int n = 0, r = -1;
  kl_result res = nccl_for(cfg, api);
  if (res) return res;
  if (cfg->nccl && ((*api)->ncclCommCount(cfg->nccl, &n) != ncclSuccess ||
                    (*api)->ncclCommUserRank(cfg->nccl, &r) != ncclSuccess))
    return kl_rt_fail(KLRT_ENCCL, "cfg.nccl is not a usable NCCL communicator");
  if (cfg->nccl && (n != cfg->nranks || r != cfg->rank))
    return kl_rt_fail(KLRT_EINVAL, "cfg says rank %d of %d, but the NCCL communicator says rank "
                      "%d of %d", cfg->rank, cfg->nranks, r, n);
  return KLRT_OK;
}

kl_result kl_require_arch(int device, int major, int minor) {
  /* The kernels use L2 cache hints and eviction policies (PTX for sm_80). */
  if (major < KL_MIN_SM_MAJOR)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "GPU %d is sm_%d%d; libklrt's kernels need sm_%d0 or "
                      "newer", device, major, minor, KL_MIN_SM_MAJOR);
  return KLRT_OK;
}

/* The app's current context if it is on the requested device, else the
 * device's primary context (what the CUDA runtime uses). */
static kl_result bind_device(kl_ctx *c, int device, int no_pdl) {
  const kl_cu *cu = c->cu;
  CUcontext cur = NULL;
  cu->cuCtxGetCurrent(&cur);
  CUdevice cur_dev = -1;
  if (cur && cu->cuCtxGetDevice(&cur_dev) != CUDA_SUCCESS) cur = NULL;
  if (device < 0) {
    if (!cur) return kl_rt_fail(KLRT_EINVAL, "device -1 means the current context's device, but "
                                "this thread has no current CUDA context");
    device = (int)cur_dev;
  }
  int n = 0;
  cu->cuDeviceGetCount(&n);
  if (device >= n) return kl_rt_fail(KLRT_EINVAL, "device %d does not exist (%d GPUs)", device, n);
  KL_CU_TRY(c, cuDeviceGet(&c->dev, device));
  c->ordinal = device;
  if (cur && cur_dev == c->dev) {
    c->cuctx = cur;
  } else {
    KL_CU_TRY(c, cuDevicePrimaryCtxRetain(&c->cuctx, c->dev));
    c->retained = 1;
  }
  int maj = 0, min = 0;
  cu->cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev);
  cu->cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev);
  cu->cuDeviceGetAttribute(&c->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev);
  snprintf(c->arch, sizeof c->arch, "sm_%d%d", maj, min);
  kl_result res = kl_require_arch(device, maj, min);
  if (res) return res;
  c->pdl = maj >= 9 && kl_param_int(KL_P_PDL, NULL) && !no_pdl;
  snprintf(c->stats.arch, sizeof c->stats.arch, "%s", c->arch);
  return KLRT_OK;
}

/* Render, compile (or hit the cache) and load. A failure here is not fatal:
 * it makes this rank's one-shot path unusable, which the group then agrees on. */
static int build_kernels(kl_ctx *c, const char *source, char *why) {
  if (!source) {
    snprintf(why, KL_WHY_MAX, "rank %d: render: %.200s", c->rank, c->render_error);
    return -1;
  }
#ifdef KL_TESTING
  /* Fault injection for the tests of the readiness agreement: one rank's JIT
   * fails, every rank must fall back to NCCL alike. Only in the library the
   * tests link (KL_TESTING), never in the one that is installed. */
  if (getenv("KLGEN_FAULT_JIT")) {
    snprintf(why, KL_WHY_MAX, "rank %d: JIT failed (injected by KLGEN_FAULT_JIT)", c->rank);
    return -1;
  }
#endif
  const char *dir = c->cache_dir[0] ? c->cache_dir : NULL;
  kl_err err = {{0}};
  kl_binary bin;
  int hit = 0;
  int rc = kl_jit_cubin(source, c->spec.name, c->arch, dir, &bin, &hit, &err);
  if (rc) {
    snprintf(why, KL_WHY_MAX, "rank %d: JIT for %s: %.200s", c->rank, c->arch, err.msg);
    return -1;
  }
  c->stats.cache_hit = hit;
  CUresult r = c->cu->cuModuleLoadData(&c->mod, bin.data);
  if (r == CUDA_SUCCESS) r = kl_kernels_load(c);
  kl_binary_free(&bin);
  if (r != CUDA_SUCCESS) {
    /* the gather's NCCL path copies instead; kl_argmax and kl_topk are unavailable */
    if (c->mod) c->cu->cuModuleUnload(c->mod);
    c->mod = NULL;
    snprintf(why, KL_WHY_MAX, "rank %d: loading the kernel: %s", c->rank, kl_cu_errstr(r));
    return -1;
  }
  return 0;
}

static void release(kl_ctx *c) {
  if (!c) return;
  if (c->cu) {
    int pushed = 0;
    if (c->cuctx) kl_ctx_enter(c, &pushed);
    kl_transport_teardown(c);
    for (int i = 0; i < KL_BUF_COUNT; i++)
      if (c->buf[i].p) c->cu->cuMemFree(c->buf[i].p);
    for (int i = 0; i < c->nretired; i++) c->cu->cuMemFree(c->retired[i]);
    free(c->retired);
    if (c->mod) c->cu->cuModuleUnload(c->mod);
    if (c->stream) c->cu->cuStreamDestroy(c->stream);
    if (c->order_event) c->cu->cuEventDestroy(c->order_event);
    if (c->cuctx) kl_ctx_leave(c, pushed);
    if (c->retained) c->cu->cuDevicePrimaryCtxRelease(c->dev);
  }
  free(c);
}

static kl_result create(kl_ctx **out, const kl_spec *spec, const char *source,
                        const kl_config *cfg) {
  const kl_nccl_api *nccl_api = NULL;
  kl_result res = check_config(cfg, spec, &nccl_api);
  if (res) return res;
  kl_nvrtc_set_library(kl_param_str(KL_P_NVRTC_LIBRARY));
  const char *why_no = NULL;
  const kl_cu *cu = kl_cu_get(&why_no);
  if (!cu) return kl_rt_fail(KLRT_ENODRIVER, "%s", why_no);
  kl_ctx *c = calloc(1, sizeof *c);
  if (!c) return kl_rt_fail(KLRT_ENOMEM, "out of memory");
  c->spec = *spec;
  c->cu = cu;
  c->rank = cfg->rank;
  c->nranks = cfg->nranks;
  c->nccl = cfg->nccl;
  c->nccl_api = nccl_api;
  c->last_path = -1;
  kl_err err;
  if (kl_layout_derive(&c->spec, &c->layout, &err) != 0) {
    free(c);
    return kl_rt_fail(KLRT_ESPEC, "%s", err.msg);
  }
  int pushed = 0;
  c->crossover_cfg = cfg->crossover_bytes;
  if (!kl_cache_dir(cfg->cache_dir, c->cache_dir, sizeof c->cache_dir)) c->cache_dir[0] = 0;
  if ((res = bind_device(c, cfg->device, cfg->no_pdl)) || (res = kl_ctx_enter(c, &pushed))) {
    release(c);
    return res;
  }
  CUresult r = cu->cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = cu->cuEventCreate(&c->order_event, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) res = kl_rt_fail(KLRT_ECUDA, "creating a stream and an event: %s",
                                          kl_cu_errstr(r));
  if (!res) res = kl_buffers_alloc(c);
  if (res) {
    kl_ctx_leave(c, pushed);
    release(c);
    return res;
  }
  c->ex = (kl_exchange){cfg->group, cfg->nccl, nccl_api, cfg->allgather, cfg->allgather_user,
                        cfg->rank, cfg->nranks, cu, c->stream};
  char why[KL_WHY_MAX] = "";
  /* The source is rendered here, not in build_kernels: its hash goes into
   * the fingerprint every rank compares, compiled or not. */
  char *rendered = NULL;
  kl_err rerr = {{0}};
  if (!source && kl_render(&c->spec, &c->layout, NULL, &rendered, &rerr) == 0) source = rendered;
  else if (!source) snprintf(c->render_error, sizeof c->render_error, "%.200s", rerr.msg);
  c->source_hash = source ? kl_fnv1a(KL_FNV_BASIS, source, strlen(source)) : 0;
  int compiled = build_kernels(c, source, why) == 0;
  free(rendered);
  res = kl_transport_setup(c, compiled, why);
  c->stats.oneshot_ready = c->ready;
  c->stats.crossover_bytes = c->crossover;
  kl_ctx_leave(c, pushed);
  /* agreed, so that every rank fails alike: one left with a context would
   * wait for peers that have none */
  if (!res && !c->ready && !c->nccl_everywhere)
    res = kl_rt_fail(KLRT_EUNAVAILABLE, "one-shot path not ready (%s) and some rank has no "
                     "NCCL communicator to fall back to", c->stats.not_ready);
  if (!res && !live_add(c)) res = kl_rt_fail(KLRT_ENOMEM, "too many live contexts");
  if (res) {
    release(c);
    return res;
  }
  if (kl_log_enabled())
    kl_log("rank %d: %s on %s (GPU %d): one-shot %s%s%s, crossover %lld bytes (this rank's: "
           "%s), PDL %s, kernel %s", c->rank, c->spec.name, c->arch, c->ordinal,
           c->ready ? "ready" : "NOT ready", c->ready ? "" : ": ",
           c->ready ? "" : c->stats.not_ready, (long long)c->crossover,
           c->crossover_from ? c->crossover_from : "-", c->pdl ? "on" : "off",
           c->stats.cache_hit ? "from cache" : "compiled");
  *out = c;
  return KLRT_OK;
}

kl_result kl_pick_spec(const kl_spec_list *l, const char *name, kl_spec *out) {
  char names[640];
  if (!name) {
    if (l->n != 1)
      return kl_rt_fail(KLRT_EINVAL, "the spec defines %d specs; pass the name of one: %s", l->n,
                        kl_spec_list_names(l, names, sizeof names));
    *out = l->v[0];
    return KLRT_OK;
  }
  const int i = kl_spec_list_find(l, name);
  if (i >= 0) return *out = l->v[i], KLRT_OK;
  return kl_rt_fail(KLRT_EINVAL, "no spec named '%s' in it; it defines %s", name,
                    kl_spec_list_names(l, names, sizeof names));
}

/* A spec's bounds: KLGEN_SPEC_TIME_MS, else the default. */
static kl_limits spec_limits(void) {
  kl_limits lim = {kl_param_int(KL_P_SPEC_TIME_MS, NULL), 0};
  return lim;
}

kl_result kl_load_specs(const char *path, const char *src, kl_spec_list *l) {
  kl_err err;
  kl_limits lim = spec_limits();
  int rc = path ? kl_spec_load_file(path, &lim, l, &err)
                : kl_spec_load_string("<spec string>", src, strlen(src), &lim, l, &err);
  return rc ? kl_rt_fail(KLRT_ESPEC, "%s", err.msg) : KLRT_OK;
}

/* The named spec of a file (path) or a string (src), then the context. */
static kl_result create_named(kl_ctx **ctx, const char *path, const char *src, const char *name,
                              const kl_config *cfg) {
  kl_spec_list l;
  kl_result res = kl_load_specs(path, src, &l);
  if (res) return res;
  kl_spec s;
  res = kl_pick_spec(&l, name, &s);
  kl_spec_list_free(&l);
  return res ? res : create(ctx, &s, NULL, cfg);
}

/* Declares `cfg`, this library's copy of the caller's `cfg_in`. */
#define CHECK_OUT_CFG(ctx, cfg_in)                                                      \
  kl_config cfg_copy_;                                                                  \
  const kl_config *cfg = &cfg_copy_;                                                    \
  do {                                                                                  \
    if (!(ctx)) return kl_rt_fail(KLRT_EINVAL, "%s: ctx is NULL", __func__);            \
    *(ctx) = NULL;                                                                      \
    if (!(cfg_in)) return kl_rt_fail(KLRT_EINVAL, "%s: cfg is NULL", __func__);         \
    kl_result r_ = kl_read_input(&cfg_copy_, sizeof cfg_copy_, sizeof cfg_copy_, cfg_in, \
                                  __func__, "cfg", "kl_config", "KL_CONFIG_INIT");   \
    if (!r_) r_ = kl_check_environment();                                               \
    if (r_) return r_;                                                                  \
  } while (0)

kl_result kl_ctx_create_file(kl_ctx **ctx, const char *path, const char *name,
                             const kl_config *cfg_in) {
  CHECK_OUT_CFG(ctx, cfg_in);
  if (!path) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_create_file: spec_path is NULL");
  return create_named(ctx, path, NULL, name, cfg);
}

kl_result kl_ctx_create_string(kl_ctx **ctx, const char *src, const char *name,
                               const kl_config *cfg_in) {
  CHECK_OUT_CFG(ctx, cfg_in);
  if (!src) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_create_string: spec_source is NULL");
  return create_named(ctx, NULL, src, name, cfg);
}

/* The number after `key` in a rendered source (the kernel ABI, a constant
 * the prelude renders); -1 if the source has no such text. */
static long long source_int(const char *source, const char *key) {
  const char *p = strstr(source, key);
  return p ? atoll(p + strlen(key)) : -1;
}

/* A header from klgen: the spec is re-validated and the layout re-derived, and
 * must match what the header was generated with (an older klgen, a hand edit). */
kl_result kl_ctx_create_generated(kl_ctx **ctx, const kl_generated *g,
                                   const kl_config *cfg_in) {
  CHECK_OUT_CFG(ctx, cfg_in);
  if (!g || !g->name || !g->source)
    return kl_rt_fail(KLRT_EINVAL, "kl_ctx_create_generated: gen, its name or source is NULL");
  if (g->abi < 1 || g->abi > 5)
    return kl_rt_fail(KLRT_ESPEC, "generated header ABI %d is not 1 to 5", g->abi);
  if (g->dtype < 0 || g->dtype > 2 || g->source_len != strlen(g->source) ||
      (g->abi >= 2 && (g->out_dtype < 0 || g->out_dtype > 2)))
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' is malformed", g->name);
  kl_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.name, sizeof s.name, "%s", g->name);
  snprintf(s.file, sizeof s.file, "%s (generated header)", g->name);
  s.vocab_size = g->vocab_size;
  s.padded_vocab = g->padded_vocab;
  s.tp = g->tp;
  s.dtype = (kl_dtype)g->dtype;
  s.max_tokens = g->max_tokens;
  s.timeout_ms = g->timeout_ms;
  s.out_dtype = s.dtype;
  if (g->abi >= 2) {
    s.out_dtype = (kl_dtype)g->out_dtype;
    s.numerics = (kl_numerics)g->numerics;
    s.softcap = g->softcap;
    s.scale = g->scale;
  }
  if (g->abi >= 3) s.topk = g->topk;
  if (g->abi >= 5) s.noise = (kl_noise)g->noise;
  kl_err err;
  kl_layout l;
  if (strlen(g->name) > KL_NAME_MAX || kl_spec_validate(&s, &err) != 0 ||
      kl_layout_derive(&s, &l, &err) != 0)
    return kl_rt_fail(KLRT_ESPEC, "generated header: %s", err.msg);
  if (l.vec_bytes != g->vec_bytes || l.block != g->block)
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' was made by an incompatible klgen "
                      "(vec %d/%d, block %d/%d); regenerate it", g->name, g->vec_bytes,
                      l.vec_bytes, g->block, l.block);
  /* A header of abi < 4 carries neither: one thread a chunk, and one split
   * for both select kernels. */
  int ct = g->abi >= 4 ? g->chunk_threads : 1;
  int am = g->abi >= 4 ? g->argmax_split : l.topk_split;
  int tk = g->abi >= 4 ? g->topk_split : l.topk_split;
  if (ct != l.chunk_threads || am != l.argmax_split || (s.topk && tk != l.topk_split))
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' was made by an incompatible klgen "
                      "(threads a chunk %d/%d, argmax split %d/%d, top-k split %d/%d); "
                      "regenerate it", g->name, ct, l.chunk_threads, am, l.argmax_split, tk,
                      l.topk_split);
  /* Its kernels were rendered from some klgen's kl_abi.h: this runtime
   * launches them with its own. */
  int abi = (int)source_int(g->source, "#define KL_ABI_VERSION ");
  if (abi < 0) abi = 0;
  if (abi != KL_ABI_VERSION)
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' carries kernels of kernel ABI %d, "
                      "and this libklrt (%s) launches ABI %d: regenerate it with this klgen",
                      g->name, abi, KLRT_VERSION, KL_ABI_VERSION);
  /* the row sampler's slices are a launch shape the header carries only in
   * its source: the runtime sizes its scratch and grid by its own */
  long long slices = source_int(g->source, "int SAMPLE_SLICES = "),
            cols = source_int(g->source, "long long SAMPLE_SLICE_COLS = ");
  if (s.topk && (slices != l.sample_slices || cols != l.sample_slice_cols))
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' was made by an incompatible klgen "
                      "(sampler slices %lld/%d of %lld/%lld columns); regenerate it", g->name,
                      slices, l.sample_slices, cols, (long long)l.sample_slice_cols);
  /* a hand edit of the noise would pass as the other's draws; kernels
   * rendered before the choice existed draw Philox's */
  long long noise = source_int(g->source, "int NOISE = ");
  if (noise < 0) noise = KL_NOISE_PHILOX;
  if (s.topk && noise != (long long)s.noise)
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' names noise %d but its kernels "
                      "draw noise %lld; regenerate it", g->name, (int)s.noise, noise);
  return create(ctx, &s, g->source, cfg);
}


kl_result kl_ctx_destroy(kl_ctx *c) {
  if (!c) return KLRT_OK;
  kl_result res = kl_ctx_acquire(c, 1, "kl_ctx_destroy");
  if (res) return res;
  int pushed;
  res = kl_ctx_enter(c, &pushed);
  /* Peers may still write into our buffer until they finish their last step:
   * finish ours, then wait for all ranks before freeing anything they map. */
  if (!res) c->cu->cuCtxSynchronize();
  char why[KL_WHY_MAX];
  int token = c->rank, all[KL_TP_MAX];
  if (c->ready && kl_exchange_all(&c->ex, &token, all, sizeof token, why) != 0)
    res = kl_rt_fail(KLRT_ENCCL, "kl_ctx_destroy: %s", why);
  kl_ctx_leave(c, pushed); /* also when the exchange failed: never leave a context pushed */
  release(c);
  return res;
}
