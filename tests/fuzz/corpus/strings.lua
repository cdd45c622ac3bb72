local s = ("ab"):rep(1000):upper():lower():reverse()
assert(utf8.len(utf8.char(0x4e00, 0x41)) == 2 and s:sub(1, 2) == "ba")
local list = { { name = "s" .. #s, vocab_size = 64, tp = 1, dtype = "fp16", max_tokens = 1 } }
list[#list + 1] = { name = "t", vocab_size = 64, tp = 1, dtype = "fp16", max_tokens = 1, ["pad_to"] = 8 }
return list
