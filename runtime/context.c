/* Context lifecycle: create (spec -> layout -> JIT -> transport), gather entry,
 * stats, device status, destroy. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#ifdef KL_TESTING
#include "klrt_testing.h"
#endif

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

/* A call on c begins: c must be live, and no other thread inside a call on
 * it (KLRT_EBUSY: waiting could deadlock a collective, and two calls at once
 * would race on the context's buffers). remove: destroy takes it out. */
static kl_result ctx_acquire(kl_ctx *c, int remove, const char *fn) {
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

static void ctx_release(kl_ctx *c) { atomic_store(&c->busy, 0); }

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

/* The environment's variables, each valid if set (param.c). */
static kl_result check_environment(void) {
  char why[KL_PARAM_WHY];
  if (kl_params_check(why, sizeof why) != 0)
    return kl_rt_fail(KLRT_EINVAL, "environment: %s", why);
  return KLRT_OK;
}

/* The caller's kl_config as this library knows it: a smaller one is from no
 * version that exists; a larger one (a newer header) is accepted if the
 * fields this library does not know are zero. */
static kl_result read_config(const kl_config *in, kl_config *out, const char *fn) {
  if (in->size < sizeof *out) {
    if (in->size == 0)
      return kl_rt_fail(KLRT_EINVAL, "%s: cfg->size is 0: initialize it with KL_CONFIG_INIT "
                        "(or set it to sizeof(kl_config))", fn);
    return kl_rt_fail(KLRT_EINVAL, "%s: cfg->size is %zu, less than sizeof(kl_config) %zu", fn,
                      in->size, sizeof *out);
  }
  const unsigned char *extra = (const unsigned char *)in + sizeof *out;
  for (size_t i = 0; i < in->size - sizeof *out; i++)
    if (extra[i])
      return kl_rt_fail(KLRT_EINVAL, "%s: cfg sets fields this libklrt (%s) does not know", fn,
                        KLRT_VERSION);
  *out = *in;
  out->size = sizeof *out;
  return KLRT_OK;
}

/* Copies a result struct into the caller's, as much as its size says. */
static kl_result write_out(void *dst, const void *src, size_t src_size, const char *what) {
  size_t n = *(const size_t *)dst;
  if (n < sizeof(size_t))
    return kl_rt_fail(KLRT_EINVAL, "%s->size is %zu: initialize it with the KL_*_INIT macro", what,
                      n);
  if (n > src_size) n = src_size;
  memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
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

static kl_result pick_spec(const kl_spec_list *l, const char *name, kl_spec *out) {
  if (!name) {
    if (l->n != 1)
      return kl_rt_fail(KLRT_EINVAL, "the spec defines %d specs; pass the name of one", l->n);
    *out = l->v[0];
    return KLRT_OK;
  }
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->v[i].name, name) == 0) return *out = l->v[i], KLRT_OK;
  return kl_rt_fail(KLRT_EINVAL, "no spec named '%s' in it", name);
}

/* A spec's bounds: KLGEN_SPEC_TIME_MS, else the default. */
static kl_limits spec_limits(void) {
  kl_limits lim = {kl_param_int(KL_P_SPEC_TIME_MS, NULL), 0};
  return lim;
}

/* After kl_spec_load_*: the named spec of the list, then the context. */
static kl_result create_loaded(kl_ctx **ctx, int load_rc, const kl_err *err, kl_spec_list *l,
                               const char *name, const kl_config *cfg) {
  if (load_rc != 0) return kl_rt_fail(KLRT_ESPEC, "%s", err->msg);
  kl_spec s;
  kl_result res = pick_spec(l, name, &s);
  kl_spec_list_free(l);
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
    kl_result r_ = read_config(cfg_in, &cfg_copy_, __func__);                           \
    if (!r_) r_ = check_environment();                                                  \
    if (r_) return r_;                                                                  \
  } while (0)

kl_result kl_ctx_create_file(kl_ctx **ctx, const char *path, const char *name,
                             const kl_config *cfg_in) {
  CHECK_OUT_CFG(ctx, cfg_in);
  if (!path) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_create_file: spec_path is NULL");
  kl_limits lim = spec_limits();
  kl_spec_list l;
  kl_err err;
  return create_loaded(ctx, kl_spec_load_file(path, &lim, &l, &err), &err, &l, name, cfg);
}

