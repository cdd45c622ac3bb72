/* libklrt API misuse and behaviour without a GPU: clear error codes and
 * messages, no crash. Runs everywhere; the no-driver checks only where there
 * is no driver (CI), the rest need none. */
#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>

#include "check.h"
#include "dynlib.h"
#include "klrt/klrt.h"
#include "rt.h"

#include <nccl.h>
/* klrt.h declares the communicator without nccl.h: it must be ncclComm_t itself. */
_Static_assert(_Generic(((kl_config *)0)->nccl, ncclComm_t: 1, default: 0),
               "kl_config.nccl is not ncclComm_t");

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
  kl_config cfg = {.size = sizeof(kl_config), .rank = 0, .nranks = 8, .device = 0};
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
  kl_group *g8;
  CHECK(kl_group_create(&g8, 8) == KLRT_OK, "group");
  cfg.device = -2;
  cfg.group = g8;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "not an ordinal");
  /* a group made for fewer ranks would be written past its end */
  kl_group *g2;
  CHECK(kl_group_create(&g2, 2) == KLRT_OK, "group");
  cfg.device = 0;
  cfg.group = g2;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL,
             "cfg.group was made for 2 ranks, but cfg.nranks is 8");
  kl_group_destroy(g2);
  kl_group_destroy(g8);
  /* Calls on contexts that do not exist (never made, or destroyed). */
  kl_ctx *bogus = (kl_ctx *)&cfg;
  kl_stats st = KL_STATS_INIT;
  EXPECT_ERR(kl_gather(NULL, (void *)1, (void *)1, 1, NULL), KLRT_EINVAL, "ctx is NULL");
  EXPECT_ERR(kl_argmax(NULL, (void *)1, (int64_t *)8, NULL, 1, NULL), KLRT_EINVAL,
             "kl_argmax: ctx is NULL");
  EXPECT_ERR(kl_topk(NULL, (void *)1, (int64_t *)8, NULL, NULL, 1, NULL), KLRT_EINVAL,
             "kl_topk: ctx is NULL");
  kl_sampling sp = KL_SAMPLING_INIT;
  EXPECT_ERR(kl_sample(NULL, (void *)1, &sp, (int64_t *)8, NULL, NULL, NULL, 0, 1, NULL),
             KLRT_EINVAL, "kl_sample: ctx is NULL");
  EXPECT_ERR(kl_sample(bogus, (void *)1, &sp, (int64_t *)8, NULL, NULL, NULL, 0, 1, NULL),
             KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_gather(bogus, (void *)1, (void *)1, 1, NULL), KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_ctx_stats(NULL, &st), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_stats(bogus, &st), KLRT_ESTATE, "destroyed");
  EXPECT_ERR(kl_ctx_status(NULL), KLRT_EINVAL, "NULL");
  EXPECT_ERR(kl_ctx_status(bogus), KLRT_ESTATE, "destroyed");
  CHECK(kl_ctx_destroy(NULL) == KLRT_OK, "destroy(NULL) is a no-op");
  kl_group_destroy(NULL);
  EXPECT_ERR(kl_ctx_destroy(bogus), KLRT_ESTATE, "already destroyed");
  CHECK(!strcmp(kl_result_name(KLRT_EDEVICE), "KLRT_EDEVICE"), "result names");
  CHECK(!strcmp(kl_decline_name(KL_DECLINE_TOKENS), "tokens"), "decline names");
}

