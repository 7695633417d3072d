"""Which model classes can serve which pipeline task, read from the libraries' own auto mappings.

Imported lazily (these modules pull in torch): the first inspection pays for it, once per process.
"""

from __future__ import annotations

from functools import cache

from modelhost.pipelines import TASKS

# The library tables whose architectures serve each task (declared with the task in modelhost.pipelines).
TRANSFORMERS_TASK_MAPPINGS: dict[str, tuple[str, ...]] = {
    t.name: t.transformers_mappings for t in TASKS if t.transformers_mappings
}
# diffusers AutoPipeline tables per task; a pipeline family present in the table can be loaded for it
# (e.g. a StableDiffusionPipeline folder loads as img2img and inpainting too).
DIFFUSERS_TASK_MAPPINGS: dict[str, str] = {t.name: t.diffusers_mapping for t in TASKS if t.diffusers_mapping}
# Text-to-video pipelines diffusers has no AutoPipeline entry for, loaded by their own class.
EXTRA_TEXT_TO_VIDEO = frozenset(
    {
        "TextToVideoSDPipeline",
        "CogVideoXPipeline",
        "HunyuanVideoPipeline",
        "MochiPipeline",
        "AnimateDiffPipeline",
    }
)

DIFFUSERS_TASKS = frozenset(DIFFUSERS_TASK_MAPPINGS)


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, str)]
    return []


TEXT_ONLY_TASKS = frozenset(t.name for t in TASKS if t.text_only)
# transformers' tables of models that read speech, audio or images: a class listed in one of them is not
# a text-only model, even where a text table lists it too
NON_TEXT_TABLE_WORDS = ("SPEECH", "AUDIO", "CTC", "VISION", "IMAGE", "VIDEO", "MULTIMODAL")


@cache
def transformers_architectures(task: str) -> frozenset[str]:
    from transformers.models.auto import modeling_auto

    found: set[str] = set()
    for table in TRANSFORMERS_TASK_MAPPINGS[task]:
        for model_type, value in getattr(modeling_auto, table, {}).items():
            if task not in TEXT_ONLY_TASKS or _reads_text_only(model_type):
                found.update(_names(value))
    if task in TEXT_ONLY_TASKS:
        found -= _non_text_architectures()
    return frozenset(found)


def _reads_text_only(model_type: str) -> bool:
    """A config with a `text_config` wraps a language model in another modality's encoder (Voxtral,
    Qwen2-Audio, Granite Speech): those need their audio or image, not text alone."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
    except KeyError:
        return False
    return "text_config" not in (getattr(config_class, "sub_configs", None) or {})


@cache
def _non_text_architectures() -> frozenset[str]:
    from transformers.models.auto import modeling_auto

    found: set[str] = set()
    for table in dir(modeling_auto):
        if table.endswith("_MAPPING_NAMES") and any(word in table for word in NON_TEXT_TABLE_WORDS):
            for value in getattr(modeling_auto, table).values():
                found.update(_names(value))
    return frozenset(found)


@cache
def known_model_types() -> frozenset[str]:
    from transformers.models.auto import configuration_auto

    names: dict[str, str] = getattr(configuration_auto, "CONFIG_MAPPING_NAMES")  # noqa: B009 - not re-exported
    return frozenset(names)


@cache
def diffusers_pipelines(task: str) -> frozenset[str]:
    """Pipeline class names that load for `task`: the AutoPipeline table of the task, plus every
    class of a family that table covers (so a text-to-image folder qualifies for img2img)."""
    from diffusers.pipelines import auto_pipeline

    table = getattr(auto_pipeline, DIFFUSERS_TASK_MAPPINGS[task])
    families = set(table)
    names = {cls.__name__ for cls in table.values()}
    for other_name in DIFFUSERS_TASK_MAPPINGS.values():
        for family, cls in getattr(auto_pipeline, other_name).items():
            if family in families:
                names.add(cls.__name__)
    if task == "text-to-video":
        names |= EXTRA_TEXT_TO_VIDEO
    return frozenset(names)


@cache
def library_has(library: str, class_name: str) -> bool:
    """Whether `library` (diffusers or transformers) defines `class_name` (no custom code)."""
    if library == "diffusers":
        import diffusers

        return hasattr(diffusers, class_name)
    if library == "transformers":
        import transformers

        return hasattr(transformers, class_name)
    return False