kl_result kl_ctx_create_string(kl_ctx **ctx, const char *src, const char *name,
                               const kl_config *cfg_in) {
  CHECK_OUT_CFG(ctx, cfg_in);
  if (!src) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_create_string: spec_source is NULL");
  kl_limits lim = spec_limits();
  kl_spec_list l;
  kl_err err;
  int rc = kl_spec_load_string("<spec string>", src, strlen(src), &lim, &l, &err);
  return create_loaded(ctx, rc, &err, &l, name, cfg);
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
  if (g->abi < 1 || g->abi > 4)
    return kl_rt_fail(KLRT_ESPEC, "generated header ABI %d is not 1 to 4", g->abi);
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
  kl_err err;
  kl_layout l;
  if (strlen(g->name) > KL_NAME_MAX || kl_spec_validate(&s, &err) != 0 ||
      kl_layout_derive(&s, &l, &err) != 0)
    return kl_rt_fail(KLRT_ESPEC, "generated header: %s", err.msg);
  if (l.vec_bytes != g->vec_bytes || l.block != g->block)
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' was made by an incompatible klgen "
                      "(vec %d/%d, block %d/%d); regenerate it", g->name, g->vec_bytes,
                      l.vec_bytes, g->block, l.block);
  /* Before abi 4 every kernel had one thread a chunk and one split. */
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
  /* the row sampler's split is a launch shape the header carries only in its
   * source: the runtime sizes its scratch and grid by its own */
  long long slices = source_int(g->source, "int SAMPLE_SLICES = "),
            cols = source_int(g->source, "long long SAMPLE_SLICE_COLS = ");
  if (s.topk && (slices != l.sample_slices || cols != l.sample_slice_cols))
    return kl_rt_fail(KLRT_ESPEC, "generated header for '%s' was made by an incompatible klgen "
                      "(sampler slices %lld/%d of %lld/%lld columns); regenerate it", g->name,
                      slices, l.sample_slices, cols, (long long)l.sample_slice_cols);
  return create(ctx, &s, g->source, cfg);
}

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
  kl_result res = ctx_acquire(c, 0, k->route->fn);
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
  ctx_release(c);
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
  kl_sample_call x = {params, n_top};
  kl_call k = {.route = &kl_sample_route, .in = shard, .tokens = tokens, .extra = &x,
               .out = {{token, 0, KL_ARG_TOKEN}, {logprob, 0, KL_ARG_LOGPROB},
                       {top_index, 0, KL_ARG_TOP_INDEX}, {top_logprob, 0, KL_ARG_TOP_LOGPROB}}};
  return step(c, &k, stream);
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
}

/* Every spec of a file (path) or a string (src), under the environment's
 * limits; the environment is checked first. */
static kl_result load_specs(const char *path, const char *src, kl_spec_list *l) {
  kl_result env = check_environment();
  if (env) return env;
  kl_err err;
  kl_limits lim = spec_limits();
  int rc = path ? kl_spec_load_file(path, &lim, l, &err)
                : kl_spec_load_string("<spec string>", src, strlen(src), &lim, l, &err);
  return rc ? kl_rt_fail(KLRT_ESPEC, "%s", err.msg) : KLRT_OK;
}

