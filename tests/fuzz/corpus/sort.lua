local t = { "tp8", "tp2", "tp4" }
table.sort(t, function(a, b) return #a < #b or (#a == #b and a < b) end)
local s = {}
for i, n in ipairs(t) do s[i] = { name = "m_" .. n, vocab_size = 4096 * i, tp = 2 ^ i, dtype = "bf16", max_tokens = i } end
return s
