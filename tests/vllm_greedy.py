"""Bare vLLM's greedy answers on a model folder, for tests that hold a deployment to the engine's own output.

    <vLLM's python> tests/vllm_greedy.py FOLDER '[[token IDs], ...]' MAX_TOKENS

Runs vLLM's offline `LLM` class under vLLM's own environment (none of modelhost is imported): eager, a small
KV cache, temperature 0, the end-of-sequence token ignored (so every prompt runs `MAX_TOKENS` steps), the
checkpoint's precision. Prints each prompt's answer as text, special tokens kept, as one JSON line after
`GREEDY ` (vLLM logs to the same output).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")  # as engines/vllm.py sets it on a CPU
    from vllm import LLM, SamplingParams
    from vllm.inputs import tokens_input

    folder, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    engine = LLM(model=folder, enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0, max_model_len=2048)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, skip_special_tokens=False)
    answers = engine.generate([tokens_input(p) for p in prompts], params, use_tqdm=False)
    print("GREEDY " + json.dumps([answer.outputs[0].text for answer in answers]), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may start at import
    main()
