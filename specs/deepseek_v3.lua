-- DeepSeek-V3 / R1: 129280-token vocabulary, bf16. One file, three specs: a
-- loop generates the TP 2, 4 and 8 variants (deepseek_v3_tp2, _tp4, _tp8).
local specs = {}
for _, tp in ipairs({ 2, 4, 8 }) do
  specs[#specs + 1] = {
    name = "deepseek_v3_tp" .. tp,
    vocab_size = 129280,
    pad_to = 64,
    tp = tp,
    dtype = "bf16",
    max_tokens = 64,
  }
end
return specs
