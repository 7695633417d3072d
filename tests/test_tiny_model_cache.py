"""The tiny models' cache (tests/recipes.py): built once per content, rebuilt when a model was changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import recipes


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stand in for the real build (seconds of torch): one file per build, counted."""
    made: list[Path] = []

    def build(out: Path) -> Path:
        (out / "model").mkdir(parents=True)
        (out / "model" / "weights.bin").write_bytes(b"weights")
        made.append(out)
        return out

    monkeypatch.setattr(recipes, "build_recipes", build)
    return made


def test_a_second_session_reuses_the_models_built_by_the_first(tmp_path: Path, builds: list[Path]) -> None:
    first = recipes.cached_recipes(tmp_path)
    assert recipes.cached_recipes(tmp_path) == first and len(builds) == 1
    assert (first / "model" / "weights.bin").read_bytes() == b"weights"


def test_a_model_changed_in_place_is_built_again(tmp_path: Path, builds: list[Path]) -> None:
    folder = recipes.cached_recipes(tmp_path)
    (folder / "model" / "weights.bin").write_bytes(b"damaged by a test")
    assert recipes.cached_recipes(tmp_path) == folder and len(builds) == 2
    assert (folder / "model" / "weights.bin").read_bytes() == b"weights"


def test_the_key_follows_the_builders_code_not_their_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = recipes.content_key()
    here = Path(recipes.__file__).parent
    shutil.copytree(here / "tiny_models", tmp_path / "tiny_models")
    copy = tmp_path / "recipes.py"
    copy.write_text(Path(recipes.__file__).read_text())
    monkeypatch.setattr(recipes, "__file__", str(copy))
    assert recipes.content_key() == before  # the same code elsewhere: the same models
    (tmp_path / "tiny_models" / "text.py").write_text((here / "tiny_models" / "text.py").read_text() + "#\n")
    assert recipes.content_key() != before


def test_the_key_follows_the_families_table_the_family_builder_checks_its_templates_against(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from modelhost.generation import families

    before = recipes.content_key()
    changed = tmp_path / "families.py"
    changed.write_text(Path(families.__file__).read_text() + "#\n")
    monkeypatch.setattr(families, "__file__", str(changed))
    assert recipes.content_key() != before
