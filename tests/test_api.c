/* libklrt API misuse and behaviour without a GPU: clear error codes and
 * messages, no crash. Runs everywhere; the no-driver checks only where there
 * is no driver (CI), the rest need none. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "klrt/klrt.h"
#include "rt.h"

static const char *kimi = "return { name = 'kimi_k3_tp8', vocab_size = 163840, tp = 8, "
                          "dtype = 'bf16', max_tokens = 64 }";

#define EXPECT_ERR(call, code, part)                                                   \
  do {                                                                                 \
    kl_result r_ = (call);                                                             \
    CHECK(r_ == (code), "%s: got %s, want %s (%s)", #call, kl_result_name(r_),         \
          kl_result_name(code), kl_last_error());                                      \
    CHECK(strstr(kl_last_error(), (part)) != NULL, "%s: message '%s' lacks '%s'", #call, \
          kl_last_error(), (part));                                                    \
  } while (0)

static void misuse(void) {
  kl_ctx *c = (kl_ctx *)0x1;
  kl_group *g;
  kl_config cfg = {.rank = 0, .nranks = 8, .device = 0};
  EXPECT_ERR(kl_group_create(NULL, 2), KLRT_EINVAL, "group is NULL");
  EXPECT_ERR(kl_group_create(&g, 0), KLRT_EINVAL, "out of range");
  EXPECT_ERR(kl_ctx_create_string(NULL, kimi, NULL, &cfg), KLRT_EINVAL, "ctx is NULL");
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, NULL), KLRT_EINVAL, "cfg is NULL");
  CHECK(c == NULL, "*ctx not cleared on failure");
  EXPECT_ERR(kl_ctx_create_string(&c, NULL, NULL, &cfg), KLRT_EINVAL, "spec_source is NULL");
  EXPECT_ERR(kl_ctx_create_file(&c, NULL, NULL, &cfg), KLRT_EINVAL, "spec_path is NULL");
  EXPECT_ERR(kl_ctx_create_file(&c, "/nonexistent.lua", NULL, &cfg), KLRT_ESPEC, "cannot open");
  EXPECT_ERR(kl_ctx_create_string(&c, "return {", NULL, &cfg), KLRT_ESPEC, "<spec string>:1:");
  EXPECT_ERR(kl_ctx_create_string(&c, "return { name = 'x', vocab_size = 8, tp = 2, dtype = 'bf16', "
                                      "max_tokens = 1 }", NULL, &cfg),
             KLRT_ESPEC, "spec 'x' is for tp 2, but the group has 8 ranks");
  EXPECT_ERR(kl_ctx_create_string(&c, "return { { name = 'a', vocab_size = 8, tp = 8, dtype = "
                                      "'bf16', max_tokens = 1 }, { name = 'b', vocab_size = 8, "
                                      "tp = 8, dtype = 'bf16', max_tokens = 1 } }", NULL, &cfg),
             KLRT_EINVAL, "defines 2 specs; pass the name");
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, "nope", &cfg), KLRT_EINVAL, "no spec named 'nope'");
  cfg.rank = 8;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "rank 8 is outside 0..7");
  cfg.rank = -1;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "outside");
  cfg.rank = 0;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "need a way to meet");
  cfg.device = -2;
  cfg.group = (kl_group *)&cfg;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "not an ordinal");
  /* Calls on contexts that do not exist (never made, or destroyed). */
  kl_ctx *bogus = (kl_ctx *)&cfg;
  kl_stats st;
  EXPECT_ERR(kl_gather(NULL, (void *)1, (void *)1, 1, NULL), KLRT_EINVAL, "ctx is NULL");
  EXPECT_ERR(kl_gather(bogus, (void *)1, (void *)1, 1, NULL), KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_ctx_stats(NULL, &st), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_stats(bogus, &st), KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_ctx_status(NULL), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_status(bogus), KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_ctx_destroy(NULL), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_destroy(bogus), KLRT_ESTATE, "already destroyed");
  CHECK(!strcmp(kl_result_name(KLRT_EDEVICE), "KLRT_EDEVICE"), "result names");
  CHECK(!strcmp(kl_decline_name(KL_DECLINE_TOKENS), "tokens"), "decline names");
}

static void generated(void) {
  kl_ctx *c;
  kl_config cfg = {.rank = 0, .nranks = 8, .device = 0, .group = (kl_group *)&cfg};
  const char *src = "extern \"C\" __global__ void k() {}";
  kl_generated g = {1, "kimi_k3_tp8", 163840, 64, 163840, 8, 0, 64, 1000, 16, 128, src, 0};
  g.source_len = strlen(src);
  EXPECT_ERR(kl_ctx_create_generated(&c, NULL, &cfg), KLRT_EINVAL, "NULL");
  g.abi = 2;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "ABI 2");
  g.abi = 1, g.dtype = 7;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "malformed");
  g.dtype = 0, g.source_len = 3;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "malformed");
  g.source_len = strlen(src), g.vec_bytes = 8;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "incompatible klgen");
  g.vec_bytes = 16, g.tp = 3;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "not divisible by tp 3");
  g.tp = 8, g.name = "bad-name";
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "not a C identifier");
}

