return { name = "s", vocab_size = #string.rep("ab", 100, ","), tp = 1, dtype = "bf16", max_tokens = 2 }
