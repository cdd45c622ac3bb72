-- refused: undefined field 'math.pie'
-- The library tables are strict too.
return { name = "m", vocab_size = 163840, tp = 8, dtype = "bf16", max_tokens = 64,
         softcap = math.pie }
