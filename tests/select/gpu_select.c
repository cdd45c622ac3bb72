/* GPU test of kl_argmax and kl_topk, and of the epilogue: all ranks of each
 * spec as threads on ONE GPU (how TP8 is tested while 8-GPU machines are
 * withheld), through the one-shot path.
 *
 *   gpu_select SPEC_FILE [STEPS]
 *   gpu_select --tp2 SPEC_FILE [STEPS]
 *
 * --tp2: the file's tp 2 specs across two GPUs in two processes (NCCL
 * bootstrap) instead: every 10th step has more tokens than max_tokens, so
 * the NCCL path serves it; then the whole run again with KLGEN_DISABLE=1, all
 * through NCCL. Both must pass the same checks.
 *
 * Every step, every rank: test data made on the device from (step, token,
 * column), with hostile rows (all equal, ties across ranks and across the
 * padding boundary, NaN, +Inf, all -Inf, soft-cap saturation, -0 against +0,
 * every value of a 16-bit dtype in turn; padding columns hold NaN or +Inf,
 * which must never count); kl_gather,
 * kl_argmax and kl_topk on it; and a reference kernel that applies the
 * epilogue the way the engine's separate torch ops do, from the same data.
 * The host then checks, bit for bit: the gathered logits against the
 * reference, and argmax and top-k against its own selection from the
 * gathered logits (ties to the lowest column, NaN largest, -0 == +0), and
 * the log-sum-exp against a float64 sum (1e-5 relative). Then the same steps
 * captured in a CUDA graph and replayed. Exit 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h> /* klrt.h includes no NCCL header */

#include "gpu_nccl.h"
#include "klrt/klrt.h"

#define GRAPH_STEPS 4
#define LSE_TOL 1e-5

/* The test data and the reference epilogue, compiled per spec. Keep
 * row_value's kinds in step with the list in the header comment. */
