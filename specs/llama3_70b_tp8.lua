-- Llama 3 / 3.1 / 3.3 70B: 128256-token vocabulary, bf16, TP8.
-- 128256 = 64 * 2004, so no padding; 16032 columns per rank.
return {
  name = "llama3_70b_tp8",
  vocab_size = 128256,
  tp = 8,
  dtype = "bf16",
  max_tokens = 64,
}
