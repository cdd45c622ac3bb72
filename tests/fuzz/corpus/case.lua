return { { name = "Ab", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }, { name = "aB", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 } }