static const char *const kernels_src =
    "typedef unsigned int u32;\n"
    "__device__ u32 mixh(u32 x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15;\n"
    "  x *= 0x846ca68bu; x ^= x >> 16; return x; }\n"
    "__device__ float from_bits(u32 b);\n"
    "__device__ float row_value(u32 step, u32 t, long long j) {\n"
    "  u32 kind = mixh(step * 0x9E3779B1u + t * 0x85EBCA77u) % 11u;\n"
    "  u32 h = mixh(step * 0x27d4eb2fu + t * 0x165667b1u + (u32)j * 0x9E3779B1u);\n"
    "  float u = (float)(h >> 8) * (1.0f / 16777216.0f);\n"
    "  if (j >= VOCAB) return __int_as_float((h & 1) ? 0x7fc00000 : 0x7f800000);\n"
    "  long long a = mixh(step + t * 7u + 1u) % VOCAB, b = mixh(step + t * 13u + 2u) % VOCAB;\n"
    "  switch (kind) {\n"
    "  case 1: return 60.f * u - 30.f;\n"
    "  case 2: return 1.5f;\n"
    "  case 3: return j == a || j == b || j == (a + SHARD) % VOCAB ? 5.f : -8.f * u;\n"
    "  case 4: return j == VOCAB - 1 || j == VOCAB - 1 - SHARD ? 5.f : -8.f * u;\n"
    "  case 5: return j == a || j == b ? __int_as_float(0x7fc00000) : 16.f * u - 8.f;\n"
    "  case 6: return j == a || j == b ? __int_as_float(0x7f800000) : 16.f * u - 8.f;\n"
    "  case 7: return __int_as_float(0xff800000);\n"
    "  case 8: return 200.f + 1000.f * u;\n"
    "  case 9: return j == a ? -0.f : j == b ? 0.f : -1.f - 8.f * u;\n"
    /* every value of a 16-bit dtype, in column order (random bits for fp32) */
    "  case 10: return ELEM == 4 ? __uint_as_float(h) : from_bits((u32)j & 0xffffu);\n"
    "  default: return 16.f * u - 8.f;\n"
    "  }\n"
    "}\n"
    "#if ELEM == 4\n"
    "typedef u32 T;\n"
    "__device__ u32 to_bits(float f) { return __float_as_uint(f); }\n"
    "__device__ float from_bits(u32 b) { return __uint_as_float(b); }\n"
    "#elif FP16\n"
    "typedef unsigned short T;\n"
    "__device__ u32 to_bits(float f) { unsigned short h;\n"
    "  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "__device__ float from_bits(u32 b) { float f;\n"
    "  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"((unsigned short)b)); return f; }\n"
    "#else\n"
    "typedef unsigned short T;\n"
    "__device__ u32 to_bits(float f) {  /* round to nearest even, by hand */\n"
    "  u32 b = __float_as_uint(f);\n"
    "  if (f != f) return 0x7fc0u;\n"
    "  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16; }\n"
    "__device__ float from_bits(u32 b) { return __uint_as_float(b << 16); }\n"
    "#endif\n"
    "__device__ float rnd(float x) { return from_bits(to_bits(x)); }\n"
    "extern \"C\" __global__ void fill(T *shard, int tokens, u32 rank, const u32 *step) {\n"
    "  long long n = (long long)tokens * SHARD;\n"
    "  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += gridDim.x * 256LL)\n"
    "    shard[i] = (T)to_bits(row_value(*step, (u32)(i / SHARD), rank * SHARD + i % SHARD));\n"
    "}\n"
    /* the engine's ops, one at a time: logits / c (x * (1/c)), tanh, * c,
     * * scale, each rounded to the model dtype; or fp32 throughout */
    /* keep0: an input -0 stays -0 (the NCCL path of a spec without epilogue) */
    "extern \"C\" __global__ void ref(void *out, int tokens, const u32 *step, int keep0) {\n"
    "  long long n = (long long)tokens * VOCAB;\n"
    "  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += gridDim.x * 256LL) {\n"
    "    float x = from_bits(to_bits(row_value(*step, (u32)(i / VOCAB), i % VOCAB)));\n"
    "    if (__float_as_uint(x) == 0x80000000u && !keep0) x = 0.f;  /* read as +0 */\n"
    "    if (ENGINE) {\n"
    "      if (CAP > 0) { x = rnd(x * (1.0f / CAP)); x = rnd(tanhf(x)); x = rnd(x * CAP); }\n"
    "      if (SCALE != 1) x = rnd(x * SCALE);\n"
    "    } else {\n"
    "      if (CAP > 0) x = tanhf(x * (1.0f / CAP)) * CAP;\n"
    "      if (SCALE != 1) x = x * SCALE;\n"
    "    }\n"
    "    if (OUT_ELEM == 4) ((u32 *)out)[i] = __float_as_uint(x);\n"
    "    else ((unsigned short *)out)[i] = (unsigned short)to_bits(x);\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void bump(u32 *step) { *step += 1; }\n";

typedef struct kernels {
  CUmodule mod;
  CUfunction fill, ref, bump;
} kernels;

typedef struct shared {
  const char *file;
  kl_spec spec;
  kl_layout l;
  kl_group *group;     /* ranks as threads; NULL: one rank of a process (--tp2) */
  ncclComm_t comm;     /* --tp2 */
  int device, mixed;   /* mixed: some steps over max_tokens (NCCL serves them) */
  int steps, k;
  const kl_cu *cu;
  CUcontext cuctx;
  rank_threads threads;
} shared;

typedef struct rank_ctx {
  shared *sh;
  rank_status st;
  kl_ctx *ctx;     /* the rank's context and buffers, for its graph's steps */
  struct bufs *b;
  long long bad_out, bad_argmax, bad_topk, bad_lse, checks;
  double worst_lse;
} rank_ctx;

/* Host buffers are pinned and allocated before creation: a pageable copy
 * goes through driver staging that may wait on the device, and a rank thread
 * stalled in its copies back while its peers spin lets their steps time out. */
typedef struct bufs {
  CUdeviceptr shard, out, ref, step, idx1, val1, idxk, valk, lse;
  void *h_out, *h_ref;
  int64_t *h_idx1, *h_idxk;
  float *h_val1, *h_valk, *h_lse;
  CUstream s;
  kernels k;
} bufs;

