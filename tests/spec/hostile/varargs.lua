-- refused: ran past its time limit
-- {...} copies 300,000 values in C, three instructions a time.
local t = {}
for i = 1, 300000 do t[i] = i end
local function f(...) while true do local _ = {...} end end
f(table.unpack(t))
