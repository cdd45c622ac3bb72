/* GPU test (one GPU): calls on one context alternate between two streams
 * that nothing else orders. Two ranks as threads; each double-buffers its
 * shard, output and step number, so that step k+1's own work (on stream B)
 * never waits for step k's (on stream A): only the library's promise -- a
 * call on a new stream is ordered after the previous call -- keeps step k+1's
 * gather from running into step k's on the same buffers and step slots.
 * Every step is checked on the device; the last ones against the host
 * reference. KLGEN_FAULT_NO_STREAM_ORDER=1 (the tests' library only) turns the
 * ordering off, to see this test fail. Exit 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "klrt/klrt.h"

#define STEPS 2000
#define TOKENS 5

static const char *spec = "return { name = 'streams', vocab_size = 32000, tp = 2, dtype = 'bf16', "
                          "max_tokens = 8, timeout_ms = 2000 }";

typedef struct rank {
  int r;
  const kl_cu *cu;
  CUcontext cuctx;
  kl_group *group;
  long long bad, host_bad;
  char msg[512];
} rank;

#define TRY(call, what)                                                          \
  do {                                                                           \
    if (call) {                                                                  \
      snprintf(R->msg, sizeof R->msg, "rank %d: %s: %s", R->r, what, kl_last_error()); \
      goto out;                                                                  \
    }                                                                            \
  } while (0)

static void *run(void *arg) {
  rank *R = arg;
  const kl_cu *cu = R->cu;
  cu->cuCtxSetCurrent(R->cuctx);
  kl_config cfg = rank_config(R->r, 2, 0, R->group);
  kl_ctx *ctx = NULL;
  kl_info info = KL_INFO_INIT;
  testkern k;
  CUstream s[2] = {0, 0};
  CUdeviceptr shard[2], out[2], step[2], bad;
  CU_CHECK(cu, cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING));
  CU_CHECK(cu, cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING));
  kl_spec_info_string(spec, NULL, &info);
  size_t in_b = TOKENS * (size_t)info.shard * 2, out_b = TOKENS * (size_t)info.vocab_size * 2;
  for (int i = 0; i < 2; i++) {
    CU_CHECK(cu, cuMemAlloc(&shard[i], in_b));
    CU_CHECK(cu, cuMemAlloc(&out[i], out_b));
    CU_CHECK(cu, cuMemAlloc(&step[i], 16));
  }
  CU_CHECK(cu, cuMemAlloc(&bad, 8));
  CU_CHECK(cu, cuMemsetD32(bad, 0, 2));
  if (testkern_load(cu, 2, &k)) {
    snprintf(R->msg, sizeof R->msg, "rank %d: test kernels did not build", R->r);
    goto out;
  }
  CU_CHECK(cu, cuCtxSynchronize());
  TRY(kl_ctx_create_string(&ctx, spec, NULL, &cfg), "create");
  for (int st = 0; st < STEPS; st++) {
    int b = st & 1; /* buffers and stream of this step */
    CUstream g = s[b];
    TRY(cu->cuMemsetD32Async(step[b], (unsigned)st, 1, g), "memset");
    TRY(launch_fill(cu, &k, shard[b], TOKENS, info.shard, (unsigned)R->r, step[b], g), "fill");
    TRY(kl_gather(ctx, (void *)shard[b], (void *)out[b], TOKENS, g), "kl_gather");
    TRY(launch_verify(cu, &k, out[b], TOKENS, info.vocab_size, info.shard, step[b], bad, g),
        "verify");
  }
  CU_CHECK(cu, cuCtxSynchronize());
  CU_CHECK(cu, cuMemcpyDtoH(&R->bad, bad, 8));
  if (kl_ctx_status(ctx) != KLRT_OK) snprintf(R->msg, sizeof R->msg, "%s", kl_last_error());
  void *h = malloc(out_b);
  for (int b = 0; b < 2; b++) {
    CU_CHECK(cu, cuMemcpyDtoH(h, out[b], out_b));
    R->host_bad += ref_check(2, h, TOKENS, info.vocab_size, info.shard,
                             (uint32_t)(STEPS - 2 + b), "streams");
  }
  free(h);
out:
  if (kl_ctx_destroy(ctx) != KLRT_OK && !R->msg[0])
    snprintf(R->msg, sizeof R->msg, "destroy: %s", kl_last_error());
  return NULL;
}

int main(void) {
  const kl_cu *cu = gpu_require(1);
  CUcontext cuctx = gpu_primary(cu, 0, 0);
  kl_group *g;
  if (kl_group_create(&g, 2) != KLRT_OK) return fprintf(stderr, "%s\n", kl_last_error()), 1;
  rank R[2];
  memset(R, 0, sizeof R);
  for (int r = 0; r < 2; r++) R[r].r = r, R[r].cu = cu, R[r].cuctx = cuctx, R[r].group = g;
  ranks_run(2, run, R, sizeof *R);
  int fails = 0;
  for (int r = 0; r < 2; r++) {
    if (R[r].msg[0] || R[r].bad || R[r].host_bad) {
      fails++;
      fprintf(stderr, "FAIL rank %d: %lld device-checked and %lld host-checked mismatches %s\n",
              r, R[r].bad, R[r].host_bad, R[r].msg);
    }
  }
  kl_group_destroy(g);
  printf("%s: %d steps alternating two streams per rank, %d rank(s) failed\n",
         fails ? "FAIL" : "ok", STEPS, fails);
  printf("%d passed, %d failed\n", 2 - fails, fails);
  return fails ? 1 : 0;
}
