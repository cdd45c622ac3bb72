/* klfloor: what a one-shot gather step cannot go below on this machine.
 *
 *   klfloor [--ctas N] [--threads N] [--steps N] [--replays R]
 *
 * A one-shot step is: a kernel boundary (the previous kernel finishes, this
 * one's PDL wait releases), one load of the input from L2, stores that cross
 * NVLink into a peer's memory, and a poll there that sees them. klfloor times
 * each piece alone, with kernels of its own (JIT-compiled by NVRTC):
 *   boundary  empty kernels (PDL wait, then trigger, as the gather does)
 *             chained in a CUDA graph, with and without PDL, and with one
 *             16-byte store per thread, locally or into GPU 1: per step
 *   L2 load   one thread chasing pointers through an L2-resident buffer with
 *             ld.global.cg: per dependent load
 *   hop       GPU 0 and GPU 1 ping-pong 16-byte chunks (plain stores into the
 *             peer, ld.relaxed.sys polls of their own memory): half a round
 *             trip, for one chunk and for N x threads chunks (one per thread)
 * and prints the sum boundary (storing into GPU 1) + L2 load + hop of N x
 * threads chunks: the floor klbench's 1-token figure can be read against.
 * Timing: CUDA events, median over replays (docs/BENCHMARKS.md, "Method"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench_util.h"
#include "floor.h"

#include "klgen.h"
#include "rt.h"

/* The L2 chase and the ping-pong; the boundary's kernels are floor.c's. */
static const char *const SRC =
    "typedef unsigned u32;\n"
    "__device__ __forceinline__ unsigned long long now() {\n"
    "  unsigned long long t;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "  return t;\n"
    "}\n"
    /* next[] is a cycle of indices 128 bytes apart: every load misses L1
     * (ld.cg) and hits L2, and each waits for the one before. */
    "extern \"C\" __global__ void kl_floor_chase(const u32 *next, int n, u32 *sink) {\n"
    "  u32 i = 0;\n"
    "  for (int k = 0; k < n; ++k)\n"
    "    asm volatile(\"ld.global.cg.u32 %0, [%1];\" : \"=r\"(i) : \"l\"(next + i));\n"
    "  *sink = i;\n"
    "}\n"
    /* Thread t owns chunk t. The starting side stores round i into the
     * peer and waits for it to come back; the other side waits, then answers.
     * A thread still polling a second after the kernel began gives up (no
     * peer, or a grid too large to be resident at once) and sets *err. */
    "extern \"C\" __global__ void kl_floor_pingpong(uint4 *mine, uint4 *peer, int iters,\n"
    "                                               int starts, u32 *err) {\n"
    "  const u32 t = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  const unsigned long long t0 = now();\n"
    "  for (u32 i = 1; i <= (u32)iters; ++i) {\n"
    "    if (starts) peer[t] = make_uint4(i, i, i, i);\n"
    "    for (u32 spin = 1;; ++spin) {\n"
    "      uint4 v;\n"
    "      asm volatile(\"ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];\"\n"
    "                   : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(mine + t)\n"
    "                   : \"memory\");\n"
    "      if (v.x == i && v.y == i && v.z == i && v.w == i) break;\n"
    "      if ((spin & 1023) == 0 && (now() - t0 > 1000000000ull || *(volatile u32 *)err)) {\n"
    "        atomicExch(err, 1u);\n"
    "        return;\n"
    "      }\n"
    "    }\n"
    "    if (!starts) peer[t] = make_uint4(i, i, i, i);\n"
    "  }\n"
    "}\n";

#define MAX_REPLAYS 101
#define CHASE_WORDS (1u << 20) /* 4 MiB: in L2, far beyond L1 */

typedef struct gpu {
  CUmodule mod;
  CUfunction empty, store, chase, pingpong;
  cudaStream_t s;
  cudaEvent_t e0, e1;
} gpu;

static int ctas = 20, threads = 128, steps = 200, replays = 21;

const char *const kl_bench_prog = "klfloor";