static int load_kernels(const shared *sh, kernels *k) {
  static const char *const names[] = {"fill", "ref", "bump"};
  char head[512];
  const kl_spec *s = &sh->spec;
  snprintf(head, sizeof head,
           "#define ELEM %d\n#define FP16 %d\n#define OUT_ELEM %d\n#define VOCAB %lldLL\n"
           "#define SHARD %lldLL\n#define CAP %af\n#define SCALE %af\n#define ENGINE %d\n",
           sh->l.elem_bytes, s->dtype == KL_FP16, sh->l.out_elem_bytes, (long long)s->vocab_size,
           (long long)sh->l.shard, (double)(float)s->softcap,
           (double)(s->scale != 0 ? (float)s->scale : 1.0f), s->numerics == KL_NUMERICS_ENGINE);
  char *src = malloc(strlen(head) + strlen(kernels_src) + 1);
  strcpy(src, head);
  strcat(src, kernels_src);
  CUfunction fn[3];
  int rc = gpu_load_functions(sh->cu, src, "select_test", &k->mod, names, fn, 3);
  free(src);
  if (rc) return -1;
  k->fill = fn[0], k->ref = fn[1], k->bump = fn[2];
  return 0;
}

static int launch(const kl_cu *cu, CUfunction f, long long n, void **args, CUstream s) {
  long long g = (n + 255) / 256;
  unsigned grid = (unsigned)(g < 1 ? 1 : g > 264 ? 264 : g);
  return cu->cuLaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, s, args, NULL) == CUDA_SUCCESS ? 0 : -1;
}

/* One step on the device: data, the three calls, the reference, step += 1. */
static int one_step(rank_ctx *r, kl_ctx *ctx, bufs *b, int tokens) {
  const shared *sh = r->sh;
  const kl_cu *cu = sh->cu;
  unsigned rank = (unsigned)r->st.rank;
  void *fa[] = {&b->shard, &tokens, &rank, &b->step};
  /* The one-shot path and the epilogue read -0 as +0; the NCCL path of a
   * spec without epilogue moves it as it is (README, "Using it"). */
  int keep0 = !sh->l.epilogue && (tokens > sh->spec.max_tokens || getenv("KLGEN_DISABLE"));
  void *ra[] = {&b->ref, &tokens, &b->step, &keep0};
  void *ba[] = {&b->step};
  if (launch(cu, b->k.fill, (long long)tokens * sh->l.shard, fa, b->s))
    return rank_fail(&r->st, "fill", "launch failed");
  if (kl_gather(ctx, (void *)b->shard, (void *)b->out, tokens, b->s) != KLRT_OK)
    return rank_fail(&r->st, "kl_gather", kl_last_error());
  if (kl_argmax(ctx, (void *)b->shard, (int64_t *)b->idx1, (float *)b->val1, tokens, b->s))
    return rank_fail(&r->st, "kl_argmax", kl_last_error());
  if (kl_topk(ctx, (void *)b->shard, (int64_t *)b->idxk, (float *)b->valk, (float *)b->lse,
              tokens, b->s))
    return rank_fail(&r->st, "kl_topk", kl_last_error());
  if (launch(cu, b->k.ref, (long long)tokens * sh->spec.vocab_size, ra, b->s) ||
      cu->cuLaunchKernel(b->k.bump, 1, 1, 1, 1, 1, 1, 0, b->s, ba, NULL) != CUDA_SUCCESS)
    return rank_fail(&r->st, "reference", "launch failed");
  return 0;
}

