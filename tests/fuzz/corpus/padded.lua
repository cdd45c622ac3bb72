return { name = "m", vocab_size = 50257, padded_vocab = 50304, tp = 4, dtype = "fp32", max_tokens = 3, timeout_ms = 100 }
