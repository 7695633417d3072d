"""modelhost's own text-generation engine: continuous batching over one causal LM (`engine`), a slot KV
cache allocated once (`kv_cache`), decoding steps replayed from CUDA graphs (`cuda_graphs`) and grammar
constraints on llguidance (`guidance`)."""
