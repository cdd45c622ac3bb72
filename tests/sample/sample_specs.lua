-- Small specs for kl_sample's row sampler under compute-sanitizer
-- (.ci/gpu-sanitize.sh runs gpu_sample over them): both out dtypes,
-- the largest k, a vocabulary that is not a multiple of the block, and one
-- smaller than it.
return {
  { name = "sample_small_bf16", vocab_size = 3001, tp = 2, dtype = "bf16", max_tokens = 4,
    topk = 8 },
  { name = "sample_small_fp32", vocab_size = 1000, tp = 4, dtype = "fp16", max_tokens = 4,
    out_dtype = "fp32", softcap = 30.0, topk = 64 },
  -- the largest k over enough columns that a row repeating every 256 columns
  -- (gpu_sample's) has more keys at the candidates' threshold than they hold
  { name = "sample_wide", vocab_size = 2600, tp = 2, dtype = "bf16", max_tokens = 4, topk = 64 },
  -- fewer columns than threads and than top-n slots: idle threads, slots past the vocabulary
  { name = "sample_tiny", vocab_size = 100, tp = 2, dtype = "bf16", max_tokens = 4, topk = 64 },
}