/* The named spec of a file or a string, and its layout. */
static kl_result spec_of(const char *path, const char *src, const char *name, kl_spec *s,
                         kl_layout *lay) {
  kl_spec_list l;
  kl_err err;
  kl_result res = load_specs(path, src, &l);
  if (res) return res;
  res = pick_spec(&l, name, s);
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

kl_result kl_ctx_info(const kl_ctx *c, kl_info *info) {
  if (!c || !info) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_info: NULL argument");
  /* fixed at creation, so no race with a call; read under the live list's
   * lock, which kl_ctx_destroy takes before it frees */
  kl_info mine;
  pthread_mutex_lock(&live_m);
  int found = live_find(c) >= 0;
  if (found) fill_info(&c->spec, &c->layout, &mine);
  pthread_mutex_unlock(&live_m);
  if (!found) return kl_rt_fail(KLRT_ESTATE, "kl_ctx_info: ctx was destroyed");
  return write_out(info, &mine, sizeof mine, "info");
}

kl_result kl_ctx_stats(const kl_ctx *c, kl_stats *stats) {
  if (!c || !stats) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_stats: NULL argument");
  kl_result res = ctx_acquire((kl_ctx *)c, 0, "kl_ctx_stats");
  if (res) return res;
  kl_stats mine = c->stats;
  mine.size = sizeof mine;
  /* with the calls whose rows the device sent wide (sample.c): as far as
   * they have run */
  if (c->mirror) mine.declined[KL_DECLINE_WIDE] += c->mirror[1];
  ctx_release((kl_ctx *)c);
  return write_out(stats, &mine, sizeof mine, "stats");
}

kl_result kl_ctx_status(kl_ctx *c) {
  if (!c) return kl_rt_fail(KLRT_EINVAL, "kl_ctx_status: ctx is NULL");
  kl_result res = ctx_acquire(c, 0, "kl_ctx_status");
  if (res) return res;
  if (!c->state) return ctx_release(c), KLRT_OK; /* one-shot never ran here */
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
  ctx_release(c);
  return res;
}

#ifdef KL_TESTING
const kl_cu *kl_testing_cu;
const kl_nccl_api *kl_testing_nccl;
kl_testing_jit_fn kl_testing_jit;

void kl_testing_fakes(const kl_cu *cu, const kl_nccl_api *nccl, kl_testing_jit_fn jit) {
  kl_testing_cu = cu, kl_testing_nccl = nccl, kl_testing_jit = jit;
}

/* n step slots at dev: each one's step count moved to the largest value <=
 * near with the same residue modulo 6 (3: the rotating buffers; 2: kl_sample's
 * staged rows); the tokens of the last step kept. */
static kl_result move_slots(kl_ctx *c, CUdeviceptr dev, int n, uint32_t near, uint32_t *set) {
  uint64_t *slots = calloc((size_t)n, sizeof *slots);
  if (!slots) return kl_rt_fail(KLRT_ENOMEM, "out of memory");
  CUresult r = c->cu->cuMemcpyDtoH(slots, dev, (size_t)n * 8);
  uint32_t to = 0, first = (uint32_t)slots[0];
  for (int i = 0; i < n && r == CUDA_SUCCESS; i++) {
    uint32_t step = (uint32_t)slots[i];
    if (step != first) {
      free(slots);
      return kl_rt_fail(KLRT_ESTATE, "step slots disagree (%u, %u)", first, step);
    }
    to = near - (uint32_t)((near % 6 + 6 - step % 6) % 6);
    slots[i] = (slots[i] & 0xffffffff00000000ull) | to;
  }
  /* from pageable memory cuMemcpyHtoD may return before the copy lands, and
   * on the legacy stream, unordered with the kernels' streams: wait for it */
  if (r == CUDA_SUCCESS) r = c->cu->cuMemcpyHtoDAsync(dev, slots, (size_t)n * 8, c->stream);
  if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
  free(slots);
  if (r != CUDA_SUCCESS) return kl_rt_fail(KLRT_ECUDA, "step slots: %s", kl_cu_errstr(r));
  if (set) *set = to;
  return KLRT_OK;
}

kl_result kl_testing_set_steps(kl_ctx *c, uint32_t near, uint32_t *gather_step,
                               uint32_t *select_step) {
  if (!c) return kl_rt_fail(KLRT_EINVAL, "kl_testing_set_steps: ctx is NULL");
  if (near >= KL_STEP_WRAP || near < 2)
    return kl_rt_fail(KLRT_EINVAL, "kl_testing_set_steps: %u is not a step (2..%u)", near,
                      KL_STEP_WRAP - 1);
  kl_result res = ctx_acquire(c, 0, "kl_testing_set_steps");
  if (res) return res;
  int pushed;
  if (!c->state) res = kl_rt_fail(KLRT_ESTATE, "the one-shot path has no state here");
  else if (!(res = kl_ctx_enter(c, &pushed))) {
    CUresult r = c->cu->cuCtxSynchronize();
    if (r != CUDA_SUCCESS) res = kl_rt_fail(KLRT_ECUDA, "%s", kl_cu_errstr(r));
    const kl_kernel *g = &c->kern[KL_K_ONESHOT], *sel = &c->kern[KL_K_ARGMAX];
    if (!res) res = move_slots(c, (CUdeviceptr)g->slots, g->nslots, near, gather_step);
    if (!res) res = move_slots(c, (CUdeviceptr)sel->slots, sel->nslots, near, select_step);
    kl_ctx_leave(c, pushed);
  }
  ctx_release(c);
  return res;
}

kl_result kl_testing_marks(kl_ctx *c, void **marks, size_t *bytes, uint32_t *sentinel,
                           int *per_token) {
  if (!c || !marks || !bytes || !sentinel || !per_token)
    return kl_rt_fail(KLRT_EINVAL, "kl_testing_marks: a NULL argument");
  if (!c->recv) return kl_rt_fail(KLRT_ESTATE, "the one-shot path has no buffers here");
  *marks = (void *)(uintptr_t)(c->recv + (CUdeviceptr)c->layout.mark_offset);
  *bytes = 2 * (size_t)c->layout.mark_buffer_bytes;
  *sentinel = c->layout.sentinel32;
  *per_token = c->layout.topk_split;
  return KLRT_OK;
}
#endif

kl_result kl_ctx_destroy(kl_ctx *c) {
  if (!c) return KLRT_OK;
  kl_result res = ctx_acquire(c, 1, "kl_ctx_destroy");
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
