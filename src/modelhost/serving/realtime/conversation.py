"""A realtime session's conversation: its items in order, bounded, and the chat messages they make.

The items live in the session's memory only (nothing is stored): a session that ends forgets them. At
most `max_items` are kept; past that the oldest are dropped (OpenAI's truncation drops the oldest too)
and the client is told (`conversation.item.deleted`), so what it shows matches what the model reads.
"""

from __future__ import annotations

from typing import Any

from modelhost.errors import InvalidRequest
from modelhost.generation.choices import new_id
from modelhost.protocol.realtime import (
    ContentOut,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudio,
    InputText,
    Item,
    ItemIn,
    OutputAudio,
    OutputText,
)

ROOT = "root"  # `previous_item_id` that puts an item first


def item_id() -> str:
    return new_id("item")


def item_of(given: ItemIn) -> Item:
    """A client's item as the conversation keeps it (an ID given where it had none)."""
    ident = given.id or item_id()
    if isinstance(given, FunctionCallItem):
        return Item(
            id=ident, type="function_call", call_id=given.call_id, name=given.name, arguments=given.arguments
        )
    if isinstance(given, FunctionCallOutputItem):
        return Item(id=ident, type="function_call_output", call_id=given.call_id, output=given.output)
    parts = []
    for part in given.content:
        if isinstance(part, InputText):
            parts.append(ContentOut(type="input_text", text=part.text))
        elif isinstance(part, InputAudio):
            parts.append(ContentOut(type="input_audio", transcript=part.transcript))
        elif isinstance(part, OutputText):
            parts.append(ContentOut(type="output_text", text=part.text))
        elif isinstance(part, OutputAudio):
            parts.append(ContentOut(type="output_audio", transcript=part.transcript))
    return Item(id=ident, type="message", role=given.role, content=parts)


class Conversation:
    """The items of one session, in order."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.items: list[Item] = []

    def add(self, item: Item, previous_item_id: str | None = None) -> tuple[str | None, list[str]]:
        """Insert `item` after `previous_item_id` (None: at the end; `root`: first). Answers the ID of
        the item before it and the IDs of the oldest items dropped to stay within the bound."""
        if self.find(item.id) is not None:
            raise InvalidRequest(f"Item {item.id} already exists.", param="item.id", code="item_id_exists")
        if previous_item_id is None:
            position = len(self.items)
        elif previous_item_id == ROOT:
            position = 0
        else:
            found = self._index(previous_item_id, "previous_item_id")
            position = found + 1
        self.items.insert(position, item)
        dropped = []
        while len(self.items) > self.max_items:  # the oldest other than the new one
            dropped.append(self.items.pop(1 if self.items[0] is item else 0).id)
        index = self._index(item.id, "item.id")
        return (self.items[index - 1].id if index > 0 else None), dropped

    def find(self, ident: str) -> Item | None:
        return next((item for item in self.items if item.id == ident), None)

    def get(self, ident: str, param: str = "item_id") -> Item:
        return self.items[self._index(ident, param)]

    def delete(self, ident: str) -> None:
        del self.items[self._index(ident, "item_id")]

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def _index(self, ident: str, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == ident:
                return index
        raise InvalidRequest(
            f"Item with item_id not found: {ident[:128]}", param=param, code="item_not_found"
        )


def chat_messages(items: list[Item], instructions: str | None) -> list[dict[str, Any]]:
    """The chat messages the conversation makes, for the one generation pipeline: messages' text (typed
    text, and audio by its transcript), function calls as an assistant's `tool_calls` (consecutive calls
    in one message) and their outputs as `tool` messages. A message with no text yet (audio whose
    transcript failed) is left out."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        if item.type == "function_call":
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output or ""})
        else:
            text = "".join(part.text or part.transcript or "" for part in item.content or [])
            if text:
                messages.append({"role": item.role, "content": text})
    return messages
