/* The GPU part of the tests' harness (ranks.h is the part without a GPU):
 * skip (exit 77) without a GPU, a device's context, CU_CHECK, test-data
 * kernels and the host reference they must agree with, graph capture and
 * replay, a context's marks (the NCCL bootstrap of rank processes is
 * gpu_nccl.h's). */
#ifndef KL_GPU_UTIL_H
#define KL_GPU_UTIL_H

#include <stdint.h>

#include "cu.h"
#include "klgen.h"
#include "klrt/klrt.h"
#include "ranks.h"

#define SKIP 77

/* The driver, or exit(77) with a reason if fewer than `need` GPUs. */
const kl_cu *gpu_require(int need);
/* exit(77) likewise, the GPUs counted in a child process: the caller does
 * not start CUDA, so it may still fork ranks. */
void gpu_require_in_child(int need);

/* GPU dev's primary context, retained, and made current if `current`. */
CUcontext gpu_primary(const kl_cu *cu, int dev, int current);
/* The start of the one-GPU tests: the specs of `file` (exit 1 with the
 * message if they do not load) and GPU 0's primary context, made current. */
CUcontext gpu_one_device(const kl_cu *cu, const char *file, kl_spec_list *list);
/* The main of a test whose ranks share GPU 0 as threads: each rank's stream
 * gets a hardware queue of its own (CUDA_DEVICE_MAX_CONNECTIONS=32, set
 * before CUDA starts: libklrt refuses ranks sharing a GPU otherwise), GPU 0's
 * context is made current (gpu_one_device), and each spec of `file` goes
 * through fn with the test's step count; fn returns its failures. Prints
 * PASSED or FAILED; returns the exit status (exits 77 without a GPU, 1 if
 * the file does not load). */
typedef struct gpu_spec_run {
  const kl_cu *cu;
  CUcontext cuctx;
  const char *file;
  const kl_spec *spec;
  int index; /* the spec's in the file */
} gpu_spec_run;
int gpu_specs_main(const char *file, int (*fn)(const gpu_spec_run *run, int steps), int steps);

/* Kernels that make and check test data, from a step counter in device memory,
 * so a captured CUDA graph replays with new data every step:
 *   fill(shard, tokens, shard_cols, rank, step)
 *   verify(out, tokens, vocab, shard_cols, step, bad)  counts wrong elements
 *   bump(step)                                          step += 1            */
typedef struct testkern {
  CUmodule mod;
  CUfunction fill, verify, bump;
  int elem;
} testkern;
int testkern_load(const kl_cu *cu, int elem_bytes, testkern *k);
/* src compiled by NVRTC (as the runtime's JIT) for the current context's GPU
 * and loaded: 0, or -1 with the compiler's message on stderr under `name`. */
int gpu_load_source(const kl_cu *cu, const char *src, const char *name, CUmodule *mod);
/* The same, and its n functions `names` into fn, loaded now rather than at
 * their first launch: that may wait for the context to go idle, while peers
 * sharing the GPU may already spin on this rank. 0 or -1. */
int gpu_load_functions(const kl_cu *cu, const char *src, const char *name, CUmodule *mod,
                       const char *const *names, CUfunction *fn, int n);
/* bytes (at least 8) of device memory, holding p's when p is not NULL; and
 * back: the context synchronized, d's bytes to p, d freed. */
CUdeviceptr gpu_to_device(const kl_cu *cu, const void *p, size_t bytes);
void gpu_from_device(const kl_cu *cu, void *p, CUdeviceptr d, size_t bytes);
int launch_fill(const kl_cu *cu, const testkern *k, CUdeviceptr shard, int tokens,
                long long shard_cols, unsigned rank, CUdeviceptr step, CUstream s);
int launch_verify(const kl_cu *cu, const testkern *k, CUdeviceptr out, int tokens, long long vocab,
                  long long shard_cols, CUdeviceptr step, CUdeviceptr bad, CUstream s);
int launch_bump(const kl_cu *cu, const testkern *k, CUdeviceptr step, CUstream s);

/* A CUDA graph captured from a stream, and its instance. The calls exit 1
 * on a CUDA error (CU_CHECK). */
typedef struct gpu_graph {
  CUgraph g;
  CUgraphExec ge;
} gpu_graph;
/* Stream s captured from here (this thread's calls only: rank threads
 * capturing beside it go on) into gr->g at gpu_capture_end. */
void gpu_capture_begin(const kl_cu *cu, CUstream s);
void gpu_capture_end(const kl_cu *cu, CUstream s, gpu_graph *gr);
void gpu_graph_instantiate(const kl_cu *cu, gpu_graph *gr);
/* gr's instance launched `times` times on s. */
void gpu_graph_replay(const kl_cu *cu, const gpu_graph *gr, CUstream s, int times);
void gpu_graph_destroy(const kl_cu *cu, gpu_graph *gr);
/* A rank thread's steps in a graph: its stream's work done, the ranks of t
 * meet (t NULL: a rank alone); unless `failed`, steps 0..n-1 (step(arg, i),
 * 0 or -1) are captured on s and, every one enqueued, instantiated; the
 * ranks meet again (instantiation may synchronize the device: no peer may
 * then spin waiting for this rank); the graph is replayed `times` times.
 * 0, or -1 (failed, or a step failed: nothing replayed). */
int gpu_graph_steps(const kl_cu *cu, CUstream s, rank_threads *t, int failed, int n,
                    int (*step)(void *arg, int i), void *arg, int times, gpu_graph *gr);

/* A context's staged-row marks (kl_testing_marks; exit 1 if it has none):
 * how many are set (not the sentinel), read on stream s once the stream's
 * work before is done; or all back to the sentinel, on s. */
typedef struct gpu_marks {
  CUdeviceptr p;
  size_t bytes;
  uint32_t sentinel;
  int per_token; /* the marks a token has: a step of n tokens sets n x per_token */
} gpu_marks;
gpu_marks gpu_marks_of(kl_ctx *ctx);
size_t gpu_marks_set(const kl_cu *cu, const gpu_marks *m, CUstream s);
void gpu_marks_clear(const kl_cu *cu, const gpu_marks *m, CUstream s);

/* Host reference: element (t, col) of rank's shard at `step`, as stored bits,
 * and what the gather must deliver for it (-0.0 becomes +0.0). Some elements
 * are -0.0, NaN, +-Inf, negative subnormals: values that trip naive code. */
uint32_t ref_value(int elem, uint32_t step, uint32_t rank, uint32_t t, uint32_t col);
uint32_t ref_expected(int elem, uint32_t v);
/* Compares a host copy of out [tokens, vocab] with the reference; returns the
 * number of wrong elements and prints the first few. */
long long ref_check(int elem, const void *out, int tokens, long long vocab, long long shard,
                    uint32_t step, const char *what);

#define CU_CHECK(cu, call)                                                         \
  do {                                                                             \
    CUresult r_ = (cu)->call;                                                      \
    if (r_ != CUDA_SUCCESS) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kl_cu_errstr(r_)); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

#endif
