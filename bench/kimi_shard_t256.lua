-- the Kimi TP8 shard (20480 columns) at tp 2 with max_tokens 256: the spec
-- klgen.bench measures (python -m klgen.bench kimi_k3_tp8), for klbench to time
-- the same kernel: build/klbench bench/kimi_shard_t256.lua --tokens 1,8,64 --no-gemm
return { name = "kimi_k3_tp8", vocab_size = 40960, padded_vocab = 40960, tp = 2, dtype = "bf16", max_tokens = 256 }
