/* Layout derivation: padding, shard, every vector width, buffer sizes, grid. */
#include <string.h>

#include "check.h"
#include "klgen.h"

static kl_spec spec(const char *name, long long vocab, long long pad, long long padded, int tp,
                    kl_dtype d, long long max_tokens) {
  kl_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.name, sizeof s.name, "%s", name);
  s.vocab_size = vocab, s.pad_to = pad, s.padded_vocab = padded, s.tp = tp, s.dtype = d;
  s.max_tokens = max_tokens;
  return s;
}

static kl_layout derive(kl_spec s) {
  kl_layout l;
  kl_err e;
  int rc = kl_layout_derive(&s, &l, &e);
  CHECK(rc == 0, "%s: %s", s.name, e.msg);
  return l;
}

int main(void) {
  kl_layout l = derive(spec("kimi", 163840, 64, 0, 8, KL_BF16, 64));
  CHECK(l.padded_vocab == 163840 && l.shard == 20480 && l.shard_bytes == 40960, "kimi shard");
  CHECK(l.vec_bytes == 16 && l.row_chunks == 2560, "kimi vec %d", l.vec_bytes);
  CHECK(l.total_bytes == 3LL * 8 * 64 * 2560 * 16, "kimi buffers %lld", (long long)l.total_bytes);
  CHECK(l.block == 128 && l.max_ctas == 64 * 2560 / 128, "kimi launch %d %d", l.block, l.max_ctas);
  CHECK(l.timeout_ns == 10000LL * 1000000, "default time limit");

  kl_spec s = spec("kimi", 163840, 64, 0, 8, KL_BF16, 64);
  CHECK(kl_layout_grid(&l, 1, 0) == 20, "grid 1 token");
  CHECK(kl_layout_grid(&l, 64, 0) == 1280, "grid 64 tokens");
  CHECK(kl_layout_grid(&l, 64, 100) == 100, "grid capped");
  CHECK(l.chunk_threads == 1, "no epilogue: a thread a chunk, got %d", l.chunk_threads);
  /* With an epilogue, four threads a chunk (a 4-byte part each): four times the grid. */
  kl_spec se = spec("kimi_epi", 163840, 64, 0, 8, KL_BF16, 64);
  se.out_dtype = KL_FP32, se.softcap = 30.0;
  kl_layout le = derive(se);
  CHECK(le.epilogue && le.chunk_threads == 4 && kl_layout_grid(&le, 1, 0) == 80 &&
            le.max_ctas == 4 * l.max_ctas,
        "epilogue: threads a chunk %d, grid %d, max %d", le.chunk_threads,
        kl_layout_grid(&le, 1, 0), le.max_ctas);
  /* ... but not where rows are only 2-byte aligned (parts are 4-byte loads) */
  kl_spec sg = spec("gpt2_epi", 50257, 64, 0, 4, KL_FP16, 8);
  sg.out_dtype = KL_FP16, sg.scale = 2.0;
  CHECK(derive(sg).chunk_threads == 1, "2-byte rows: a thread a chunk");
  /* relayout: one 16-byte vector per thread, 256 threads per CTA */
  CHECK(l.relayout_block == 256, "relayout block %d", l.relayout_block);
  CHECK(kl_layout_relayout_grid(&l, 163840 * 2, 1000) == 80, "relayout grid 1 token");
  CHECK(kl_layout_relayout_grid(&l, 64LL * 163840 * 2, 528) == 528, "relayout grid capped");
  CHECK(kl_layout_relayout_grid(&l, 0, 528) == 1, "relayout grid at least 1");

  /* Padding: GPT-2's odd vocabulary, the default pad (64), an explicit one. */
  l = derive(spec("gpt2", 50257, 64, 0, 4, KL_FP16, 8));
  CHECK(l.padded_vocab == 50304 && l.shard == 12576, "gpt2 padding %lld", (long long)l.padded_vocab);
  CHECK(l.vec_bytes == 2, "gpt2: odd vocab limits stores to 2 bytes, got %d", l.vec_bytes);
  l = derive(spec("dflt", 50257, 0, 0, 1, KL_BF16, 1));
  CHECK(l.padded_vocab == 50304, "default pad_to is 64");
  l = derive(spec("expl", 1000, 0, 1024, 4, KL_BF16, 1));
  CHECK(l.padded_vocab == 1024 && l.shard == 256, "explicit padded_vocab");
  l = derive(spec("pad1", 1000, 1, 0, 1, KL_BF16, 1));
  CHECK(l.padded_vocab == 1000, "pad_to 1");

  /* Every vector width. */
  CHECK(derive(spec("v16", 1024, 64, 0, 2, KL_BF16, 1)).vec_bytes == 16, "16");
  CHECK(derive(spec("v8", 1012, 4, 0, 1, KL_BF16, 1)).vec_bytes == 8, "8");
  CHECK(derive(spec("v4", 1010, 2, 0, 1, KL_BF16, 1)).vec_bytes == 4, "4");
  CHECK(derive(spec("v2", 1001, 1, 0, 1, KL_BF16, 1)).vec_bytes == 2, "2");
  CHECK(derive(spec("f16", 1000, 1, 0, 1, KL_FP32, 1)).vec_bytes == 16, "fp32 16");
  CHECK(derive(spec("f8", 1002, 2, 0, 1, KL_FP32, 1)).vec_bytes == 8, "fp32 8");
  CHECK(derive(spec("f4", 1001, 1, 0, 1, KL_FP32, 1)).vec_bytes == 4, "fp32 4");
  /* Shard aligned but the output row is not: the output decides. */
  CHECK(derive(spec("row", 1020, 64, 0, 2, KL_BF16, 1)).vec_bytes == 8, "row-limited");
  /* A shard row that is not a whole number of 16-byte chunks. */
  l = derive(spec("tail", 1010, 2, 0, 1, KL_BF16, 3));
  CHECK(l.row_chunks == 127 && l.slot_bytes == 3 * 127 * 16, "tail chunks %lld",
        (long long)l.row_chunks);

  /* Errors come from the same place. */
  kl_err e;
  s = spec("bad", 50257, 64, 0, 5, KL_BF16, 1);
  snprintf(s.file, sizeof s.file, "x.lua");
  s.line[KL_F_TP] = 4;
  CHECK(kl_layout_derive(&s, &l, &e) == KL_ESPEC && strstr(e.msg, "x.lua:4: tp:"), "%s", e.msg);
  s = spec("big", 163840, 64, 0, 8, KL_FP32, 4096);
  CHECK(kl_layout_derive(&s, &l, &e) == KL_ESPEC && strstr(e.msg, "max_tokens"), "%s", e.msg);
  CHECK(kl_layout_derive(NULL, &l, &e) == KL_EARG, "NULL spec");
  return check_done();
}
