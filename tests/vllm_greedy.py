"""Bare vLLM's greedy answers on a model folder, for tests that hold a deployment to the engine's own output.

    <vLLM's python> tests/vllm_greedy.py FOLDER '[[token IDs], ...]' MAX_TOKENS [ADAPTER]

Runs vLLM's offline `LLM` class under vLLM's own environment (none of modelhost is imported): eager, a small
KV cache, temperature 0, the end-of-sequence token ignored (so every prompt runs `MAX_TOKENS` steps), the
checkpoint's precision. Prints each prompt's answer as text, special tokens kept, as one JSON line after
`GREEDY ` (vLLM logs to the same output): `{"base": [...], "adapter": [...]}`, the latter with the LoRA
adapter in the folder ADAPTER applied (empty without one).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")  # as engines/vllm.py sets it on a CPU
    from vllm import LLM, SamplingParams
    from vllm.inputs import tokens_input
    from vllm.lora.request import LoRARequest

    folder, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    adapter = sys.argv[4] if len(sys.argv) > 4 else None
    lora = {"enable_lora": True, "max_lora_rank": 8} if adapter else {}
    engine = LLM(
        model=folder, enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0, max_model_len=2048, **lora
    )
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, skip_special_tokens=False)
    inputs = [tokens_input(p) for p in prompts]
    answers = {"base": engine.generate(inputs, params, use_tqdm=False), "adapter": []}
    if adapter:
        request = LoRARequest("adapter", 1, adapter)
        answers["adapter"] = engine.generate(inputs, params, lora_request=request, use_tqdm=False)
    texts = {kind: [answer.outputs[0].text for answer in found] for kind, found in answers.items()}
    print("GREEDY " + json.dumps(texts), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may start at import
    main()
