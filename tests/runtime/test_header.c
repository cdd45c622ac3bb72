/* The header klgen generates compiles as C11 with -Wall -Wextra -Werror, carries
 * exactly the .cu it was generated with, and initializes a kl_generated that
 * matches the spec.   test_header GENERATED_DIR */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "klgen.h"
#include "klrt/klrt.h"
/* two headers in one translation unit must not clash */
#include "gpt2_tp4.h"
#include "kimi_k3_tp8.h"

static void same_as_file(const char *dir, const char *name, const char *src, size_t len) {
  char path[1024], *data;
  size_t n;
  kl_err e;
  snprintf(path, sizeof path, "%s/%s.cu", dir, name);
  if (kl_read_file(path, &data, &n, 1 << 22, &e)) {
    CHECK(0, "%s", e.msg);
    return;
  }
  CHECK(n == len && !memcmp(data, src, n), "%s: header source differs from %s", name, path);
  free(data);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static const kl_generated k = KL_KIMI_K3_TP8_GENERATED, g = KL_GPT2_TP4_GENERATED;
  CHECK(k.abi == 5 && k.noise == 0 && k.chunk_threads == 1 && k.argmax_split == 5 && k.topk_split == 10 &&
            k.topk == 0 && k.out_dtype == 0 && k.softcap == 0 && k.scale == 0 &&
            !strcmp(k.name, "kimi_k3_tp8") && k.vocab_size == 163840 && k.tp == 8 &&
            k.dtype == 0 && k.max_tokens == 64 && k.vec_bytes == 16 && k.block == 128,
        "kimi initializer");
  CHECK(g.vocab_size == 50257 && g.padded_vocab == 50304 && g.dtype == 1 && g.vec_bytes == 2,
        "gpt2 initializer");
  CHECK(KL_KIMI_K3_TP8_SHARD == 20480 && KL_GPT2_TP4_SHARD == 12576, "shard macros");
  CHECK(!strcmp(KL_KIMI_K3_TP8_ONESHOT, "kl_kimi_k3_tp8_oneshot"), "entry name");
  CHECK(k.source_len == strlen(k.source), "source length");
  same_as_file(argv[1], "kimi_k3_tp8", k.source, k.source_len);
  same_as_file(argv[1], "gpt2_tp4", g.source, g.source_len);
  return check_done();
}
