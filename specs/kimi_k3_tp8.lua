-- Kimi-K3 (and Kimi-K2 / Kimi-Linear): 163840-token vocabulary, TP8, bf16.
-- 163840 is a multiple of 64 and of 8, so no padding: each rank owns 20480
-- columns, 40 KiB per token.
return {
  name = "kimi_k3_tp8",
  vocab_size = 163840,
  pad_to = 64,
  tp = 8,
  dtype = "bf16",
  max_tokens = 64,
}