/* ---- the host's selection, from the gathered logits ---- */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, b;
  if (e == 31) b = sign | 0x7f800000u | (m << 13);
  else if (e) b = sign | ((e + 112) << 23) | (m << 13);
  else if (!m) b = sign;
  else {
    float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static float out_at(const shared *sh, const void *out, long long i) {
  uint32_t b;
  if (sh->l.out_elem_bytes == 4) memcpy(&b, (const char *)out + 4 * i, 4);
  else if (sh->spec.dtype == KL_FP16) return half_to_float(((const uint16_t *)out)[i]);
  else b = (uint32_t)((const uint16_t *)out)[i] << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static uint32_t bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

/* Equal bits, or both NaN. */
static int same(float a, float b) { return bits(a) == bits(b) || (isnan(a) && isnan(b)); }

/* (v, i) comes before (w, j): larger value, NaN largest, then lower column. */
static int before(float v, long long i, float w, long long j) {
  if (isnan(v) || isnan(w)) return isnan(v) && (!isnan(w) || i < j);
  return v > w || (v == w && i < j);
}

static double lse_ref(const shared *sh, const void *out, long long row) {
  long long V = sh->spec.vocab_size;
  double m = -INFINITY, sum = 0;
  for (long long j = 0; j < V; j++) {
    double x = out_at(sh, out, row + j);
    if (isnan(x)) return NAN;
    if (x > m) m = x;
  }
  if (isinf(m)) return m;
  for (long long j = 0; j < V; j++) sum += exp((double)out_at(sh, out, row + j) - m);
  return m + log(sum);
}

static void check_token(rank_ctx *r, bufs *b, int t, uint32_t step) {
  const shared *sh = r->sh;
  long long V = sh->spec.vocab_size, row = (long long)t * V;
  int K = sh->k;
  long long idx[64];
  float val[64];
  int n = 0;
  for (long long j = 0; j < V; j++) {
    float x = out_at(sh, b->h_out, row + j);
    /* an input -0 in out (the NCCL path, no epilogue): kl_argmax/kl_topk read +0 */
    if (!sh->l.epilogue && bits(x) == 0x80000000u) x = 0.f;
    if (n == K && !before(x, j, val[K - 1], idx[K - 1])) continue;
    int p = n < K ? n++ : K - 1;
    while (p > 0 && before(x, j, val[p - 1], idx[p - 1])) val[p] = val[p - 1], idx[p] = idx[p - 1], p--;
    val[p] = x, idx[p] = j;
  }
  if (b->h_idx1[t] != idx[0] || !same(b->h_val1[t], val[0])) {
    if (r->bad_argmax++ < 3)
      fprintf(stderr, "%s rank %d step %u token %d: argmax %lld (%a), want %lld (%a)\n",
              sh->spec.name, r->st.rank, step, t, (long long)b->h_idx1[t], (double)b->h_val1[t],
              idx[0], (double)val[0]);
  }
  for (int p = 0; p < K; p++)
    if (b->h_idxk[t * K + p] != idx[p] || !same(b->h_valk[t * K + p], val[p])) {
      if (r->bad_topk++ < 3)
        fprintf(stderr, "%s rank %d step %u token %d: top-k[%d] %lld (%a), want %lld (%a)\n",
                sh->spec.name, r->st.rank, step, t, p, (long long)b->h_idxk[t * K + p],
                (double)b->h_valk[t * K + p], idx[p], (double)val[p]);
      break;
    }
  double want = lse_ref(sh, b->h_out, row), got = b->h_lse[t];
  int ok = isnan(want) ? isnan(got) : isinf(want) ? got == want : !isnan(got) && !isinf(got);
  if (ok && isfinite(want)) {
    double rel = fabs(got - want) / fmax(fabs(want), 1.0);
    if (rel > r->worst_lse) r->worst_lse = rel;
    ok = rel <= LSE_TOL;
  }
  if (!ok && r->bad_lse++ < 3)
    fprintf(stderr, "%s rank %d step %u token %d: lse %.9g, want %.12g\n", sh->spec.name,
            r->st.rank, step, t, got, want);
}

/* Copies the step's results back and checks them all. */
static int host_check(rank_ctx *r, bufs *b, int tokens, uint32_t step) {
  const shared *sh = r->sh;
  const kl_cu *cu = sh->cu;
  size_t out_bytes = (size_t)tokens * (size_t)sh->spec.vocab_size * (size_t)sh->l.out_elem_bytes;
  size_t K = (size_t)sh->k;
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_out, b->out, out_bytes, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_ref, b->ref, out_bytes, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_idx1, b->idx1, (size_t)tokens * 8, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_val1, b->val1, (size_t)tokens * 4, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_idxk, b->idxk, (size_t)tokens * K * 8, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_valk, b->valk, (size_t)tokens * K * 4, b->s));
  CU_CHECK(cu, cuMemcpyDtoHAsync(b->h_lse, b->lse, (size_t)tokens * 4, b->s));
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  long long n = (long long)tokens * sh->spec.vocab_size, bad = 0;
  for (long long i = 0; i < n; i++)
    if (!same(out_at(sh, b->h_out, i), out_at(sh, b->h_ref, i)) && bad++ < 3)
      fprintf(stderr, "%s rank %d step %u: out[%lld] %a, reference %a\n", sh->spec.name,
              r->st.rank, step, i, (double)out_at(sh, b->h_out, i),
              (double)out_at(sh, b->h_ref, i));
  r->bad_out += bad;
  for (int t = 0; t < tokens; t++) check_token(r, b, t, step);
  r->checks += tokens;
  return 0;
}