static void generated(void) {
  kl_ctx *c;
  kl_group *grp;
  kl_group_create(&grp, 8);
  kl_config cfg = {.size = sizeof(kl_config), .rank = 0, .nranks = 8, .device = 0, .group = grp};
  const char *src = "extern \"C\" __global__ void k() {}";
  kl_generated g = {1, "kimi_k3_tp8", 163840, 64, 163840, 8, 0, 64, 1000, 16, 128, src, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  g.source_len = strlen(src);
  EXPECT_ERR(kl_ctx_create_generated(&c, NULL, &cfg), KLRT_EINVAL, "NULL");
  g.abi = 6;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "ABI 6 is not 1 to 5");
  g.abi = 1, g.dtype = 7;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "malformed");
  g.dtype = 0, g.source_len = 3;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "malformed");
  g.source_len = strlen(src), g.vec_bytes = 8;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "incompatible klgen");
  /* an older header: its kernels have one split for both select kernels */
  g.vec_bytes = 16;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "argmax split 10/5");
  g.abi = 4, g.chunk_threads = 4, g.argmax_split = 5, g.topk_split = 10;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "threads a chunk 4/1");
  g.chunk_threads = 1, g.tp = 3;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "not divisible by tp 3");
  g.tp = 8, g.name = "bad-name";
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "not a C identifier");
  /* kernels rendered for another kernel ABI (kl_abi.h) than the runtime's */
  g.name = "kimi_k3_tp8";
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "kernel ABI 0");
  const char *old = "#define KL_ABI_VERSION 2\nextern \"C\" __global__ void k() {}";
  g.source = old, g.source_len = strlen(old);
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "kernel ABI 2");
  /* with a topk, the row sampler's split the kernels were rendered for */
#define STR_(x) #x
#define STR(x) STR_(x)
  const char *split = "#define KL_ABI_VERSION " STR(KL_ABI_VERSION) "\n"
                      "static constexpr int SAMPLE_SLICES = 16;\n"
                      "static constexpr long long SAMPLE_SLICE_COLS = 10240;\n";
  g.source = split, g.source_len = strlen(split), g.topk = 8;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "sampler slices 16/32 of 10240/5120");
  /* the noise the header names is the one its kernels draw */
  const char *noise = "#define KL_ABI_VERSION " STR(KL_ABI_VERSION) "\n"
                      "static constexpr int SAMPLE_SLICES = 32;\n"
                      "static constexpr long long SAMPLE_SLICE_COLS = 5120;\n"
                      "static constexpr int NOISE = 0;\n";
  g.source = noise, g.source_len = strlen(noise), g.abi = 5, g.noise = 1;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "names noise 1 but its kernels draw noise 0");
  g.noise = 7;
  EXPECT_ERR(kl_ctx_create_generated(&c, &g, &cfg), KLRT_ESPEC, "noise: must be philox or vllm");
  kl_group_destroy(grp);
}

/* Structs that carry their size (kl_config in, kl_stats and kl_info out). */
static void sizes(void) {
  kl_ctx *c;
  struct {
    kl_config cfg;
    char newer[16]; /* fields of a newer header */
  } big;
  memset(&big, 0, sizeof big);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 8;
  cfg.size = 0;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "KL_CONFIG_INIT");
  cfg.size = sizeof cfg - 8;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, "less than the oldest kl_config");
  big.cfg = (kl_config)KL_CONFIG_INIT;
  big.cfg.size = sizeof big, big.cfg.nranks = 8, big.cfg.rank = 9;
  big.newer[3] = 1;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &big.cfg), KLRT_EINVAL, "does not know");
  big.newer[3] = 0; /* unknown but zero: accepted, so the next check speaks */
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &big.cfg), KLRT_EINVAL, "rank 9 is outside");
  kl_info i;
  memset(&i, 0, sizeof i);
  EXPECT_ERR(kl_spec_info_string(kimi, NULL, &i), KLRT_EINVAL, "info->size is 0");
  /* an older caller's smaller kl_info: only its bytes are written */
  struct {
    kl_info info;
    char guard[8];
  } old;
  memset(&old, 0x5a, sizeof old);
  old.info.size = offsetof(kl_info, vocab_size);
  CHECK(kl_spec_info_string(kimi, NULL, &old.info) == KLRT_OK &&
            !strcmp(old.info.name, "kimi_k3_tp8"), "small info: %s", kl_last_error());
  CHECK(((unsigned char *)&old.info.vocab_size)[0] == 0x5a && old.guard[0] == 0x5a,
        "written past the caller's size");
}

