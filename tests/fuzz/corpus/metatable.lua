return setmetatable({ name = "m", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }, { __index = function() return 1 end })
