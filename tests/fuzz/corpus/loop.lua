local t = {}
for i = 1, 10 do t[#t + 1] = { name = "x" .. i, vocab_size = 1000 * i, pad_to = 8, tp = 2, dtype = "fp16", max_tokens = i } end
return t