#define CU(call)                                  \
  do {                                            \
    CUresult r_ = (call);                         \
    if (r_ != CUDA_SUCCESS) die(#call, kl_cu_errstr(r_)); \
  } while (0)

static const kl_cu *cu;

static void setup(gpu *g, int dev, const char *arch) {
  CUDA(cudaSetDevice(dev));
  CUDA(cudaFree(0)); /* the primary context, current for the driver calls below */
  kl_binary bin;
  kl_err e;
  size_t n = strlen(floor_boundary_src) + strlen(SRC) + 1;
  char *src = malloc(n);
  if (!src) die("malloc", "out of memory");
  snprintf(src, n, "%s%s", floor_boundary_src, SRC);
  if (kl_nvrtc_compile(src, "klfloor", arch, &bin, &e)) die("NVRTC", e.msg);
  free(src);
  CU(cu->cuModuleLoadData(&g->mod, bin.data));
  kl_binary_free(&bin);
  CU(cu->cuModuleGetFunction(&g->empty, g->mod, "kl_floor_empty"));
  CU(cu->cuModuleGetFunction(&g->store, g->mod, "kl_floor_store"));
  CU(cu->cuModuleGetFunction(&g->chase, g->mod, "kl_floor_chase"));
  CU(cu->cuModuleGetFunction(&g->pingpong, g->mod, "kl_floor_pingpong"));
  CUDA(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking));
  CUDA(cudaEventCreate(&g->e0));
  CUDA(cudaEventCreate(&g->e1));
}

static double elapsed_us(gpu *g) {
  float ms;
  CUDA(cudaEventSynchronize(g->e1));
  CUDA(cudaEventElapsedTime(&ms, g->e0, g->e1));
  return ms * 1e3;
}

/* µs per step of `steps` kernels captured in one graph: empty ones, or ones
 * that store one chunk per thread to dst. */
static double boundary(gpu *g, int pdl, void *dst) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA(cudaStreamBeginCapture(g->s, cudaStreamCaptureModeThreadLocal));
  void *args[] = {&dst};
  for (int i = 0; i < steps; i++)
    CU(floor_launch(dst ? g->store : g->empty, dst ? args : NULL, (CUstream)g->s, ctas, threads,
                    pdl));
  CUDA(cudaStreamEndCapture(g->s, &graph));
  CUDA(cudaGraphInstantiate(&exec, graph, 0));
  double t[MAX_REPLAYS];
  for (int r = -1; r < replays; r++) { /* r = -1 warms up */
    CUDA(cudaEventRecord(g->e0, g->s));
    CUDA(cudaGraphLaunch(exec, g->s));
    CUDA(cudaEventRecord(g->e1, g->s));
    double us = elapsed_us(g);
    if (r >= 0) t[r] = us / steps;
  }
  CUDA(cudaGraphExecDestroy(exec));
  CUDA(cudaGraphDestroy(graph));
  return median(t, replays);
}

/* µs per dependent L2 load: a chase of n loads minus one of n / 2 (the
 * difference removes the launch and the kernel's fixed costs). */
static double l2_load(gpu *g) {
  unsigned *h = malloc(CHASE_WORDS * sizeof *h), *next, *sink;
  const unsigned stride = 32, lines = CHASE_WORDS / stride;
  unsigned *order = malloc(lines * sizeof *order);
  if (!h || !order) die("malloc", "out of memory");
  srand(12345);
  for (unsigned i = 0; i < lines; i++) order[i] = i;
  for (unsigned i = lines - 1; i > 0; i--) { /* a random cycle through every line */
    unsigned j = (unsigned)rand() % (i + 1), x = order[i];
    order[i] = order[j], order[j] = x;
  }
  memset(h, 0, CHASE_WORDS * sizeof *h);
  for (unsigned i = 0; i < lines; i++) h[order[i] * stride] = order[(i + 1) % lines] * stride;
  CUDA(cudaMalloc((void **)&next, CHASE_WORDS * sizeof *h));
  CUDA(cudaMalloc((void **)&sink, sizeof *sink));
  CUDA(cudaMemcpy(next, h, CHASE_WORDS * sizeof *h, cudaMemcpyHostToDevice));
  double t[2][MAX_REPLAYS];
  int counts[2] = {20000, 10000};
  for (int r = -1; r < replays; r++)
    for (int k = 0; k < 2; k++) {
      void *args[] = {&next, &counts[k], &sink};
      CUDA(cudaEventRecord(g->e0, g->s));
      CU(cu->cuLaunchKernel(g->chase, 1, 1, 1, 1, 1, 1, 0, (CUstream)g->s, args, NULL));
      CUDA(cudaEventRecord(g->e1, g->s));
      double us = elapsed_us(g);
      if (r >= 0) t[k][r] = us;
    }
  CUDA(cudaFree(next));
  CUDA(cudaFree(sink));
  free(h), free(order);
  return (median(t[0], replays) - median(t[1], replays)) / (counts[0] - counts[1]);
}

