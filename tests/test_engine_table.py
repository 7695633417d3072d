"""`engine_table` is the one source of what an engine is (issue 59): every list of engines the API, the
CLI and the console offer is its rows, and no module outside it compares an engine's name; and every row's
classes implement their kind of engine (`engines.interface`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from typing import Any, Protocol, get_args

from modelhost.cli.main import EngineName as CliEngine
from modelhost.engine_table import AUTO, ENGINE_TABLE, FALLBACK, EngineName, EngineSetting, engines_for, spec
from modelhost.engines import interface
from modelhost.pipelines import BY_NAME, TASKS
from modelhost.protocol.management import Engine, EngineInUse
from modelhost.runtime.engine_choice import ENGINES
from modelhost.runtime.supervisor.launch import WORKER_ARGS
from tests.helpers import SOURCE, source_trees

NAMES = frozenset(get_args(EngineName))
# Each engine's classes and the kind of engine (`engines.interface`) each implements; a new row names its own
IMPLEMENTATIONS: dict[str, tuple[tuple[str, type], ...]] = {
    "vllm": (("modelhost.engines.vllm:VllmModel", interface.StreamingEngine),),
    "llamacpp": (
        ("modelhost.engines.llamacpp:LlamaCppModel", interface.StreamingEngine),
        ("modelhost.engines.llamacpp_embeddings:LlamaCppEmbedder", interface.BatchEngine),
    ),
    "onnxruntime": (("modelhost.engines.encoders:OnnxRuntimeRunner", interface.Runner),),
    "openvino": (("modelhost.engines.encoders:OpenVinoRunner", interface.Runner),),
    # text generation on our own engine; its other tasks' handlers run torch themselves
    "transformers": (("modelhost.engines.native.engine:GenerationEngine", interface.Engine),),
}
# Modules another change owns for now, whose comparisons move to the table with it: the worker's
# `engine == "transformers"` (an encoder runtime chosen at load, or torch)


def test_every_engine_has_a_row_named_after_its_key() -> None:
    assert set(ENGINE_TABLE) == NAMES
    assert all(row.name == name for name, row in ENGINE_TABLE.items())
    assert get_args(EngineSetting) == (AUTO, *get_args(EngineName))


def test_the_engines_the_api_offers_are_the_rows() -> None:
    assert get_args(Engine) == ENGINES == (AUTO, *ENGINE_TABLE)
    assert set(get_args(EngineInUse)) == set(ENGINE_TABLE)


def test_the_engines_the_cli_and_the_console_offer_are_the_rows() -> None:
    assert tuple(choice.value for choice in CliEngine) == ENGINES
    deploy = (SOURCE / "console" / "static" / "js" / "deploy.js").read_text()
    found = re.search(r"export const ENGINES = \[([^\]]*)\]", deploy)
    assert found is not None
    assert tuple(re.findall(r'"([^"]+)"', found[1])) == ENGINES


def test_each_task_lists_its_engines_from_the_rows_the_fallback_last() -> None:
    for task in TASKS:
        assert task.engines == engines_for(task.name)
        assert task.engines[-1] == FALLBACK
    assert BY_NAME["text-generation"].engines == ("vllm", "llamacpp", "transformers")
    assert BY_NAME["feature-extraction"].engines == ("onnxruntime", "openvino", "llamacpp", "transformers")


def test_every_task_a_row_names_exists() -> None:
    for row in ENGINE_TABLE.values():
        assert set(row.tasks or ()) <= set(BY_NAME), row.name


def test_an_engine_with_a_worker_program_has_its_module_and_its_arguments() -> None:
    for row in ENGINE_TABLE.values():
        if row.worker is not None:
            assert importlib.util.find_spec(row.worker) is not None, row.worker
            assert row.worker in WORKER_ARGS, row.worker


def test_a_replica_that_chooses_at_load_has_a_row_of_its_own() -> None:
    assert spec(AUTO).measured_at_load
    assert spec(AUTO).worker is None


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each comparison with an engine's name as a literal: `x == "vllm"`,
    `x in ("auto", "llamacpp")`; a library's name (`library == "transformers"`) is not an engine's."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(side, ast.Name) and side.id == "library" for side in sides):
            continue
        for side in sides:
            items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            for item in items:
                if isinstance(item, ast.Constant) and item.value in NAMES:
                    found.append((node.lineno, item.value))
    return found


def test_no_module_outside_the_table_compares_an_engine_name() -> None:
    compared = []
    for path, tree in source_trees():
        relative = path.as_posix()
        if relative == "engine_table.py":
            continue
        for line, name in _compared_names(tree):
            compared.append(f"{relative}:{line} compares {name!r}")
    assert compared == [], "ask the engine's row (engine_table.spec) instead:\n" + "\n".join(compared)


def test_the_check_finds_a_comparison() -> None:
    source = 'if engine == "vllm" or asked in ("auto", "llamacpp") or library == "transformers":\n    pass\n'
    assert _compared_names(ast.parse(source)) == [(1, "vllm"), (1, "llamacpp")]


def _members(kind: type) -> set[str]:
    """What a Protocol of `engines.interface` asks for, its bases' included: methods, properties and
    annotated attributes."""
    kinds = [base for base in kind.__mro__ if base.__dict__.get("_is_protocol") and base is not Protocol]
    return {
        name
        for base in kinds
        for name in (*vars(base), *vars(base).get("__annotations__", {}))
        if not name.startswith("_")
    }


def _missing(cls: type, kind: type) -> set[str]:
    """The members of `kind` that `cls` (which declares it) leaves to the Protocol's empty stubs."""
    concrete = [base for base in cls.__mro__ if not base.__dict__.get("_is_protocol")]
    return {
        name
        for name in _members(kind)
        if not any(name in vars(base) or name in vars(base).get("__annotations__", {}) for base in concrete)
    }


def _implementation(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def test_every_engine_names_classes_that_implement_their_kind_of_engine() -> None:
    assert set(IMPLEMENTATIONS) == set(ENGINE_TABLE)
    for engine, implementations in IMPLEMENTATIONS.items():
        for path, kind in implementations:
            cls = _implementation(path)
            assert kind in cls.__mro__, f"{engine}: {path} does not declare {kind.__name__}"
            assert _missing(cls, kind) == set(), f"{engine}: {path} lacks part of {kind.__name__}"


def test_the_check_finds_a_member_an_engine_dropped() -> None:
    members = _members(interface.StreamingEngine)
    assert {"generate", "abort", "continues", "warm_up", "errored", "shutdown"} <= members
    assert {"add", "step", "abort", "vocab_size", "context_length"} <= _members(interface.Engine)

    class Forgetful(interface.StreamingEngine):
        async def generate(self, request_id: str, request: Any, emit: Any) -> None: ...

        async def warm_up(self) -> None: ...

        @property
        def errored(self) -> bool:
            return False

        def shutdown(self) -> None: ...

        def cache_usage(self) -> float | None:
            return None

        def continues(self, request: Any) -> bool:
            return False

    assert _missing(Forgetful, interface.StreamingEngine) == {"abort"}
