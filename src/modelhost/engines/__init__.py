"""The engines a replica hosts, side by side: what executes a model (docs/architecture.md,
"Engines inside a replica").

- `native`: modelhost's own continuous-batching text-generation engine (torch), stepped by the
  text-generation handler inside `runtime.worker.sync_worker`'s loop;
- `vllm`: vLLM's async engine, under vLLM's own Python, driven by `runtime.worker.vllm_worker`;
- `encoders`: ONNX Runtime and OpenVINO in place of an encoder's torch model, chosen when a replica loads;
- `loader`: the one place models are loaded; `chat_images`: a chat with images made ready for either
  text engine.

What a replica's host needs of an engine is `interface`. Engines import the domain and the base, never a
task handler or the replica runtime that hosts them.
"""