/* Environment variables: one table, validated at creation; README's table of
 * variables lists exactly the table's. */
static void environment(void) {
  kl_ctx *c;
  kl_group *g;
  kl_group_create(&g, 8);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 8, cfg.group = g;
  kl_info i = KL_INFO_INIT;
  const char *bad[][3] = {{"KLGEN_CROSSOVER_BYTES", "12x", "expected an integer"},
                          {"KLGEN_CROSSOVER_BYTES", "-1", "expected an integer in 0.."},
                          {"KLGEN_DISABLE", "maybe", "expected 1/true/yes/on"},
                          {"KLGEN_PDL", "2", "expected 1/true"},
                          {"KLGEN_SPEC_TIME_MS", "0", "KLGEN_SPEC_TIME_MS='0'"},
                          {"KLGEN_CACHE_DIR", "rel/cache", "KLGEN_CACHE_DIR='rel/cache': "
                                                           "expected an absolute path"},
                          {"KLGEN_LOG", "verbose", "KLGEN_LOG='verbose'"}};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    setenv(bad[k][0], bad[k][1], 1);
    EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_EINVAL, bad[k][2]);
    EXPECT_ERR(kl_spec_info_string(kimi, NULL, &i), KLRT_EINVAL, bad[k][0]);
    unsetenv(bad[k][0]);
  }
  setenv("KLGEN_DISABLE", "false", 1);
  CHECK(kl_param_int(KL_P_DISABLE, NULL) == 0, "KLGEN_DISABLE=false disables");
  setenv("KLGEN_DISABLE", "ON", 1);
  CHECK(kl_param_int(KL_P_DISABLE, NULL) == 1, "KLGEN_DISABLE=ON does not");
  setenv("KLGEN_DISABLE", "", 1);
  char why[KL_PARAM_WHY];
  CHECK(kl_params_check(why, sizeof why) == 0 && kl_param_int(KL_P_DISABLE, NULL) == 0,
        "empty = unset");
  unsetenv("KLGEN_DISABLE");
  /* the spec's time limit comes from the environment; a malformed one is
   * refused with the message klgen prints (test_cli.sh) */
  setenv("KLGEN_SPEC_TIME_MS", "100", 1);
  EXPECT_ERR(kl_spec_info_string("while true do end", NULL, &i), KLRT_ESPEC,
             "time limit (100 ms)");
  setenv("KLGEN_SPEC_TIME_MS", "abc", 1);
  EXPECT_ERR(kl_spec_info_string(kimi, NULL, &i), KLRT_EINVAL, "");
  CHECK(!strcmp(kl_last_error(), "environment: KLGEN_SPEC_TIME_MS='abc': expected an integer in "
                "1..3600000"), "KLGEN_SPEC_TIME_MS=abc: '%s'", kl_last_error());
  unsetenv("KLGEN_SPEC_TIME_MS");
  kl_group_destroy(g);
  /* README: the rows of its variable table are the parameter table */
  FILE *f = fopen(SPEC_DIR "/../README.md", "r");
  CHECK(f != NULL, "README.md");
  if (!f) return;
  char line[1024];
  int seen[KL_P_COUNT] = {0}, rows = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "| `", 3) != 0) continue;
    char name[128];
    if (sscanf(line + 3, "%127[A-Z_]", name) != 1 || strchr(name, '_') == NULL) continue;
    if (strncmp(name, "KLGEN_", 6) && strncmp(name, "CUDA_", 5)) continue;
    rows++;
    int found = 0;
    for (int p = 0; p < KL_P_COUNT; p++)
      if (!strcmp(kl_params[p].name, name)) seen[p] = found = 1;
    CHECK(found, "README documents %s, which libklrt does not read", name);
  }
  fclose(f);
  for (int p = 0; p < KL_P_COUNT; p++)
    CHECK(seen[p], "README's table lacks %s", kl_params[p].name);
  CHECK(rows >= KL_P_COUNT, "README rows %d", rows);
}

