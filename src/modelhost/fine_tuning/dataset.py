"""A fine-tuning dataset, checked line by line before a job is created (pure functions, no model).

A dataset is OpenAI's chat format, one conversation a line (JSONL)::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "...", "weight": 1}], "tools": [...]}

- `messages`: a list of `system`, `user`, `assistant` and `tool` messages, with at least one assistant
  message of weight 1: the tokens the job learns. `content` is text, or a list of text parts; an
  assistant message may carry `tool_calls` (its content may then be empty) and `weight` 0 or 1 (0: not
  learnt, only read as context; default 1);
- `tools`: optional, OpenAI's function tools, rendered by the base's chat template.

Every refusal is a `DatasetError` naming the line (1-based) and why, which the route answers as a 400
`invalid_training_file` (or `invalid_validation_file`). The tokens of a line are counted against the
base's context here as a lower bound (its messages' text alone, with the base's tokenizer); the trainer
counts them exactly with the chat template and fails the job naming the line if they do not fit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
MIN_EXAMPLES = 1
MAX_LINE_BYTES = 1024 * 1024


class DatasetError(ValueError):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"Line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Checked:
    """What a valid dataset holds: its conversations, in order, and the text tokens they carry."""

    conversations: list[dict[str, Any]]
    tokens: int


def check_dataset(
    data: bytes, count_tokens: Callable[[str], int] | None = None, context: int | None = None
) -> Checked:
    """Every line a valid conversation (module docstring), else `DatasetError` naming the first bad one.
    `count_tokens` and `context`: the base's tokenizer and context length, for the length check."""
    conversations: list[dict[str, Any]] = []
    tokens = 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES:
            raise DatasetError(number, f"the line is longer than {MAX_LINE_BYTES} bytes.")
        conversation = check_line(number, raw)
        if count_tokens is not None:
            counted = count_tokens(text_of(conversation))
            if context is not None and counted > context:
                raise DatasetError(
                    number,
                    f"the conversation has at least {counted} tokens, more than the base's context of "
                    f"{context} tokens.",
                )
            tokens += counted
        conversations.append(conversation)
    if len(conversations) < MIN_EXAMPLES:
        raise DatasetError(1, "the file holds no conversation (one JSON object a line).")
    return Checked(conversations, tokens)


def check_line(number: int, raw: bytes) -> dict[str, Any]:
    try:
        line = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise DatasetError(number, "not valid JSON.") from None
    if not isinstance(line, dict):
        raise DatasetError(number, "a line must be a JSON object with `messages`.")
    unknown = sorted(set(line) - {"messages", "tools", "parallel_tool_calls"})
    if unknown:
        raise DatasetError(number, f"unknown field `{unknown[0]}` (a line has `messages` and `tools`).")
    messages = line.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DatasetError(number, "`messages` must be a non-empty list.")
    tools = line.get("tools")
    if tools is not None:
        _check_tools(number, tools)
    learnt = False
    for index, message in enumerate(messages):
        learnt |= _check_message(number, index, message)
    if not learnt:
        raise DatasetError(number, "no assistant message with weight 1: nothing to learn.")
    return {"messages": messages, **({"tools": tools} if tools else {})}


def _check_message(number: int, index: int, message: Any) -> bool:
    """Whether the message is learnt (an assistant message of weight 1)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise DatasetError(number, f"{where} must be an object.")
    role = message.get("role")
    if role not in ROLES:
        raise DatasetError(number, f"{where}.role must be one of {', '.join(ROLES)}.")
    allowed = (
        {"role", "content", "name"}
        | ({"tool_calls", "weight", "refusal"} if role == "assistant" else set())
        | ({"tool_call_id"} if role == "tool" else set())
    )
    unknown = sorted(set(message) - allowed)
    if unknown:
        raise DatasetError(number, f"{where} has unknown field `{unknown[0]}`.")
    content = message.get("content")
    calls = message.get("tool_calls")
    if calls is not None:
        _check_calls(number, where, calls)
    if not _text_content(content) and not (role == "assistant" and calls):
        raise DatasetError(number, f"{where}.content must be text or a list of text parts.")
    weight = message.get("weight", 1)
    if role == "assistant" and weight not in (0, 1):
        raise DatasetError(number, f"{where}.weight must be 0 or 1.")
    return bool(role == "assistant" and weight == 1)


def _text_content(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content)
    return (
        isinstance(content, list)
        and bool(content)
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    )


def _check_calls(number: int, where: str, calls: Any) -> None:
    if not isinstance(calls, list) or not calls:
        raise DatasetError(number, f"{where}.tool_calls must be a non-empty list.")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DatasetError(number, f"{where}.tool_calls: each call needs function.name.")
        if not isinstance(function.get("arguments", ""), str | dict):
            raise DatasetError(number, f"{where}.tool_calls: arguments must be a JSON string.")


def _check_tools(number: int, tools: Any) -> None:
    if not isinstance(tools, list):
        raise DatasetError(number, "`tools` must be a list.")
    for tool in tools:
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(tool.get("function"), dict)
            or not isinstance(tool["function"].get("name"), str)
        ):
            raise DatasetError(number, "each tool must be {type: function, function: {name, ...}}.")


def text_of(conversation: dict[str, Any]) -> str:
    """The conversation's text (contents, tool calls, tools), for a lower bound of its tokens."""
    parts: list[str] = []
    for message in conversation["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content)
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps(call["function"]))
    return "\n".join(parts)


# ---------------------------------------------------------------- hyperparameters

# `auto` chosen from the dataset's size (docs/fine-tuning.md, "Hyperparameters")
TARGET_EXAMPLES_SEEN = 160  # epochs × examples aimed at, for small datasets
MAX_AUTO_EPOCHS = 25
MAX_EPOCHS = 50
MAX_BATCH = 64


def resolve(given: dict[str, Any], examples: int) -> dict[str, Any]:
    """`n_epochs`, `batch_size` and `learning_rate_multiplier` with every `auto` chosen:

    - batch size: about 0.2 % of the examples, between 1 and 8 (OpenAI's rule of thumb);
    - epochs: enough to see about TARGET_EXAMPLES_SEEN examples, between 1 and MAX_AUTO_EPOCHS
      (a small dataset is read many times, a large one once or twice);
    - learning-rate multiplier: 2 (of a base rate of 1e-3 for LoRA; docs say why)."""
    batch = given.get("batch_size", "auto")
    epochs = given.get("n_epochs", "auto")
    multiplier = given.get("learning_rate_multiplier", "auto")
    if batch == "auto":
        batch = max(1, min(8, round(examples * 0.002)))
    if epochs == "auto":
        epochs = max(1, min(MAX_AUTO_EPOCHS, -(-TARGET_EXAMPLES_SEEN // examples)))
    if multiplier == "auto":
        multiplier = 2.0
    return {"n_epochs": int(epochs), "batch_size": int(batch), "learning_rate_multiplier": float(multiplier)}


def steps_of(examples: int, hyperparameters: dict[str, Any]) -> int:
    """Optimizer steps of a job: batches per epoch × epochs (the last batch of an epoch may be short)."""
    batch = int(hyperparameters["batch_size"])
    return -(-examples // batch) * int(hyperparameters["n_epochs"])
