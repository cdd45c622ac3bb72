local x <close> = setmetatable({}, { __close = function() end })
return { name = "c", vocab_size = 7, tp = 1, dtype = "bf16", max_tokens = 1 }