/* µs per hop (half a round trip) with `n` chunks in flight, GPU 0 <-> GPU 1:
 * a ping-pong of 2 x iters hops minus one of iters hops. */
static double hop(gpu *g, int nctas, int nthreads) {
  size_t bytes = (size_t)nctas * (size_t)nthreads * 16;
  void *buf[2];
  unsigned *err[2];
  for (int d = 0; d < 2; d++) {
    CUDA(cudaSetDevice(d));
    CUDA(cudaMalloc(&buf[d], bytes));
    CUDA(cudaMalloc((void **)&err[d], sizeof(unsigned)));
    CUDA(cudaMemset(err[d], 0, sizeof(unsigned)));
  }
  int counts[2] = {2000, 1000};
  double t[2][MAX_REPLAYS];
  for (int r = -1; r < replays; r++)
    for (int k = 0; k < 2; k++) {
      for (int d = 0; d < 2; d++) {
        CUDA(cudaSetDevice(d));
        CUDA(cudaMemset(buf[d], 0, bytes));
        CUDA(cudaDeviceSynchronize());
      }
      for (int d = 1; d >= 0; d--) { /* the answering side first: it must be running */
        int starts = d == 0;
        void *args[] = {&buf[d], &buf[1 - d], &counts[k], &starts, &err[d]};
        CUDA(cudaSetDevice(d));
        if (d == 0) CUDA(cudaEventRecord(g[0].e0, g[0].s));
        CU(cu->cuLaunchKernel(g[d].pingpong, (unsigned)nctas, 1, 1, (unsigned)nthreads, 1, 1, 0,
                              (CUstream)g[d].s, args, NULL));
        if (d == 0) CUDA(cudaEventRecord(g[0].e1, g[0].s));
      }
      double us = elapsed_us(&g[0]);
      CUDA(cudaSetDevice(1));
      CUDA(cudaStreamSynchronize(g[1].s));
      unsigned e0 = 0, e1 = 0;
      CUDA(cudaMemcpy(&e1, err[1], sizeof e1, cudaMemcpyDeviceToHost));
      CUDA(cudaSetDevice(0));
      CUDA(cudaMemcpy(&e0, err[0], sizeof e0, cudaMemcpyDeviceToHost));
      if (e0 || e1) die("ping-pong", "a GPU never saw its peer's stores (1 s)");
      if (r >= 0) t[k][r] = us;
    }
  for (int d = 0; d < 2; d++) {
    CUDA(cudaSetDevice(d));
    CUDA(cudaFree(buf[d]));
    CUDA(cudaFree(err[d]));
  }
  CUDA(cudaSetDevice(0));
  return (median(t[0], replays) - median(t[1], replays)) / (2.0 * (counts[0] - counts[1]));
}