static int tokens_at(const shared *sh, int s) {
  static const int cycle[4] = {1, 2, 5, 8};
  if (sh->mixed && s % 10 == 7) return (int)sh->spec.max_tokens + 3;
  int t = s % 50 == 49 ? (int)sh->spec.max_tokens : cycle[s % 4];
  return t < sh->spec.max_tokens ? t : (int)sh->spec.max_tokens;
}

static int eager(rank_ctx *r, kl_ctx *ctx, bufs *b) {
  for (int s = 0; s < r->sh->steps && !r->st.failed; s++) {
    int tokens = tokens_at(r->sh, s);
    if (one_step(r, ctx, b, tokens) || host_check(r, b, tokens, (uint32_t)s)) return -1;
  }
  return 0;
}

/* A graph's step: one_step with the token count of its place. */
static int graph_step(void *arg, int s) {
  rank_ctx *r = arg;
  return one_step(r, r->ctx, r->b, tokens_at(r->sh, s));
}

/* GRAPH_STEPS steps captured once, replayed; the last replayed step checked. */
static int graph(rank_ctx *r, kl_ctx *ctx, bufs *b) {
  const kl_cu *cu = r->sh->cu;
  gpu_graph gr;
  r->ctx = ctx, r->b = b;
  if (gpu_graph_steps(cu, b->s, r->sh->group ? &r->sh->threads : NULL, r->st.failed, GRAPH_STEPS,
                      graph_step, r, 16, &gr))
    return -1;
  uint32_t step;
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  CU_CHECK(cu, cuMemcpyDtoH(&step, b->step, 4));
  host_check(r, b, tokens_at(r->sh, GRAPH_STEPS - 1), step - 1);
  gpu_graph_destroy(cu, &gr);
  return 0;
}

static void alloc_bufs(const shared *sh, bufs *b) {
  const kl_cu *cu = sh->cu;
  size_t T = (size_t)sh->spec.max_tokens + 8, K = (size_t)sh->k;
  size_t out_bytes = T * (size_t)sh->spec.vocab_size * (size_t)sh->l.out_elem_bytes;
  CU_CHECK(cu, cuStreamCreate(&b->s, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cu, cuMemAlloc(&b->shard, T * (size_t)sh->l.shard_bytes));
  CU_CHECK(cu, cuMemAlloc(&b->out, out_bytes));
  CU_CHECK(cu, cuMemAlloc(&b->ref, out_bytes));
  CU_CHECK(cu, cuMemAlloc(&b->step, 16));
  CU_CHECK(cu, cuMemAlloc(&b->idx1, T * 8));
  CU_CHECK(cu, cuMemAlloc(&b->val1, T * 4));
  CU_CHECK(cu, cuMemAlloc(&b->idxk, T * K * 8));
  CU_CHECK(cu, cuMemAlloc(&b->valk, T * K * 4));
  CU_CHECK(cu, cuMemAlloc(&b->lse, T * 4));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_out, out_bytes));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_ref, out_bytes));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_idx1, T * 8));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_val1, T * 4));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_idxk, T * K * 8));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_valk, T * K * 4));
  CU_CHECK(cu, cuMemAllocHost((void **)&b->h_lse, T * 4));
  /* A stream's first work may wait on the device behind the GPU's earlier
   * work, a peer's spinning grid too, and the step times out: each test
   * kernel runs once here on the rank's stream, before any peer spins. */
  int one = 1;
  unsigned rank0 = 0;
  void *fa[] = {&b->shard, &one, &rank0, &b->step};
  void *ba[] = {&b->step};
  if (launch(cu, b->k.fill, sh->l.shard, fa, b->s)) {
    fprintf(stderr, "%s: the first launch of the fill kernel failed\n", sh->spec.name);
    exit(1); /* as CU_CHECK: a setup failure ends the test */
  }
  CU_CHECK(cu, cuLaunchKernel(b->k.bump, 1, 1, 1, 1, 1, 1, 0, b->s, ba, NULL));
  CU_CHECK(cu, cuMemsetD32Async(b->step, 0, 4, b->s));
  CU_CHECK(cu, cuStreamSynchronize(b->s));
}

