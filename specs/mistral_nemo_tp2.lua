-- Mistral NeMo 12B (Tekken tokenizer): 131072-token vocabulary, bf16, TP2.
return {
  name = "mistral_nemo_tp2",
  vocab_size = 131072,
  tp = 2,
  dtype = "bf16",
  max_tokens = 64,
}