/* Ranks compare fingerprints: what must be equal for them to run together. */
static void fingerprint(void) {
  kl_spec_list l;
  kl_err e;
  CHECK(kl_spec_load_string("t", kimi, strlen(kimi), NULL, &l, &e) == 0, "%s", e.msg);
  kl_layout lay;
  kl_layout_derive(&l.v[0], &lay, &e);
  uint64_t base = kl_fingerprint(&l.v[0], &lay, 42);
  CHECK(kl_fingerprint(&l.v[0], &lay, 42) == base, "deterministic");
  CHECK(kl_fingerprint(&l.v[0], &lay, 43) != base, "covers the kernel source");
  kl_layout other = lay;
  other.timeout_ns += 1000000;
  CHECK(kl_fingerprint(&l.v[0], &other, 42) != base, "covers timeout_ms");
  kl_spec s2 = l.v[0];
  s2.max_tokens = 32;
  CHECK(kl_fingerprint(&s2, &lay, 42) != base, "covers max_tokens");
  kl_spec_list_free(&l);
}

/* Libraries found at run time: the host's copy first, and a miss that says
 * everything it tried. */
static void dynlib(void) {
  char why[1024];
  static const char *const fb[] = {"/nonexistent/fallback/libx.so", NULL};
  void *h = kl_dynlib_open("FOO", "libklgen-nonexistent.so.9", "/nonexistent/hint/libfoo.so", fb,
                           why, sizeof why);
  CHECK(h == NULL, "found a library that does not exist");
  CHECK(strstr(why, "FOO not found") && strstr(why, "libklgen-nonexistent.so.9 already in the process") &&
            strstr(why, "/nonexistent/hint/libfoo.so") && strstr(why, "/nonexistent/fallback/libx.so"),
        "message does not say what was searched: %s", why);
  /* A copy already loaded (as torch would have) is the one returned. */
  void *mine = dlopen(KL_TEST_NCCL, RTLD_NOW | RTLD_LOCAL);
  if (!mine) {
    printf("no NCCL at %s: the already-loaded check is skipped\n", KL_TEST_NCCL);
    return;
  }
  h = kl_dynlib_open("NCCL", "libnccl.so.2", "/nonexistent/elsewhere.so", NULL, why, sizeof why);
  CHECK(h == mine, "did not return the copy already in the process");
  char nwhy[512];
  const kl_nccl_api *api = kl_nccl_api_get(NULL, nwhy, sizeof nwhy);
  CHECK(api && api->ncclGetErrorString && api->ncclAllGather, "NCCL table: %s", nwhy);
}

/* GPUs the kernels cannot run on are refused at creation, naming the minimum. */
static void arch(void) {
  EXPECT_ERR(kl_require_arch(1, 7, 5), KLRT_EUNAVAILABLE,
             "GPU 1 is sm_75; libklrt's kernels need sm_80 or newer");
  CHECK(kl_require_arch(0, 8, 0) == KLRT_OK && kl_require_arch(0, 9, 0) == KLRT_OK &&
            kl_require_arch(0, 10, 0) == KLRT_OK, "sm_80+ accepted");
}

