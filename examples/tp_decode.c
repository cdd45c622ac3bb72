/* A tensor-parallel decode loop, the way an inference engine would run it:
 * one process per GPU, NCCL bootstrapped by the parent (no MPI), an LM head
 * (cuBLAS GEMM) producing each rank's vocab shard, and libklrt gathering the
 * shards into [tokens, vocab_size] logits on every rank, eagerly and then
 * inside a captured CUDA graph. Every checked step is compared bit for bit
 * with the concatenation of all ranks' shards, computed locally.
 *
 *   tp_decode SPEC_FILE [NAME] [--steps N] [--tokens T]
 *
 * The spec's tp must equal the number of ranks; each rank takes one GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <klrt/klrt.h>
#include <nccl.h>

#define HIDDEN 512
#define CHECK_EVERY 16

typedef struct opts {
  const char *spec, *name;
  int steps, tokens;
} opts;

typedef struct rank {
  int r, n;
  opts o;
  kl_ctx *ctx;
  cudaStream_t s;
  cublasHandle_t blas;
  cudaDataType dt;
  int elem, tokens;
  long long vocab, shard, padded, max_tokens;
  void *w_all, *hidden, *hidden_steps, *logits, *out, *ref;
  long long mismatches, checked;
} rank;

#define TRY(call)                                                                        \
  do {                                                                                   \
    int rc_ = (int)(call);                                                               \
    if (rc_ != 0) {                                                                      \
      fprintf(stderr, "rank %d: %s failed (%d) at %s:%d\n", R->r, #call, rc_, __FILE__, __LINE__); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define TRY_KL(call)                                                                     \
  do {                                                                                   \
    kl_result k_ = (call);                                                               \
    if (k_ != KLRT_OK) {                                                                 \
      fprintf(stderr, "rank %d: %s: %s: %s\n", R->r, #call, kl_result_name(k_), kl_last_error()); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
/* A small value in [-0.5, 0.5) as the spec's element type. */
static void put(const rank *R, void *base, size_t i, uint32_t seed) {
  float f = (float)(mix(seed) & 0xffff) / 65536.0f - 0.5f;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (R->elem == 4) ((float *)base)[i] = f;
  else if (R->dt == CUDA_R_16BF) ((uint16_t *)base)[i] = (uint16_t)(bits >> 16);
  else { /* fp16: f is small and normal enough for this truncating conversion */
    uint32_t sign = (bits >> 16) & 0x8000u, e = (bits >> 23) & 0xff, m = (bits >> 13) & 0x3ff;
    ((uint16_t *)base)[i] = (uint16_t)(e < 113 ? sign : sign | ((e - 112) << 10) | m);
  }
}

/* The full LM-head weight (every rank's shard: [tp][shard][HIDDEN]) so each rank
 * can compute the reference; its own shard is block r. */
static void init_weights(rank *R) {
  size_t n = (size_t)R->padded * HIDDEN;
  void *h = malloc(n * (size_t)R->elem);
  for (size_t i = 0; i < n; i++) put(R, h, i, (uint32_t)i * 2654435761u);
  TRY(cudaMalloc(&R->w_all, n * (size_t)R->elem));
  TRY(cudaMemcpy(R->w_all, h, n * (size_t)R->elem, cudaMemcpyHostToDevice));
  free(h);
  /* Hidden states for every step, as the previous layer would leave them. */
  size_t hn = (size_t)R->o.steps * (size_t)R->max_tokens * HIDDEN;
  h = malloc(hn * (size_t)R->elem);
  for (size_t i = 0; i < hn; i++) put(R, h, i, (uint32_t)i * 40503u + 17u);
  TRY(cudaMalloc(&R->hidden_steps, hn * (size_t)R->elem));
  TRY(cudaMemcpy(R->hidden_steps, h, hn * (size_t)R->elem, cudaMemcpyHostToDevice));
  free(h);
}

