"""The engines a replica hosts, side by side: what executes a model (docs/architecture.md,
"Engines inside a replica").

- `native`: modelhost's own continuous-batching text-generation engine (torch), stepped by the
  text-generation handler inside `runtime.worker.sync_worker`'s loop;
- `vllm`: vLLM's async engine, under vLLM's own Python, driven by `runtime.worker.vllm_worker`;
- `llamacpp`, `llamacpp_embeddings`: llama.cpp's server for GGUF files (generating, or embedding), driven
  by `runtime.worker.llamacpp_worker`;
- `encoders`: ONNX Runtime and OpenVINO in place of an encoder's torch model, chosen when a replica loads;
- `loader`: the one place models are loaded; `chat_images`: a chat with images made ready for either
  text engine.

What an engine is, of each kind (stepped, self-stepping, encoder runtime), is `interface`: every engine
class declares its kind from there. Engines import the domain and the base, never a task handler or the
replica runtime that hosts them.
"""
