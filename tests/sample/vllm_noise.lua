-- A spec whose kl_sample draws vLLM's noise (noise = "vllm"), for gpu_noise's
-- check that a spec's noise is the family it names.
return { name = "vllm_noise", vocab_size = 32000, tp = 2, dtype = "bf16", max_tokens = 8,
         topk = 8, noise = "vllm" }