/* Names of the specs in a file or a string; sizes from a string. */
static void names(void) {
  char n[4][KL_INFO_NAME];
  int count = -1;
  CHECK(kl_spec_names_file(SPEC_DIR "/deepseek_v3.lua", n, 4, &count) == KLRT_OK && count == 3 &&
            !strcmp(n[0], "deepseek_v3_tp2") && !strcmp(n[2], "deepseek_v3_tp8"),
        "names: %d %s", count, kl_last_error());
  count = -1;
  CHECK(kl_spec_names_file(SPEC_DIR "/deepseek_v3.lua", NULL, 0, &count) == KLRT_OK && count == 3,
        "count only");
  strcpy(n[1], "untouched");
  CHECK(kl_spec_names_string(kimi, n, 1, &count) == KLRT_OK && count == 1 &&
            !strcmp(n[0], "kimi_k3_tp8") && !strcmp(n[1], "untouched"), "string names");
  EXPECT_ERR(kl_spec_names_string(kimi, NULL, 2, &count), KLRT_EINVAL, "names NULL");
  EXPECT_ERR(kl_spec_names_string(kimi, n, 1, NULL), KLRT_EINVAL, "count is NULL");
  EXPECT_ERR(kl_spec_names_file("/nonexistent.lua", n, 1, &count), KLRT_ESPEC, "cannot open");
  EXPECT_ERR(kl_spec_names_string("return {", n, 1, &count), KLRT_ESPEC, "<spec string>:1:");
  kl_info i = KL_INFO_INIT;
  CHECK(kl_spec_info_string(kimi, NULL, &i) == KLRT_OK && i.shard == 20480 && i.tp == 8 &&
            i.topk == 0, "info from a string: %s", kl_last_error());
  CHECK(kl_spec_info_string("return { name = 'k', vocab_size = 1000, tp = 2, dtype = 'bf16', "
                            "max_tokens = 4, topk = 16 }", NULL, &i) == KLRT_OK && i.topk == 16,
        "info: topk %d (%s)", i.topk, kl_last_error());
  EXPECT_ERR(kl_spec_info_string(NULL, NULL, &i), KLRT_EINVAL, "NULL");
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
  kl_config cfg = {.size = sizeof(kl_config), .rank = 0, .nranks = 8, .device = 0, .group = g};
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, NULL, &cfg), KLRT_ENODRIVER, "libcuda");
  CHECK(c == NULL, "*ctx set without a driver");
  EXPECT_ERR(kl_ctx_create_file(&c, SPEC_DIR "/kimi_k3_tp8.lua", NULL, &cfg), KLRT_ENODRIVER,
             "no CUDA driver");
  kl_group_destroy(g);
}

/* kl_gather's step: its shard's bytes against the crossover. */
static int gather_path(const kl_ctx *c, int tokens, kl_decline *why) {
  return kl_path_for(c, tokens, (long long)tokens * c->layout.shard_bytes, why);
}

/* The dispatch rule, on a context assembled by hand: no device needed. */
static void dispatch(void) {
  kl_ctx c;
  memset(&c, 0, sizeof c);
  c.spec.max_tokens = 64;
  c.layout.shard_bytes = 40960;
  c.ready = 1, c.nccl_everywhere = 1, c.crossover = 40960 * 16;
  kl_decline why;
  CHECK(gather_path(&c, 1, &why) == PATH_ONESHOT, "1 token: one-shot");
  CHECK(gather_path(&c, 16, &why) == PATH_ONESHOT, "at the crossover: one-shot");
  CHECK(gather_path(&c, 17, &why) == PATH_NCCL && why == KL_DECLINE_SIZE, "over: size");
  CHECK(kl_path_for(&c, 17, 0, &why) == PATH_ONESHOT, "kl_argmax/kl_topk's records: no size");
  c.nccl_everywhere = 0;
  CHECK(gather_path(&c, 17, &why) == PATH_ONESHOT, "no NCCL anywhere: no size decline");
  CHECK(gather_path(&c, 65, &why) == PATH_NCCL && why == KL_DECLINE_TOKENS, "tokens");
  c.ready = 0;
  CHECK(gather_path(&c, 1, &why) == PATH_NCCL && why == KL_DECLINE_NOT_READY, "not ready");
  c.disabled = 1;
  CHECK(gather_path(&c, 1, &why) == PATH_NCCL && why == KL_DECLINE_DISABLED,
        "disabled wins");
}

/* The kernel table's grids are the layout's, each kernel its own: capped at
 * the entry's cap, or as the rows need. No device needed. */
