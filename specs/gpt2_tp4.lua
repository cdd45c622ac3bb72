-- GPT-2: 50257-token vocabulary, fp16. 50257 is odd, so it is padded to a
-- multiple of 64 (50304); each of 4 ranks owns 12576 columns. The odd
-- vocabulary limits output stores to 2 bytes: see the vec width klgen prints.
return {
  name = "gpt2_tp4",
  vocab_size = 50257,
  pad_to = 64,
  tp = 4,
  dtype = "fp16",
  max_tokens = 128,
}
