-- refused: _ENV: a spec may not name _ENV
-- With its own _ENV a misspelt name (sofcap) would read as nil, and the
-- field would vanish.
local _ENV = { math = math }
return { name = "m", vocab_size = 163840, tp = 8, dtype = "bf16", max_tokens = 64,
         softcap = sofcap }
