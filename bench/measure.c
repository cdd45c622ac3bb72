/* What klbench's tables (the gather's, klbench.c; the sampling ones,
 * select.c and sample.c; the grid, grid.c) measure with: the timing of
 * captured graphs, the worst rank's figure, the progress line, a spec's
 * kl_generated and the logits they are given. The tables call these;
 * nothing here calls back into them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "klbench.h"

/* One line of progress on stderr: over itself on a terminal. */
void progress(const bench *b, int i, const char *what) {
  fprintf(stderr, "\r[%d/%d] tokens %d: %-40s", i + 1, b->ntok, b->tokens[i], what);
  if (!isatty(2)) fputc('\n', stderr);
}

kl_generated bench_generated(const kl_spec *s, const kl_layout *l, const char *source) {
  kl_generated g = {.abi = 4, .name = s->name, .vocab_size = s->vocab_size, .pad_to = s->pad_to,
                    .padded_vocab = l->padded_vocab, .tp = s->tp, .dtype = (int)s->dtype,
                    .max_tokens = s->max_tokens, .timeout_ms = s->timeout_ms,
                    .vec_bytes = l->vec_bytes, .block = l->block, .source = source,
                    .source_len = strlen(source), .out_dtype = (int)s->out_dtype,
                    .numerics = (int)s->numerics, .softcap = s->softcap, .scale = s->scale,
                    .topk = s->topk, .chunk_threads = l->chunk_threads,
                    .argmax_split = l->argmax_split, .topk_split = l->topk_split};
  return g;
}

/* For each of the n variants which[i]: `steps` calls of fn captured once.
 * The graphs are then replayed in turn, `replays` rounds, every rank
 * together, each round starting one variant later, so neither a drift in
 * clocks or memory state nor a place in the round favours a variant. t[i]:
 * median µs per step of variant i. */
void time_graphs(rank *R, step_fn fn, const int *which, int n, int T, int replays, double *t) {
  bench *b = R->b;
  cudaGraph_t g[MAX_VARIANTS];
  cudaGraphExec_t ge[MAX_VARIANTS];
  for (int i = 0; i < n; i++) {
    CUDA(cudaStreamBeginCapture(R->s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < b->steps; k++) fn(R, which[i], T);
    CUDA(cudaStreamEndCapture(R->s, &g[i]));
    CUDA(cudaGraphInstantiate(&ge[i], g[i], 0));
  }
  double v[MAX_VARIANTS][64];
  for (int rep = -2; rep < replays; rep++) { /* two warm-up rounds */
    for (int k = 0; k < n; k++) {
      int i = (k + rep + 2) % n;
      pthread_barrier_wait(&b->bar);
      CUDA(cudaEventRecord(R->e0, R->s));
      CUDA(cudaGraphLaunch(ge[i], R->s));
      CUDA(cudaEventRecord(R->e1, R->s));
      CUDA(cudaStreamSynchronize(R->s));
      float ms;
      CUDA(cudaEventElapsedTime(&ms, R->e0, R->e1));
      if (rep >= 0) v[i][rep] = 1000.0 * ms / b->steps;
    }
  }
  for (int i = 0; i < n; i++) {
    CUDA(cudaGraphExecDestroy(ge[i]));
    CUDA(cudaGraphDestroy(g[i]));
    t[i] = median(v[i], replays);
  }
}

/* The slowest rank's figure: a step of the group takes as long as its
 * slowest rank. */
double worst(const double *v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
  return m;
}

/* Uniform in [-8, 8) for bf16 and fp32 (bf16 rounded to nearest even); fp16
 * with random bits in a finite range (magnitudes 2^-5..2^3). */
unsigned char *bench_logits(size_t elems, kl_dtype dtype, uint32_t seed) {
  const size_t e = dtype == KL_FP32 ? 4 : 2;
  unsigned char *h = malloc(elems * e);
  if (!h) die("klbench", "out of memory for the logits");
  uint32_t x = seed;
  for (size_t i = 0; i < elems; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    float f = (float)(x >> 8) * (16.0f / 16777216.0f) - 8.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t v = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16); /* bf16, nearest even */
    if (dtype == KL_FP16) v = (uint16_t)((x & 0x83ffu) | ((10u + (x >> 12) % 8u) << 10));
    if (e == 4) memcpy(h + 4 * i, &u, 4);
    else memcpy(h + 2 * i, &v, 2);
  }
  return h;
}

void *bench_dev(size_t bytes) {
  void *p;
  CUDA(cudaMalloc(&p, bytes));
  return p;
}

void *bench_dev_fill(size_t n, size_t elem, const void *value) {
  unsigned char *h = malloc(n * elem);
  if (!h) die("klbench", "out of memory");
  for (size_t i = 0; i < n; i++) memcpy(h + i * elem, value, elem);
  void *p = bench_dev(n * elem);
  CUDA(cudaMemcpy(p, h, n * elem, cudaMemcpyHostToDevice));
  free(h);
  return p;
}