/* logits[tokens, shard] = hidden[tokens, HIDDEN] x W_k[shard, HIDDEN]^T */
static void lm_head(rank *R, int k, void *dst, int tokens) {
  const float one = 1.0f, zero = 0.0f;
  const char *w = (const char *)R->w_all + (size_t)k * (size_t)R->shard * HIDDEN * (size_t)R->elem;
  TRY(cublasGemmEx(R->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)R->shard, tokens, HIDDEN, &one, w, R->dt,
                   HIDDEN, R->hidden, R->dt, HIDDEN, &zero, dst, R->dt, (int)R->shard,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void decode_step(rank *R, int tokens) {
  lm_head(R, R->r, R->logits, tokens);
  TRY_KL(kl_gather(R->ctx, R->logits, R->out, tokens, R->s));
}

static void load_hidden(rank *R, int step, int tokens) {
  size_t bytes = (size_t)tokens * HIDDEN * (size_t)R->elem;
  const char *src = (const char *)R->hidden_steps +
                    (size_t)(step % R->o.steps) * (size_t)R->max_tokens * HIDDEN * (size_t)R->elem;
  TRY(cudaMemcpyAsync(R->hidden, src, bytes, cudaMemcpyDeviceToDevice, R->s));
}

/* Every rank's shard computed here, concatenated and sliced on the host. */
static void check(rank *R, int tokens) {
  for (int k = 0; k < R->n; k++)
    lm_head(R, k, (char *)R->ref + (size_t)k * (size_t)tokens * (size_t)R->shard * (size_t)R->elem,
            tokens);
  size_t out_bytes = (size_t)tokens * (size_t)R->vocab * (size_t)R->elem;
  size_t ref_bytes = (size_t)R->n * (size_t)tokens * (size_t)R->shard * (size_t)R->elem;
  char *got = malloc(out_bytes), *ref = malloc(ref_bytes);
  TRY(cudaMemcpyAsync(got, R->out, out_bytes, cudaMemcpyDeviceToHost, R->s));
  TRY(cudaMemcpyAsync(ref, R->ref, ref_bytes, cudaMemcpyDeviceToHost, R->s));
  TRY(cudaStreamSynchronize(R->s));
  uint32_t negzero = R->elem == 2 ? 0x8000u : 0x80000000u;
  for (int t = 0; t < tokens; t++)
    for (long long j = 0; j < R->vocab; j++) {
      uint32_t a = 0, b = 0;
      memcpy(&a, got + ((size_t)t * (size_t)R->vocab + (size_t)j) * (size_t)R->elem, (size_t)R->elem);
      memcpy(&b, ref + (((size_t)(j / R->shard) * (size_t)tokens + (size_t)t) * (size_t)R->shard +
                        (size_t)(j % R->shard)) * (size_t)R->elem, (size_t)R->elem);
      if (a != b && !(b == negzero && a == 0)) R->mismatches++;
    }
  R->checked++;
  free(got), free(ref);
}

static void setup(rank *R, ncclUniqueId id) {
  ncclComm_t comm;
  TRY(cudaSetDevice(R->r));
  TRY(ncclCommInitRank(&comm, R->n, id, R->r));
  kl_config cfg = {.size = sizeof(kl_config), .rank = R->r, .nranks = R->n, .device = R->r, .nccl = comm};
  TRY_KL(kl_ctx_create_file(&R->ctx, R->o.spec, R->o.name, &cfg));
  TRY(cudaStreamCreateWithFlags(&R->s, cudaStreamNonBlocking));
  TRY(cublasCreate(&R->blas));
  TRY(cublasSetStream(R->blas, R->s));
  size_t mt = (size_t)R->max_tokens + 1, e = (size_t)R->elem;
  TRY(cudaMalloc(&R->hidden, mt * HIDDEN * e));
  TRY(cudaMalloc(&R->logits, mt * (size_t)R->shard * e));
  TRY(cudaMalloc(&R->out, mt * (size_t)R->vocab * e));
  TRY(cudaMalloc(&R->ref, mt * (size_t)R->padded * e));
  init_weights(R);
}

static int run_rank(rank *R, ncclUniqueId id) {
  setup(R, id);
  int T = R->tokens, step = 0;
  /* Eager steps. */
  for (; step < R->o.steps / 2; step++) {
    load_hidden(R, step, T);
    decode_step(R, T);
    if (step % CHECK_EVERY == 0) check(R, T);
  }
  /* The step captured once in a CUDA graph, replayed with new hidden states. */
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TRY(cudaStreamBeginCapture(R->s, cudaStreamCaptureModeThreadLocal));
  decode_step(R, T);
  TRY(cudaStreamEndCapture(R->s, &g));
  TRY(cudaGraphInstantiate(&ge, g, 0));
  for (; step < R->o.steps; step++) {
    load_hidden(R, step, T);
    TRY(cudaGraphLaunch(ge, R->s));
    if (step % CHECK_EVERY == 0 || step == R->o.steps - 1) check(R, T);
  }
  /* A step larger than the one-shot buffers: NCCL serves it, same result. */
  load_hidden(R, 0, (int)R->max_tokens + 1);
  decode_step(R, (int)R->max_tokens + 1);
  check(R, (int)R->max_tokens + 1);
  TRY(cudaStreamSynchronize(R->s));
  TRY_KL(kl_ctx_status(R->ctx));
  kl_stats st = KL_STATS_INIT;
  TRY_KL(kl_ctx_stats(R->ctx, &st));
  printf("rank %d (GPU %d, %s): %d steps of %d tokens (%d eager, %d graph replays) + 1 of %lld; "
         "kl_gather calls: one-shot %llu, NCCL %llu (declined: tokens %llu, size %llu, "
         "not-ready %llu, disabled %llu)%s; %lld checks, %lld mismatches\n",
         R->r, R->r, st.arch, R->o.steps, T, R->o.steps / 2, R->o.steps - R->o.steps / 2,
         (long long)R->max_tokens + 1, (unsigned long long)st.oneshot,
         (unsigned long long)st.nccl, (unsigned long long)st.declined[KL_DECLINE_TOKENS],
         (unsigned long long)st.declined[KL_DECLINE_SIZE],
         (unsigned long long)st.declined[KL_DECLINE_NOT_READY],
         (unsigned long long)st.declined[KL_DECLINE_DISABLED],
         st.oneshot_ready ? "" : " [one-shot not ready]", R->checked, R->mismatches);
  TRY_KL(kl_ctx_destroy(R->ctx));
  return R->mismatches ? 1 : 0;
}

static const char usage[] =
    "usage: tp_decode SPEC_FILE [NAME] [--steps N] [--tokens T]\n"
    "Runs a TP decode loop, one process per GPU (the spec's tp of them): a cuBLAS LM head\n"
    "makes each rank's shard, kl_gather assembles the logits, eagerly and in a CUDA graph,\n"
    "and the checked steps are compared bit for bit with all shards computed locally.\n"
    "  NAME        which spec of a file that defines several\n"
    "  --steps N   decode steps, at least 2 (default 64)\n"
    "  --tokens T  tokens per step (default 1)\n";

/* 1: --help asked for; -1: a usage error. */
static int parse(int argc, char **argv, opts *o) {
  *o = (opts){NULL, NULL, 64, 1};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) o->steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) o->tokens = atoi(argv[++i]);
    else if (argv[i][0] == '-') return -1;
    else if (!o->spec) o->spec = argv[i];
    else if (!o->name) o->name = argv[i];
    else return -1;
  }
  return o->spec && o->steps > 1 && o->tokens > 0 ? 0 : -1;
}