static void kernel_grids(void) {
  kl_spec_list l;
  kl_err e;
  const char *src = "return { name = 'k', vocab_size = 163840, tp = 8, dtype = 'bf16', "
                    "max_tokens = 64, topk = 8 }";
  CHECK(kl_spec_load_string("t", src, strlen(src), NULL, &l, &e) == 0, "%s", e.msg);
  if (l.n != 1) return;
  kl_ctx c;
  memset(&c, 0, sizeof c);
  c.spec = l.v[0];
  kl_spec_list_free(&l);
  CHECK(kl_layout_derive(&c.spec, &c.layout, &e) == 0, "%s", e.msg);
  c.kern[KL_K_ONESHOT].cap = 7, c.kern[KL_K_ARGMAX].cap = 5, c.kern[KL_K_TOPK].cap = 3;
  c.kern[KL_K_RELAYOUT].cap = 11;
  const kl_layout *lay = &c.layout;
  int64_t out = 64LL * c.spec.vocab_size * lay->out_elem_bytes;
  CHECK(kl_grid(&c, KL_K_ONESHOT, 64, 1) == kl_layout_grid(lay, 64, 7) &&
            kl_grid(&c, KL_K_ONESHOT, 64, 0) == kl_layout_grid(lay, 64, 0), "one-shot grid");
  CHECK(kl_grid(&c, KL_K_ARGMAX, 64, 1) == kl_layout_select_grid(lay, 64, 5, 0) &&
            kl_grid(&c, KL_K_ARGMAX, 64, 0) == kl_layout_select_grid(lay, 64, 0, 0),
        "argmax grid");
  CHECK(kl_grid(&c, KL_K_TOPK, 64, 1) == kl_layout_select_grid(lay, 64, 3, 1) &&
            kl_grid(&c, KL_K_TOPK, 64, 0) == kl_layout_select_grid(lay, 64, 0, 1), "top-k grid");
  CHECK(kl_grid(&c, KL_K_RELAYOUT, 64, 1) == kl_layout_relayout_grid(lay, out, 11),
        "relayout grid");
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
  kl_info i = KL_INFO_INIT;
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

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One hostile spec through both of the library's file loaders, under
 * KLGEN_SPEC_TIME_MS=500: refused with `want`, within 1.5 times that. */
static void hostile_file(const char *path, const char *want) {
  kl_group *g;
  kl_group_create(&g, 8);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 8, cfg.group = g;
  kl_info i = KL_INFO_INIT;
  kl_ctx *c;
  for (int ctx = 0; ctx < 2; ctx++) {
    double t0 = seconds();
    kl_result r = ctx ? kl_ctx_create_file(&c, path, NULL, &cfg) : kl_spec_info_file(path, NULL, &i);
    double dt = seconds() - t0;
    CHECK(r == KLRT_ESPEC && !strncmp(kl_last_error(), path, strlen(path)) &&
              strstr(kl_last_error(), want), "%s (%s): %s, '%s' (want '%s')", path,
          ctx ? "kl_ctx_create_file" : "kl_spec_info_file", kl_result_name(r), kl_last_error(),
          want);
    CHECK(dt < 0.75, "%s (%s) took %.3f s under a 500 ms limit", path,
          ctx ? "kl_ctx_create_file" : "kl_spec_info_file", dt);
  }
  kl_group_destroy(g);
}

/* tests/spec/hostile (see test_spec.c), and the field chain whose message Lua
 * before 5.4.8 built by recursion (a crash), through the library. */
static void hostile(void) {
  setenv("KLGEN_SPEC_TIME_MS", "500", 1);
  DIR *d = opendir(HOSTILE_DIR);
  CHECK(d != NULL, "%s", HOSTILE_DIR);
  int files = 0;
  for (struct dirent *f; d && (f = readdir(d)) != NULL;) {
    size_t n = strlen(f->d_name);
    if (n < 5 || strcmp(f->d_name + n - 4, ".lua") != 0) continue;
    char path[1024], want[256] = "";
    snprintf(path, sizeof path, "%s/%s", HOSTILE_DIR, f->d_name);
    FILE *in = fopen(path, "r");
    if (in && fgets(want, sizeof want, in) && !strncmp(want, "-- refused: ", 12))
      memmove(want, want + 12, strlen(want + 12) + 1);
    if (in) fclose(in);
    want[strcspn(want, "\n")] = 0;
    hostile_file(path, want);
    files++;
  }
  if (d) closedir(d);
  CHECK(files > 0, "no hostile specs in %s", HOSTILE_DIR);
  char chain[] = "/tmp/klgen-chain-XXXXXX";
  int fd = mkstemp(chain);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f) {
    fputs("local t = {}\nt.x = t\nreturn t", f);
    for (int k = 0; k < 100000; k++) fputs(".x", f);
    fputs(".nope + 1\n", f);
    fclose(f);
    hostile_file(chain, ":3: attempt to perform arithmetic on a nil value (field 'nope')");
    unlink(chain);
  }
  unsetenv("KLGEN_SPEC_TIME_MS");
}

