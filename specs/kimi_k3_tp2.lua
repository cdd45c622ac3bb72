-- Kimi-K3 at TP2: 81920 columns (160 KiB in bf16) per rank per token. The
-- shard size used to measure the bandwidth end of the one-shot path.
return {
  name = "kimi_k3_tp2",
  vocab_size = 163840,
  tp = 2,
  dtype = "bf16",
  max_tokens = 64,
  timeout_ms = 2000,
}
