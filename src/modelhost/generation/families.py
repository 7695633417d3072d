"""The one table of model families: how each is recognised, and how its output is read.

A family is what a chat template teaches a model to write: its tool-call markup (a tool parser, in
`generation.tool_parsers`), whether and how it writes its reasoning apart (a reasoning parser, in
`generation.reasoning`), and the switch, if any, that turns its thinking on or off. The replica recognises
the family of the artifact it loads (`detect_family`: the chat template's text and the tokenizer's added
tokens) and says so on each request's `started` event; a deployment may name other parsers
(`tool_parser`, `reasoning_parser`). Standard library only: the gateway imports it without torch.

Order matters: the first family whose markers all appear wins, so a family whose markup contains
another's (Qwen3-Coder's `<function=` inside `<tool_call>`; GLM-4.5's template, which also has `<think>`
and `enable_thinking`, as Qwen3's) comes before it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Family:
    """One family. ``markers``: strings that all appear in its chat template or among its tokenizer's
    added tokens. ``thinking_switch``: the chat-template variable that turns thinking on and off
    (``enable_thinking``, ``thinking``), or ``reasoning_effort`` where the template takes effort levels,
    or None where thinking cannot be switched."""

    name: str
    markers: tuple[str, ...]
    tool_parser: str
    reasoning_parser: str | None = None
    thinking_switch: str | None = None
    examples: str = ""  # the published models of the family, for docs and errors


FAMILIES: tuple[Family, ...] = (
    Family(
        "gpt_oss", ("<|channel|>",), "harmony", "harmony", "reasoning_effort", "gpt-oss-20b, gpt-oss-120b"
    ),
    # GLM's template also says <tool_call>, <think> and enable_thinking: before Qwen3.
    Family("glm45", ("<arg_key>",), "glm45", "glm45", "enable_thinking", "GLM-4.5, GLM-4.6"),
    Family("qwen3_coder", ("<tool_call>", "<function="), "qwen3_xml", None, None, "Qwen3-Coder"),
    Family(
        "qwen3", ("<tool_call>", "<think>", "enable_thinking"), "hermes", "qwen3", "enable_thinking", "Qwen3"
    ),
    Family(
        "deepseek_v31",
        ("<｜tool▁calls▁begin｜>", "thinking"),
        "deepseek_v31",
        "deepseek_v3",
        "thinking",
        "DeepSeek-V3.1",
    ),
    Family(
        "deepseek_r1",
        ("<｜tool▁calls▁begin｜>", "<think>"),
        "deepseek_v3",
        "deepseek_r1",
        None,
        "DeepSeek-R1 and its distills",
    ),
    Family("deepseek_v3", ("<｜tool▁calls▁begin｜>",), "deepseek_v3", None, None, "DeepSeek-V3"),
    Family("kimi_k2", ("<|tool_calls_section_begin|>",), "kimi_k2", None, None, "Kimi K2"),
    # Granite 4's template also says <tool_call>: before Hermes.
    Family("granite", ("<|start_of_role|>",), "granite", "granite", "thinking", "Granite 3.x, Granite 4"),
    # Its published template lists tools in <|tool|>...<|/tool|> (vLLM's names "functools" instead, and
    # <|tool|> is among its added tokens).
    Family("phi4_mini", ("<|tool|>",), "phi4_mini", None, None, "Phi-4-mini"),
    # A template that writes <tool_call> is Hermes' even on a Llama 3 vocabulary (Hermes 3 and 4 are
    # Llama 3.1 fine-tunes): before Llama's rows, which also look at the added tokens.
    Family("qwen_think", ("<tool_call>", "<think>"), "hermes", "qwen3", None, "QwQ, Hermes 4"),
    Family("hermes", ("<tool_call>",), "hermes", None, None, "Qwen2.5, Hermes 2 Pro and 3"),
    Family("mistral", ("[TOOL_CALLS]",), "mistral", None, None, "Mistral, Mixtral, Ministral"),
    # Meta's zero-shot pythonic prompt ("[func_name1(params_name1=params_value1, ...)]"), as vLLM's
    # pythonic templates for Llama 3.2 and 4 write it.
    Family("pythonic", ("[func_name1(",), "pythonic", None, None, "Llama 3.2 / 4 with a pythonic template"),
    # Llama 4's published template asks for JSON calls ({"name": ..., "parameters": ...}), as 3.x's does.
    Family("llama4", ("<|header_start|>",), "llama3_json", None, None, "Llama 4"),
    Family("llama3", ("<|start_header_id|>",), "llama3_json", None, None, "Llama 3.1, 3.2, 3.3"),
    Family("default", (), "hermes", None, None, "every template with no other markers, and none"),
)

TOOL_PARSER_NAMES: frozenset[str] = frozenset(family.tool_parser for family in FAMILIES)
REASONING_PARSER_NAMES: frozenset[str] = frozenset(
    family.reasoning_parser for family in FAMILIES if family.reasoning_parser is not None
)


def detect_family(chat_template: str | None, added_tokens: Collection[str] = ()) -> Family:
    """The first family whose markers all appear in the template's text or among the added tokens;
    the last (`default`, no markers, read as Hermes) when none does, including a model without a template."""
    template = chat_template or ""
    tokens = set(added_tokens)
    for family in FAMILIES:
        if all(marker in template or marker in tokens for marker in family.markers):
            return family
    return FAMILIES[-1]


def family_named(name: str) -> Family | None:
    return next((family for family in FAMILIES if family.name == name), None)


def artifact_family(model_dir: Path, chat_template: str | None = None) -> Family:
    """The family of an artifact's files, as its replica will recognise it (`detect_family` on the
    tokenizer's template and added tokens), read from the files alone, so that the gateway can show it
    before any replica loads: `chat_template` (the deployment's own) else the artifact's
    (`chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`: its text, or the `default` of
    its named templates), and the added tokens of `tokenizer_config.json` and `tokenizer.json`."""
    config = _json(model_dir / "tokenizer_config.json")
    template = chat_template
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text(errors="replace")
    if template is None:
        named = config.get("chat_template")
        if isinstance(named, list):
            named = next(
                (t.get("template") for t in named if isinstance(t, dict) and t.get("name") == "default"), None
            )
        template = named if isinstance(named, str) else None
    decoder = config.get("added_tokens_decoder")
    tokens = (
        {t.get("content") for t in decoder.values() if isinstance(t, dict)}
        if isinstance(decoder, dict)
        else set()
    )
    added = _json(model_dir / "tokenizer.json").get("added_tokens")
    tokens |= {t.get("content") for t in added if isinstance(t, dict)} if isinstance(added, list) else set()
    return detect_family(template, {t for t in tokens if isinstance(t, str)})


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