static void free_bufs(const kl_cu *cu, bufs *b) {
  CUdeviceptr d[] = {b->shard, b->out, b->ref, b->step, b->idx1, b->val1, b->idxk, b->valk, b->lse};
  void *h[] = {b->h_out, b->h_ref, b->h_idx1, b->h_val1, b->h_idxk, b->h_valk, b->h_lse};
  for (size_t i = 0; i < sizeof d / sizeof *d; i++) cu->cuMemFree(d[i]);
  for (size_t i = 0; i < sizeof h / sizeof *h; i++) cu->cuMemFreeHost(h[i]);
  cu->cuModuleUnload(b->k.mod);
  cu->cuStreamDestroy(b->s);
}

static void *run_rank(void *arg) {
  rank_ctx *r = arg;
  shared *sh = r->sh;
  const kl_cu *cu = sh->cu;
  cu->cuCtxSetCurrent(sh->cuctx);
  bufs b;
  memset(&b, 0, sizeof b);
  /* Everything that may synchronize the device happens before creation. */
  if (load_kernels(sh, &b.k)) rank_fail(&r->st, "test kernels", "did not build");
  alloc_bufs(sh, &b);
  CU_CHECK(cu, cuCtxSynchronize());
  kl_config cfg = rank_config(r->st.rank, sh->spec.tp, sh->device, sh->group);
  cfg.nccl = sh->comm;
  cfg.crossover_bytes = 1LL << 40; /* NCCL only where the test says: tokens, KLGEN_DISABLE */
  kl_ctx *ctx = NULL;
  /* a failed rank still meets the others below (ctx is read only once
   * creation returned: an argument list has no order) */
  const kl_result made = kl_ctx_create_file(&ctx, sh->file, sh->spec.name, &cfg);
  rank_created(&r->st, made, ctx);
  /* Creation made the group's own streams work; this rank's stream works
   * once more after that and every rank waits for every other's, so no
   * first step waits behind a peer's first step (gpu_diff does the same). */
  CU_CHECK(cu, cuMemsetD32Async(b.step, 0, 4, b.s));
  CU_CHECK(cu, cuStreamSynchronize(b.s));
  if (sh->group) ranks_sync(&sh->threads);
  if (!r->st.failed) eager(r, ctx, &b);
  graph(r, ctx, &b);
  if (!r->st.failed && ctx) {
    if (kl_ctx_status(ctx) != KLRT_OK) rank_fail(&r->st, "device status", kl_last_error());
    kl_stats st = KL_STATS_INIT;
    kl_ctx_stats(ctx, &st);
    int disabled = getenv("KLGEN_DISABLE") != NULL;
    uint64_t over = sh->mixed ? 3 * (uint64_t)((sh->steps + 2) / 10) : 0; /* 3 calls a step */
    if (disabled ? st.oneshot != 0 : st.nccl != over) {
      char why[128];
      snprintf(why, sizeof why, "%llu one-shot and %llu NCCL calls", (unsigned long long)st.oneshot,
               (unsigned long long)st.nccl);
      rank_fail(&r->st, "paths", why);
    }
  }
  cu->cuStreamSynchronize(b.s);
  if (ctx && kl_ctx_destroy(ctx) != KLRT_OK) rank_fail(&r->st, "kl_ctx_destroy", kl_last_error());
  free_bufs(cu, &b);
  return NULL;
}

/* One line for n ranks' results; the number of failures. */
static int summarize(const shared *sh, const rank_ctx *r, int n, const char *how) {
  int fails = 0;
  long long out = 0, am = 0, tk = 0, lse = 0, checks = 0;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    fails += rank_failed(&r[i].st);
    out += r[i].bad_out, am += r[i].bad_argmax, tk += r[i].bad_topk, lse += r[i].bad_lse;
    checks += r[i].checks;
    if (r[i].worst_lse > worst) worst = r[i].worst_lse;
  }
  if (out || am || tk || lse || checks == 0) fails++;
  printf("%s %s: %s, %d eager steps + a graph, %lld rows checked: %lld epilogue, %lld argmax, "
         "%lld top-%d, %lld lse mismatches (lse worst %.2g relative)\n", fails ? "FAIL" : "ok",
         sh->spec.name, how, sh->steps, checks, out, am, tk, sh->k, lse, worst);
  fflush(stdout);
  return fails;
}

