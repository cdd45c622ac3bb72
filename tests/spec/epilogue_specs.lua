-- Specs with epilogues (out_dtype, softcap, scale, numerics), one per kind of
-- output store: compiled by test_nvrtc for sm_90 and sm_100.
return {
  -- Gemma-2-style soft-cap, upcast to fp32: 16-byte input chunks, 32-byte output
  { name = "epi_gemma", vocab_size = 256000, tp = 8, dtype = "bf16", max_tokens = 64,
    out_dtype = "fp32", softcap = 30.0 },
  -- odd vocabulary: element stores; everything in fp32, rounded once
  { name = "epi_gpt2", vocab_size = 50257, tp = 4, dtype = "fp16", max_tokens = 8,
    softcap = 50, scale = 0.5, numerics = "fp32" },
  -- fp32 logits, scale only
  { name = "epi_f32", vocab_size = 152064, tp = 8, dtype = "fp32", max_tokens = 4, scale = 1.25 },
  -- upcast only, odd vocabulary
  { name = "epi_up", vocab_size = 50257, tp = 2, dtype = "bf16", max_tokens = 4, out_dtype = "fp32" },
}
