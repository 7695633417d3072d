"""`deployments create` / `update`'s options for a generation deployment's own settings (docs/generation.md,
"Per-deployment settings"): its context length, a chat template file, default template arguments, the
tool and reasoning parsers, and what a token costs in its tenants' fair shares."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from modelhost.cli.output import out

MaxModelLen = Annotated[
    int | None,
    typer.Option(
        min=16,
        help="The context length the deployment runs with (at most the model's own); its KV cache and "
        "memory follow it.",
        show_default=False,
    ),
]
ChatTemplate = Annotated[
    Path | None,
    typer.Option(
        exists=True,
        dir_okay=False,
        help="A Jinja chat template file that replaces the artifact's (or gives a base model one).",
        show_default=False,
    ),
]
ChatTemplateKwargs = Annotated[
    str | None,
    typer.Option(
        help="Default chat template variables, a JSON object (such as '{\"enable_thinking\": false}'); a "
        "request's own win per key.",
        show_default=False,
    ),
]
ToolParser = Annotated[
    str | None,
    typer.Option(
        help="The tool-call parser, in place of the one detected (hermes, mistral, ...).", show_default=False
    ),
]
ReasoningParser = Annotated[
    str | None,
    typer.Option(
        help="The reasoning parser, in place of the one detected (qwen3, deepseek_r1, ...; none: off).",
        show_default=False,
    ),
]

FairTokenWeights = Annotated[
    str | None,
    typer.Option(
        metavar="PROMPT:OUTPUT",
        help="What a prompt token computed and an output token cost in its tenants' fair shares, such as "
        '1:2 (the default; docs/limits.md, "Fair shares of a generating model").',
        show_default=False,
    ),
]


class Setting(StrEnum):
    """`--reset`'s choices: the settings a deployment may go back to unset on."""

    max_model_len = "max_model_len"
    chat_template = "chat_template"
    chat_template_kwargs = "chat_template_kwargs"
    tool_parser = "tool_parser"
    reasoning_parser = "reasoning_parser"
    fair_token_weights = "fair_token_weights"


Reset = Annotated[
    list[Setting] | None,
    typer.Option(
        help="Unset a setting (repeatable): back to the artifact's own, or to what is detected.",
        show_default=False,
    ),
]


def settings_body(
    max_model_len: int | None,
    chat_template: Path | None,
    chat_template_kwargs: str | None,
    tool_parser: str | None,
    reasoning_parser: str | None,
    fair_token_weights: str | None = None,
    reset: list[Setting] | None = None,
) -> dict[str, Any]:
    """The settings given, as the API takes them (`--reset`'s as null)."""
    body: dict[str, Any] = {setting.value: None for setting in reset or []}
    if max_model_len is not None:
        body["max_model_len"] = max_model_len
    if chat_template is not None:
        body["chat_template"] = chat_template.read_text()
    if chat_template_kwargs is not None:
        try:
            body["chat_template_kwargs"] = json.loads(chat_template_kwargs)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="'--chat-template-kwargs'") from None
    if tool_parser is not None:
        body["tool_parser"] = tool_parser
    if reasoning_parser is not None:
        body["reasoning_parser"] = reasoning_parser
    if fair_token_weights is not None:
        body["fair_token_weights"] = _token_weights(fair_token_weights)
    return body


def _token_weights(given: str) -> dict[str, float]:
    """`--fair-token-weights 1:2` as the API's `{"prompt": 1, "output": 2}` (its range is the API's)."""
    prompt, colon, output = given.partition(":")
    try:
        if colon:
            return {"prompt": float(prompt), "output": float(output)}
    except ValueError:
        pass
    raise typer.BadParameter(f"{given!r} is not PROMPT:OUTPUT", param_hint="'--fair-token-weights'")


def show_settings(deployment: dict[str, Any]) -> None:
    """The generation settings set on the deployment, one line each (a chat template by its size)."""
    for name in Setting:
        value = deployment.get(name.value)
        if value in (None, {}):
            continue
        if name is Setting.chat_template:
            value = f"set ({len(value)} characters)"
        elif name is Setting.chat_template_kwargs:
            value = json.dumps(value)
        elif name is Setting.fair_token_weights:
            value = f"{value['prompt']:g}:{value['output']:g}"
        out.print(f"{name.value}: {value}", soft_wrap=True, markup=False, highlight=False)
