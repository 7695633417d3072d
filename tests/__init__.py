"""The test suite. Imported before any test module or conftest, so this is where the tests' environment is
made their own: nothing of the caller's `MODELHOST_*` settings (but the suite's own `MODELHOST_TEST_*`
and `MODELHOST_CONSOLE_SCREENSHOTS`) and no `.env` file, such as the one `make run` writes into the
checkout, reaches the tests or the servers they start. It runs before modelhost is imported: the settings
class reads `MODELHOST_ENV_FILE` then."""

import os


def suite_cache() -> str:
    """The user's cache folder for what the suite keeps between runs (built models, vLLM's cache)."""
    return os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "modelhost"
    )


TEST_SUITE_SETTINGS = ("MODELHOST_TEST_", "MODELHOST_CONSOLE_SCREENSHOTS")
for _name in [n for n in os.environ if n.startswith("MODELHOST_") and not n.startswith(TEST_SUITE_SETTINGS)]:
    del os.environ[_name]
# The suite's own values, for every test and server: no `.env` file, text generation on the transformers
# engine unless a test asks for vLLM (tests/test_vllm.py names its environment itself: a checkout's
# .venv-vllm must not move every chat test onto vLLM), and encoders on torch unless a test asks for ONNX
# Runtime (tests/test_encoder_runtimes.py: an export at every encoder's first load would cost every
# module seconds, and its outputs equal torch's only within 1e-4).
SUITE_VALUES = {
    "MODELHOST_ENV_FILE": "",
    "MODELHOST_VLLM_PYTHON": "",
    "MODELHOST_ENCODER_RUNTIMES": "false",
    "MODELHOST_LLAMA_SERVER": "",  # the wheel's llama.cpp server, never a checkout's native build
}
# One vLLM cache for every server the suite starts (and for bare vLLM, tests/test_quantized.py): with a
# cache of its own each vLLM start learned its model class again in a process of its own (about 8 s of
# CPU here) at each start.
SUITE_VALUES["MODELHOST_VLLM_CACHE_DIR"] = os.path.join(suite_cache(), "test-vllm-cache")
os.environ.update(SUITE_VALUES)
