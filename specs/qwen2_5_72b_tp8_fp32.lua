-- Qwen2.5-72B: 152064-token vocabulary (the checkpoint's padded size; the
-- tokenizer uses 151665 of it), TP8, with the LM head's output kept in fp32
-- for sampling. 19008 columns (76032 bytes) per rank per token.
return {
  name = "qwen2_5_72b_tp8_fp32",
  vocab_size = 152064,
  tp = 8,
  dtype = "fp32",
  max_tokens = 32,
}