/* GPUs present, asked in a child: this process must stay free of CUDA so the
 * ranks it forks can use it. */
static int gpu_count(void) {
  int fd[2], n = 0;
  if (pipe(fd)) return 0;
  if (fork() == 0) {
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(write(fd[1], &n, sizeof n) == sizeof n ? 0 : 1);
  }
  if (read(fd[0], &n, sizeof n) != sizeof n) n = 0;
  wait(NULL);
  return n;
}

int main(int argc, char **argv) {
  opts o;
  int p = parse(argc, argv, &o);
  if (p > 0) return fputs(usage, stdout), 0;
  if (p < 0) return fputs("usage: tp_decode SPEC_FILE [NAME] [--steps N] [--tokens T] (see --help)\n",
                          stderr), 2;
  kl_info info = KL_INFO_INIT; /* reading a spec needs no GPU */
  if (kl_spec_info_file(o.spec, o.name, &info) != KLRT_OK) {
    fprintf(stderr, "tp_decode: %s\n", kl_last_error());
    return 1;
  }
  int gpus = gpu_count();
  if (info.tp > gpus) {
    printf("SKIP: %s is for tp %d; this machine has %d GPU(s)\n", info.name, info.tp, gpus);
    return 77;
  }
  if (o.tokens > info.max_tokens) o.tokens = (int)info.max_tokens;
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  pid_t *pids = calloc((size_t)info.tp, sizeof *pids);
  for (int r = 0; r < info.tp; r++) {
    fflush(stdout);
    if ((pids[r] = fork()) == 0) {
      rank R = {.r = r, .n = info.tp, .o = o, .tokens = o.tokens, .elem = info.elem_bytes,
                .vocab = info.vocab_size, .shard = info.shard, .padded = info.padded_vocab,
                .max_tokens = info.max_tokens};
      R.dt = info.dtype == 0 ? CUDA_R_16BF : info.dtype == 1 ? CUDA_R_16F : CUDA_R_32F;
      int rc = run_rank(&R, id);
      fflush(stdout);
      _exit(rc);
    }
  }
  int fails = 0;
  for (int r = 0; r < info.tp; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    fails += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  printf("%s\n", fails ? "FAILED" : "all ranks: gathered logits match the reference");
  free(pids);
  return fails ? 1 : 0;
}