/* Without a driver: every entry point returns KLRT_ENODRIVER, nothing crashes. */
static void no_driver(void) {
  if (kl_device_count() >= 0) {
    printf("a CUDA driver is present: no-driver checks not applicable here\n");
    return;
  }
  CHECK(strstr(kl_last_error(), "libcuda") || strstr(kl_last_error(), "GPU"), "%s",
        kl_last_error());
  kl_group *g;
  CHECK(kl_group_create(&g, 8) == KLRT_OK, "a group needs no GPU");
  kl_ctx *c = (kl_ctx *)0x1;
  kl_config cfg = {.rank = 0, .nranks = 8, .device = 0, .group = g};
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_ENODRIVER, "libcuda");
  CHECK(c == NULL, "*ctx set without a driver");
  EXPECT_ERR(kl_ctx_create_file(&c, SPEC_DIR "/kimi_k3_tp8.lua", NULL, &cfg), KLRT_ENODRIVER,
             "no CUDA driver");
  kl_group_destroy(g);
}

/* The dispatch rule, on a context assembled by hand: no device needed. */
static void dispatch(void) {
  kl_ctx c;
  memset(&c, 0, sizeof c);
  c.spec.max_tokens = 64;
  c.layout.shard_bytes = 40960;
  c.ready = 1, c.nccl_everywhere = 1, c.crossover = 40960 * 16;
  kl_decline why;
  CHECK(kl_choose_path(&c, 1, &why) == PATH_ONESHOT, "1 token: one-shot");
  CHECK(kl_choose_path(&c, 16, &why) == PATH_ONESHOT, "at the crossover: one-shot");
  CHECK(kl_choose_path(&c, 17, &why) == PATH_NCCL && why == KL_DECLINE_SIZE, "over: size");
  c.nccl_everywhere = 0;
  CHECK(kl_choose_path(&c, 17, &why) == PATH_ONESHOT, "no NCCL anywhere: no size decline");
  CHECK(kl_choose_path(&c, 65, &why) == PATH_NCCL && why == KL_DECLINE_TOKENS, "tokens");
  c.ready = 0;
  CHECK(kl_choose_path(&c, 1, &why) == PATH_NCCL && why == KL_DECLINE_NOT_READY, "not ready");
  c.disabled = 1;
  CHECK(kl_choose_path(&c, 1, &why) == PATH_NCCL && why == KL_DECLINE_DISABLED,
        "disabled wins");
}

/* Where the crossover comes from: config, environment, tuned table, default. */
static void crossover(void) {
  const char *from = NULL;
  unsetenv("KLGEN_CROSSOVER_BYTES");
  unsetenv("KLGEN_TUNE_FILE");
  CHECK(kl_crossover("sm_90", 2, 40960, 12345, NULL, &from) == 12345 && !strcmp(from, "kl_config"),
        "config first");
  setenv("KLGEN_CROSSOVER_BYTES", "777", 1);
  CHECK(kl_crossover("sm_90", 2, 40960, 0, NULL, &from) == 777, "then the environment");
  unsetenv("KLGEN_CROSSOVER_BYTES");
  char path[] = "/tmp/klgen-tune.XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fputs("# arch nranks shard_bytes crossover_bytes\nsm_90 2 40960 1000\nsm_90 2 163840 2000\n"
        "sm_90 8 40960 3000\nsm_100 2 40960 4000\ngarbage line\n", f);
  fclose(f);
  setenv("KLGEN_TUNE_FILE", path, 1);
  CHECK(kl_crossover("sm_90", 2, 50000, 0, NULL, &from) == 1000 && !strcmp(from, "tuned table"),
        "nearest shard in the table");
  CHECK(kl_crossover("sm_90", 2, 150000, 0, NULL, &from) == 2000, "nearest (larger)");
  CHECK(kl_crossover("sm_90", 8, 40960, 0, NULL, &from) == 3000, "by group size");
  CHECK(kl_crossover("sm_100", 2, 40960, 0, NULL, &from) == 4000, "by arch");
  CHECK(kl_crossover("sm_90", 4, 40960, 0, NULL, &from) > 0 && strstr(from, "default"),
        "no row: default");
  CHECK(kl_crossover("sm_75", 4, 40960, 0, NULL, &from) > 0 && !strcmp(from, "fallback default"),
        "unknown arch");
  unsetenv("KLGEN_TUNE_FILE");
  unlink(path);
}

/* A spec's sizes, without a GPU. */
static void info(void) {
  kl_info i;
  CHECK(kl_spec_info_file(SPEC_DIR "/gpt2_tp4.lua", NULL, &i) == KLRT_OK && i.vocab_size == 50257 &&
            i.padded_vocab == 50304 && i.shard == 12576 && i.tp == 4 && i.dtype == 1 &&
            i.elem_bytes == 2 && i.vec_bytes == 2 && !strcmp(i.name, "gpt2_tp4"),
        "gpt2 info: %s", kl_last_error());
  CHECK(kl_spec_info_file(SPEC_DIR "/deepseek_v3.lua", "deepseek_v3_tp4", &i) == KLRT_OK &&
            i.tp == 4 && i.shard == 32320, "named spec of a list");
  EXPECT_ERR(kl_spec_info_file(SPEC_DIR "/deepseek_v3.lua", NULL, &i), KLRT_EINVAL, "defines 3");
  EXPECT_ERR(kl_spec_info_file(NULL, NULL, &i), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_info(NULL, &i), KLRT_EINVAL, "NULL");
}

int main(void) {
  crossover();
  info();
  misuse();
  generated();
  no_driver();
  dispatch();
  return check_done();
}