/* What a caller or the file system says reaches kl_last_error and the log
 * (KLGEN_LOG=1) with its control bytes escaped. The log is read once per
 * process: a child (this program again, KLGEN_LOG=1) writes it. */
static void logged_child(void) {
  kl_group *g;
  kl_group_create(&g, 8);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 8, cfg.group = g;
  kl_ctx *c;
  kl_ctx_create_string(&c, kimi, "zzz\x1b[31m\n[klgen] forged", &cfg);
  kl_binary b;
  kl_err e;
  int hit;
  if (kl_jit_cubin("extern \"C\" __global__ void k() {}\n", "k", "sm_90", "/dev/null/\x1b[2J\rx", &b,
                   &hit, &e) == 0)
    kl_binary_free(&b);
  kl_group_destroy(g);
}

static void escaped(const char *self) {
  kl_group *g;
  kl_group_create(&g, 8);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 8, cfg.group = g;
  kl_ctx *c;
  EXPECT_ERR(kl_ctx_create_string(&c, kimi, "zzz\x1b[31m\n", &cfg), KLRT_EINVAL,
             "no spec named 'zzz\\x1b[31m\\x0a' in it");
  kl_group_destroy(g);
  char log[] = "/tmp/klgen-log-XXXXXX";
  int fd = mkstemp(log);
  pid_t pid = fd >= 0 ? fork() : -1;
  if (pid == 0) {
    dup2(fd, 2);
    setenv("KLGEN_LOG", "1", 1);
    execl(self, self, "--log-child", (char *)NULL);
    _exit(127);
  }
  int st = 0;
  if (pid > 0) waitpid(pid, &st, 0);
  CHECK(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "log child: status %d", st);
  char text[8192] = "";
  ssize_t n = fd >= 0 ? pread(fd, text, sizeof text - 1, 0) : -1;
  text[n > 0 ? n : 0] = 0;
  CHECK(strstr(text, "[klgen] error: KLRT_EINVAL: no spec named 'zzz\\x1b[31m\\x0a[klgen] forged' "
                     "in it; it defines kimi_k3_tp8\n") != NULL, "log: %s", text);
  CHECK(strstr(text, "[klgen] JIT cache not used: /dev/null/\\x1b[2J\\x0dx") != NULL, "log: %s",
        text);
  int lines = 0, controls = 0;
  for (char *p = text; *p; p++) lines += *p == '\n', controls += (unsigned char)*p < 0x20 && *p != '\n';
  CHECK(lines == 2 && controls == 0, "log: %d lines, %d control bytes: %s", lines, controls, text);
  if (fd >= 0) close(fd), unlink(log);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--log-child")) return logged_child(), 0;
  hostile();
  escaped(argv[0]);
  crossover();
  info();
  misuse();
  generated();
  sizes();
  environment();
  fingerprint();
  names();
  arch();
  dynlib();
  no_driver();
  dispatch();
  kernel_grids();
  return check_done();
}
