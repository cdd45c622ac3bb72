return { name = "g", vocab_size = 256000, tp = 8, dtype = "bf16", max_tokens = 8, out_dtype = "fp32", softcap = 30.0, scale = 0.5, numerics = "engine", topk = 8 }
