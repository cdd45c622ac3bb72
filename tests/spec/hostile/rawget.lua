-- refused: undefined global 'sofcap'
-- Raw access is no way around the strict globals.
return { name = "m", vocab_size = 163840, tp = 8, dtype = "bf16", max_tokens = 64,
         softcap = rawget(_G, "sofcap") }
