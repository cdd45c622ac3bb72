/* GPU test (one GPU): a forged peer, through the all-gather callback. Rank 0
 * is real; the callback plays rank 1 and sends what a broken or foreign peer
 * might: an unterminated reason string, a wrong magic or fingerprint, a
 * duplicate rank, malformed flags, a negative crossover. Each must end
 * creation with a clear error (no NCCL here, so an unready path is an error
 * too), never a crash or a read past a buffer; a faithful copy must succeed,
 * which shows the harness itself forges nothing by accident. Exit 77 without
 * a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_util.h"
#include "klrt/klrt.h"
#include "rt.h"

static const char *spec = "return { name = 'forged', vocab_size = 4096, tp = 2, dtype = 'bf16', "
                          "max_tokens = 4 }";

typedef enum {
  FAITHFUL, WHY_UNTERMINATED, BAD_MAGIC, OTHER_FINGERPRINT, DUP_RANK, BAD_USABLE,
  NEG_CROSSOVER, AGREE_WHY_UNTERMINATED, BAD_FLAG, BAD_KERNELS_FLAG, N_CASES
} forgery;
static const char *const names[] = {"faithful copy", "unterminated reason", "wrong magic",
                                    "other fingerprint", "duplicate rank", "usable = 7",
                                    "negative crossover", "unterminated agreement reason",
                                    "disabled = 2", "has_kernels = 3"};

/* Slot 0 is rank 0's record; slot 1 a copy of it, as rank 1, then forged. */
static int forge(const void *send, void *recv, size_t bytes, void *user) {
  forgery f = *(forgery *)user;
  memcpy(recv, send, bytes);
  memcpy((char *)recv + bytes, send, bytes);
  if (bytes == sizeof(peer_info)) {
    peer_info *p = (peer_info *)((char *)recv + bytes);
    p->rank = 1;
    if (f == WHY_UNTERMINATED) p->usable = 0, memset(p->why, 'A', sizeof p->why);
    if (f == BAD_MAGIC) p->magic ^= 1;
    if (f == OTHER_FINGERPRINT) p->fingerprint ^= 1;
    if (f == DUP_RANK) p->rank = 0;
    if (f == BAD_USABLE) p->usable = 7;
  } else if (bytes == sizeof(agree_info)) {
    agree_info *a = (agree_info *)((char *)recv + bytes);
    if (f == NEG_CROSSOVER) a->crossover = -5;
    if (f == AGREE_WHY_UNTERMINATED) a->mapped = 0, memset(a->why, 'B', sizeof a->why);
    if (f == BAD_FLAG) a->disabled = 2;
    if (f == BAD_KERNELS_FLAG) a->has_kernels = 3;
  }
  return 0;
}

int main(void) {
  gpu_require(1);
  static const kl_result want[] = {KLRT_OK, KLRT_EUNAVAILABLE, KLRT_ESPEC, KLRT_ESPEC,
                                   KLRT_EINVAL, KLRT_ESPEC, KLRT_EINVAL, KLRT_EUNAVAILABLE,
                                   KLRT_ESPEC, KLRT_ESPEC};
  static const char *const part[] = {"", "AAAA", "not a compatible libklrt", "different spec",
                                     "slot 1 holds rank 0", "malformed exchange record",
                                     "crossover of -5 bytes", "BBBB",
                                     "malformed agreement record", "malformed agreement record"};
  for (int f = 0; f < N_CASES; f++) {
    forgery which = (forgery)f;
    kl_config cfg = rank_config(0, 2, 0, NULL);
    cfg.allgather = forge, cfg.allgather_user = &which;
    kl_ctx *ctx = NULL;
    kl_result r = kl_ctx_create_string(&ctx, spec, NULL, &cfg);
    const char *m = kl_last_error();
    CHECK(r == want[f], "%s: got %s, want %s (%s)", names[f], kl_result_name(r),
          kl_result_name(want[f]), m);
    if (r != KLRT_OK) {
      CHECK(strstr(m, part[f]) != NULL, "%s: message '%s' lacks '%s'", names[f], m, part[f]);
      /* a reason is cut at its buffer: never the 160 forged bytes and beyond */
      CHECK(strlen(m) < 400, "%s: message of %zu chars", names[f], strlen(m));
    } else {
      kl_stats st = KL_STATS_INIT;
      kl_ctx_stats(ctx, &st);
      CHECK(st.oneshot_ready, "%s: not ready: %s", names[f], st.not_ready);
      /* another thread inside a call on this context: an error, not a wait */
      atomic_store(&ctx->busy, 1);
      kl_result b = kl_gather(ctx, (void *)1, (void *)1, 1, NULL);
      CHECK(b == KLRT_EBUSY && strstr(kl_last_error(), "another thread"), "busy: %s (%s)",
            kl_result_name(b), kl_last_error());
      CHECK(kl_ctx_destroy(ctx) == KLRT_EBUSY, "destroy while busy");
      atomic_store(&ctx->busy, 0);
      CHECK(kl_ctx_destroy(ctx) == KLRT_OK, "%s: destroy: %s", names[f], kl_last_error());
    }
    printf("%-30s -> %s\n", names[f], r == KLRT_OK ? "created" : m);
  }
  return check_done();
}
