-- refused: ran past its time limit
-- A full hash part: one key out and one in, and every store rehashes all of
-- it, in C, with four instructions between two rehashes.
local t, n = {}, 1 << 18
for i = 1, n do t[i + 0.5] = true end
local i = n + 0.5
while true do t[i] = nil i = i + 1 t[i] = true end
