"""The Responses API's hosted MCP items and their stream events (OpenAI's shapes), plain Python: a
response's `mcp_list_tools` items, the `mcp_call` (or `mcp_approval_request`) item that takes the place
of each function call the model made to an MCP tool, and which of the assembler's events are hidden
(the function-call events of those calls: the client sees the MCP item instead)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from modelhost.mcp.tools import CallOutcome
from modelhost.serving.responses.items import item_id

Item = dict[str, Any]
Event = dict[str, Any]


def listing(label: str, tools: list[Item]) -> Item:
    listed = [
        {
            "name": t["name"],
            "description": t["description"],
            "input_schema": t["input_schema"],
            "annotations": None,
        }
        for t in tools
    ]
    return {"id": item_id("mcpl"), "type": "mcp_list_tools", "server_label": label, "tools": listed}


def call_item(label: str, name: str, arguments: str, approval_request_id: str | None = None) -> Item:
    return {
        "id": item_id("mcp"),
        "type": "mcp_call",
        "status": "in_progress",
        "server_label": label,
        "name": name,
        "arguments": arguments,
        "output": None,
        "error": None,
        "approval_request_id": approval_request_id,
    }


def approval_item(identifier: str, label: str, name: str, arguments: str) -> Item:
    """An approval request; `identifier` is the one `McpTools.approval_id` signed, so that only the
    requests this server issued are honoured."""
    return {
        "id": identifier,
        "type": "mcp_approval_request",
        "server_label": label,
        "name": name,
        "arguments": arguments,
    }


def settle(item: Item, outcome: CallOutcome) -> None:
    """Put a call's outcome on its item, in OpenAI's shapes."""
    if outcome.error is None:
        item.update(status="completed", output=outcome.output)
    elif outcome.kind == "tool":
        error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": outcome.error}]}
        item.update(status="failed", error=error)
    else:
        item.update(
            status="failed", error={"type": "mcp_protocol_error", "code": -32603, "message": outcome.error}
        )


DENIED = CallOutcome(None, "The user denied this call.", "tool")


def opened_events(index: int, item: Item) -> list[Event]:
    """The events of an item as it is added: a listing and a call say they are in progress."""
    events = [_item_event("response.output_item.added", index, item)]
    common = {"item_id": item["id"], "output_index": index}
    if item["type"] == "mcp_list_tools":
        events.append({"type": "response.mcp_list_tools.in_progress", **common})
    elif item["type"] == "mcp_call":
        arguments = item["arguments"]
        events += [
            {"type": "response.mcp_call_arguments.delta", **common, "delta": arguments},
            {"type": "response.mcp_call_arguments.done", **common, "arguments": arguments},
            {"type": "response.mcp_call.in_progress", **common},
        ]
    return events


def closed_events(index: int, item: Item) -> list[Event]:
    """The events of an item once done (a call: completed or failed)."""
    common = {"item_id": item["id"], "output_index": index}
    events: list[Event] = []
    if item["type"] == "mcp_list_tools":
        events.append({"type": "response.mcp_list_tools.completed", **common})
    elif item["type"] == "mcp_call":
        done = "response.mcp_call.completed" if item["status"] == "completed" else "response.mcp_call.failed"
        events.append({"type": done, **common})
    events.append(_item_event("response.output_item.done", index, item))
    return events


@dataclass
class Hidden:
    """The function calls of one round that go to MCP tools: their events are not sent."""

    names: frozenset[str]
    ids: set[str] = field(default_factory=set)

    def visible(self, event: Event) -> bool:
        item = event.get("item")
        if item is not None and item.get("type") == "function_call":
            if event["type"] == "response.output_item.added" and item.get("name") in self.names:
                self.ids.add(item["id"])
            return item["id"] not in self.ids
        return event.get("item_id") not in self.ids


def _item_event(kind: str, index: int, item: Item) -> Event:
    return {"type": kind, "output_index": index, "item": json.loads(json.dumps(item))}


def added_usage(total: Item | None, more: Item) -> Item:
    """Two rounds' usage as one."""
    if total is None:
        return more
    return {
        "input_tokens": total["input_tokens"] + more["input_tokens"],
        "input_tokens_details": {
            "cached_tokens": total["input_tokens_details"]["cached_tokens"]
            + more["input_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": total["output_tokens"] + more["output_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": total["output_tokens_details"]["reasoning_tokens"]
            + more["output_tokens_details"]["reasoning_tokens"]
        },
        "total_tokens": total["total_tokens"] + more["total_tokens"],
    }
