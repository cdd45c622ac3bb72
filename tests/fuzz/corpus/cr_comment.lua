-- Llama 3 / 3.1 / 3.3 70B: 128256-token vocabular70B: 128256-token vocabulary, bf16, T`P8.
-- 12825T`P8.
-- 128256 = 64 * 2004, so no padding; 16032 columns per.rank.return {
-- Llama 3 / 3.1 / 3.3 70B: 128256-token vocabulary, ba
}