static int number(const char *s, int lo, int hi) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
  return (int)v;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: klfloor [--ctas N] [--threads N<=1024] [--steps N] [--replays R<=%d]\n"
          "Times the pieces of a one-shot gather step alone on GPUs 0 and 1: a kernel\n"
          "boundary (with and without PDL), a dependent L2 load, and an NVLink hop, and\n"
          "their sum, the floor a one-token step can be read against.\n"
          "  --ctas N      CTAs of the boundary and hop kernels (default 20)\n"
          "  --threads N   threads a CTA, one 16-byte chunk each (default 128)\n"
          "  --steps N     kernels a graph holds (default 200)\n"
          "  --replays R   replays timed, median reported (default 21)\n"
          "  -h, --help    this text\n",
          MAX_REPLAYS);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout), 0;
    int *dst = !strcmp(argv[i], "--ctas")      ? &ctas
               : !strcmp(argv[i], "--threads") ? &threads
               : !strcmp(argv[i], "--steps")   ? &steps
               : !strcmp(argv[i], "--replays") ? &replays
                                               : NULL;
    int hi = dst == &threads ? 1024 : dst == &replays ? MAX_REPLAYS : 1 << 16;
    if (!dst || i + 1 == argc || (*dst = number(argv[++i], 1, hi)) < 0) {
      usage(stderr);
      return 2;
    }
  }
  const char *why = NULL;
  if (!(cu = kl_cu_get(&why))) die("CUDA driver", why);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) die("CUDA", "no GPU");
  struct cudaDeviceProp prop;
  CUDA(cudaGetDeviceProperties(&prop, 0));
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d%d", prop.major, prop.minor);
  gpu g[2];
  for (int d = 0; d < (n > 1 ? 2 : 1); d++) setup(&g[d], d, arch);
  CUDA(cudaSetDevice(0));
  printf("klfloor on %d x %s (%s): the pieces of a one-shot step, each alone\n", n, prop.name,
         arch);
  printf("method: CUDA events, median of %d replays; %d x %d threads stand for the gather's "
         "grid\n\n", replays, ctas, threads);
  size_t chunk_bytes = (size_t)ctas * (size_t)threads * 16;
  void *local, *remote = NULL;
  CUDA(cudaMalloc(&local, chunk_bytes));
  double b_pdl = boundary(&g[0], 1, NULL), b_plain = boundary(&g[0], 0, NULL);
  double b_local = boundary(&g[0], 1, local), l2 = l2_load(&g[0]);
  printf("kernel boundary: empty kernels chained in a graph, PDL  %6.2f us per step\n", b_pdl);
  printf("                 the same without PDL                   %6.2f us per step\n", b_plain);
  printf("                 PDL, each thread stores 16 B locally   %6.2f us per step\n", b_local);
  if (n < 2) {
    printf("dependent L2 load (ld.global.cg, one thread)            %6.2f us\n", l2);
    printf("\none GPU: no NVLink hop to measure\n");
    return 0;
  }
  int p01 = 0, p10 = 0;
  CUDA(cudaDeviceCanAccessPeer(&p01, 0, 1));
  CUDA(cudaDeviceCanAccessPeer(&p10, 1, 0));
  if (!p01 || !p10) die("GPU 0 and GPU 1", "no peer access between them");
  for (int d = 0; d < 2; d++) {
    CUDA(cudaSetDevice(d));
    cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
      die("cudaDeviceEnablePeerAccess", cudaGetErrorString(e));
  }
  CUDA(cudaSetDevice(1));
  CUDA(cudaMalloc(&remote, chunk_bytes));
  CUDA(cudaSetDevice(0));
  double b_remote = boundary(&g[0], 1, remote);
  double h1 = hop(g, 1, 1), hn = hop(g, ctas, threads);
  int kib = ctas * threads * 16 / 1024;
  printf("                 PDL, each thread stores 16 B on GPU 1  %6.2f us per step\n", b_remote);
  printf("dependent L2 load (ld.global.cg, one thread)            %6.2f us\n", l2);
  printf("hop to the peer GPU (store there, its poll sees it):\n");
  char label[64];
  snprintf(label, sizeof label, "%d chunks of 16 B (%d KiB)", ctas * threads, kib);
  printf("                 %-38s %6.2f us\n", "1 chunk of 16 B", h1);
  printf("                 %-38s %6.2f us\n", label, hn);
  /* A step: its boundary (it stores into the peer), the input load, the hop. */
  printf("\nfloor of a one-shot step of %d KiB per rank: %.2f + %.2f + %.2f = %.2f us\n", kib,
         b_remote, l2, hn, b_remote + l2 + hn);
  CUDA(cudaSetDevice(1));
  CUDA(cudaFree(remote));
  CUDA(cudaSetDevice(0));
  CUDA(cudaFree(local));
  return 0;
}