static int run_spec(shared *sh) {
  int tp = sh->spec.tp;
  kl_group_create(&sh->group, tp);
  rank_ctx *r = calloc((size_t)tp, sizeof *r);
  for (int i = 0; i < tp; i++) r[i] = (rank_ctx){.sh = sh, .st.rank = i};
  ranks_start(&sh->threads, tp, run_rank, r, sizeof *r);
  ranks_join(&sh->threads);
  char how[64];
  snprintf(how, sizeof how, "tp %d on one GPU", tp);
  int fails = summarize(sh, r, tp, how);
  kl_group_destroy(sh->group);
  free(r);
  return fails;
}

/* A --tp2 run: the spec, its file, the steps, how the run goes (its line). */
typedef struct tp2_run_arg {
  const kl_spec *spec;
  const char *file;
  int steps;
  const char *how;
} tp2_run_arg;

/* Rank `rank` of a tp 2 spec, in a process of its own, on GPU `rank`. */
static int tp2_rank(int rank, const int fd[2], void *arg) {
  const tp2_run_arg *a = arg;
  const kl_cu *cu = gpu_require(2);
  shared sh = {.file = a->file, .spec = *a->spec, .cu = cu, .device = rank, .mixed = 1,
               .steps = a->steps, .k = a->spec->topk};
  if (gpu_nccl_rank(cu, rank, 2, fd, &sh.cuctx, &sh.comm)) return 1;
  kl_err err;
  kl_layout_derive(&sh.spec, &sh.l, &err);
  rank_ctx r = {.sh = &sh, .st.rank = rank};
  run_rank(&r);
  rank_failed(&r.st);
  char line[96];
  snprintf(line, sizeof line, "rank %d of 2 processes, %s", rank, a->how);
  int fails = summarize(&sh, &r, 1, line) + r.st.failed;
  ncclCommDestroy(sh.comm);
  return fails ? 1 : 0;
}

static int tp2_run(const kl_spec *spec, const char *file, int steps, const char *how) {
  tp2_run_arg a = {spec, file, steps, how};
  int fails = ranks_fork(2, tp2_rank, &a);
  return fails < 0 ? 1 : fails;
}

/* --tp2: forked ranks on two GPUs; the parent never starts CUDA. */
static int tp2_main(const char *file, int steps) {
  gpu_require_in_child(2);
  kl_spec_list list;
  kl_err err;
  if (kl_spec_load_file(file, NULL, &list, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
  int fails = 0, ran = 0;
  for (int i = 0; i < list.n; i++) {
    if (list.v[i].tp != 2) continue;
    ran++;
    unsetenv("KLGEN_DISABLE");
    fails += tp2_run(&list.v[i], file, steps, "one-shot, NCCL over max_tokens");
    setenv("KLGEN_DISABLE", "1", 1);
    fails += tp2_run(&list.v[i], file, steps, "KLGEN_DISABLE=1: all NCCL");
    unsetenv("KLGEN_DISABLE");
  }
  kl_spec_list_free(&list);
  if (!ran) fails++, fprintf(stderr, "no tp 2 spec in %s\n", file);
  printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails ? 1 : 0;
}

static int one_spec(const gpu_spec_run *g, int steps) {
  shared sh = {.file = g->file, .spec = *g->spec, .cu = g->cu, .cuctx = g->cuctx, .steps = steps,
               .k = g->spec->topk};
  kl_err err;
  kl_layout_derive(&sh.spec, &sh.l, &err);
  return run_spec(&sh);
}

int main(int argc, char **argv) {
  int tp2 = argc > 1 && !strcmp(argv[1], "--tp2");
  if (argc < 2 + tp2) {
    fprintf(stderr, "usage: %s [--tp2] SPEC_FILE [STEPS]\n", argv[0]);
    return 2;
  }
  if (tp2) return tp2_main(argv[2], argc > 3 ? atoi(argv[3]) : 1000);
  return gpu_specs_main(argv[1], one_spec, argc > 2 ? atoi(argv[2]) : 1000);
}
