-- Specs for tests/select/gpu_select.c: kl_argmax and kl_topk with and
-- without an epilogue, both numerics, every dtype, padded and unpadded
-- vocabularies.
return {
  -- Kimi-K3's shard, no epilogue, top-8
  { name = "kimi_sel_tp8", vocab_size = 163840, tp = 8, dtype = "bf16", max_tokens = 64,
    topk = 8 },
  -- Gemma 2-like: soft-capped, fp32 out, engine numerics
  { name = "gemma_sel_tp8", vocab_size = 256000, tp = 8, dtype = "bf16", max_tokens = 16,
    out_dtype = "fp32", softcap = 30.0, topk = 8 },
  -- padded (151655 -> 151680), fp16, soft-cap and scale in fp32 numerics, the largest k
  { name = "qwen_sel_tp8", vocab_size = 151655, tp = 8, dtype = "fp16", max_tokens = 8,
    softcap = 30.0, scale = 0.5, numerics = "fp32", topk = 64 },
  -- fp32 logits, padded (50257 -> 50304), a scale, tp 4
  { name = "gpt2_sel_tp4", vocab_size = 50257, tp = 4, dtype = "fp32", max_tokens = 8,
    scale = 2.0, topk = 5 },
  -- TP2, a long shard row (CTAs read several chunks per thread), engine soft-cap in bf16
  { name = "tp2_sel", vocab_size = 131072, tp = 2, dtype = "bf16", max_tokens = 8,
    softcap = 50.0, topk = 1 },
  -- fp16 at TP2 with a small k: the merge's 32-bit round keys from fp16 values;
  -- kl_sample draws vLLM's noise
  { name = "llama2_sel_tp2", vocab_size = 32000, tp = 2, dtype = "fp16", max_tokens = 8,
    topk = 4, noise = "vllm" },
  -- DeepSeek-V3's vocabulary at TP2: fp32 out through fp32 numerics, vLLM's noise
  { name = "tp2_sel8", vocab_size = 129280, tp = 2, dtype = "bf16", max_tokens = 16,
    out_dtype = "fp32", softcap = 30.0, numerics = "fp32", topk = 8, noise = "vllm" },
  -- klbench --select's top-8 (Kimi's TP8 shard at TP2), padded (40950 -> 40960):
  -- 32-bit keys kept from the scan, 20 records merged in one warp's registers
  { name = "kimi_sel_tp2", vocab_size = 40950, pad_to = 64, tp = 2, dtype = "bf16",
    max_tokens = 16, topk = 8 },
}
