"""The Responses API on the chat generation path: items in, a chat request out; engine events in,
output items and OpenAI's stream events out. Plain Python, no I/O.

A response is generated exactly as a chat completion (one engine, one constrained-decoding path): its
instructions, previous items and input become chat messages, its function tools and `text.format`
become chat tools and `response_format`, and `ChatChoice` assembles the model's text and tool calls.
Only the shapes differ: the output is a list of items (a `message` with `output_text`, then one
`function_call` item per call), streamed as typed events that each carry a `sequence_number`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from modelhost.errors import InvalidRequest
from modelhost.generation.choices import ChatChoice
from modelhost.generation.contract import GenerationEvent
from modelhost.generation.priority import applied_tier, numeric_priority
from modelhost.mcp.tools import McpRequest
from modelhost.protocol.chat import ChatCompletionRequest
from modelhost.protocol.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    FunctionToolChoice,
    ImagePart,
    McpApprovalResponseItem,
    McpOutputItem,
    McpTool,
    MediaPart,
    MessageItem,
    OtherItem,
    ReasoningItem,
    RefusalPart,
    ResponseCreateRequest,
)

Item = dict[str, Any]
Event = dict[str, Any]

# Fields that would need objects only OpenAI has (stored prompts): refused when set.
REFUSED = {
    "prompt": "Stored prompt templates are not available here; send the input itself.",
}


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# ---------------------------------------------------------------- input items


def input_items(given: str | list[Any], name: str = "input") -> list[Item]:
    """A request's input (or a conversation's added `items`: `name`) as stored items, each with an id,
    checked: 400s name `name[i]`."""
    if isinstance(given, str):
        return [_message("user", given)]
    items: list[Item] = []
    for index, item in enumerate(given):
        param = f"{name}[{index}]"
        if isinstance(item, MessageItem):
            items.append(_message_of(item.role, item.content, param))
        elif isinstance(item, FunctionCallItem):
            items.append(
                {
                    "id": item.id or item_id("fc"),
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                }
            )
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output if isinstance(item.output, str) else _text_of(item.output, param)
            items.append(
                {
                    "id": item_id("fco"),
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": output,
                    "status": "completed",
                }
            )
        elif isinstance(item, ReasoningItem):
            text = "".join(part.text for part in item.content or [] if part.type == "reasoning_text")
            items.append(_reasoning(item.id or item_id("rs"), text, "completed"))
        elif isinstance(item, McpApprovalResponseItem):
            items.append(
                {
                    "id": item.id or item_id("mcpr"),
                    "type": "mcp_approval_response",
                    "approval_request_id": item.approval_request_id,
                    "approve": item.approve,
                    "reason": item.reason,
                }
            )
        elif isinstance(item, McpOutputItem):
            items.append({"id": item_id("mcp"), **item.model_dump(exclude_none=True)})
        elif isinstance(item, OtherItem):
            raise InvalidRequest(
                f"Input items of type {item.type!r} are not supported here: send messages, function_call "
                "and function_call_output items (docs/responses.md).",
                param=param,
            )
    return items


def _reasoning(identifier: str, text: str, status: str) -> Item:
    """A reasoning item in OpenAI's open-weight form: the text whole, no summary."""
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": identifier, "type": "reasoning", "summary": [], "content": content, "status": status}


def _message(role: str, text: str) -> Item:
    return {
        "id": item_id("msg"),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": "output_text" if role == "assistant" else "input_text", "text": text}],
    }


def _message_of(role: str, content: str | list[Any], param: str) -> Item:
    """A message item; one with `input_image` parts keeps its parts in order (the text of each other
    part as `input_text`), for a vision-language deployment to read."""
    if isinstance(content, str) or not any(isinstance(part, ImagePart) for part in content):
        return _message(role, _text_of(content, param))
    parts: list[Item] = []
    for index, part in enumerate(content):
        if isinstance(part, ImagePart):
            if not part.image_url:
                raise InvalidRequest(
                    "Uploaded files (file_id) are not available here: send the image as image_url, an "
                    "http(s) URL or a data: URI.",
                    param=f"{param}.content[{index}].image_url",
                )
            detail = part.detail or "auto"
            parts.append({"type": "input_image", "image_url": part.image_url, "detail": detail})
        else:
            parts.append({"type": "input_text", "text": _text_of([part], param)})
    return {**_message(role, ""), "content": parts}


def _text_of(content: str | list[Any], param: str) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part in content:
        if isinstance(part, (MediaPart, ImagePart)):
            raise InvalidRequest(
                f"{part.type} parts are not supported here (images: in messages, on an "
                "image-text-to-text deployment).",
                param=param,
            )
        texts.append(part.refusal if isinstance(part, RefusalPart) else part.text)
    return "\n".join(texts)


# ---------------------------------------------------------------- the chat request


def chat_request(
    body: ResponseCreateRequest, items: list[Item], mcp_functions: list[Item] | None = None
) -> ChatCompletionRequest:
    """The chat completion that generates this response: `items` are the chain so far plus this input
    (and, in a later MCP round, this response's output so far); `mcp_functions`: the MCP servers' tools
    offered this round, as chat functions."""
    for name, reason in REFUSED.items():
        if getattr(body, name) is not None:
            raise InvalidRequest(reason, param=name)
    messages: list[Item] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    messages += chat_messages(items)
    tools = _tools(body) + (mcp_functions or [])
    fields: dict[str, Any] = {
        "reasoning_effort": body.reasoning.effort if body.reasoning else None,
        "model": body.model,
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(body) if tools else None,
        "max_completion_tokens": body.max_output_tokens,
        "min_tokens": body.min_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "stop_token_ids": body.stop_token_ids,
        "ignore_eos": body.ignore_eos,
        "include_stop_str_in_output": body.include_stop_str_in_output,
        "skip_special_tokens": body.skip_special_tokens,
        "chat_template_kwargs": body.chat_template_kwargs,
        "structured_outputs": body.structured_outputs,
        "logprobs": _wants_logprobs(body) or None,
        "top_logprobs": body.top_logprobs if _wants_logprobs(body) else None,
        "response_format": _response_format(body),
        # the replica its prompt's prefix is cached on (runtime.gateway.routing); a chain's turns keep
        # their first ones, so without either they stay together by their prompt's prefix
        "prompt_cache_key": body.prompt_cache_key,
        "user": body.user,
        "service_tier": body.service_tier,
        "cache_salt": body.cache_salt,
    }
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:  # e.g. an empty conversation: reported on the input
        first = exc.errors()[0]
        raise InvalidRequest(f"The input cannot be generated from: {first['msg']}.", param="input") from None


def _wants_logprobs(body: ResponseCreateRequest) -> bool:
    return "message.output_text.logprobs" in (body.include or []) or bool(body.top_logprobs)


def chat_messages(items: list[Item]) -> list[Item]:
    """Stored items → chat messages: consecutive function calls join the assistant message before them
    (as one assistant turn with tool calls), each output answers its call as a tool message, and a
    reasoning item is the `reasoning_content` of the assistant turn that follows it."""
    messages: list[Item] = []
    thought = ""  # a reasoning item's text, waiting for its assistant turn
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            thought += "".join(part["text"] for part in item["content"])
            continue
        if kind == "message" and any(part["type"] == "input_image" for part in item["content"]):
            parts = [
                {"type": "image_url", "image_url": {"url": part["image_url"]}}
                if part["type"] == "input_image"
                else {"type": "text", "text": part["text"]}
                for part in item["content"]
            ]
            messages.append({"role": item["role"], "content": parts})
        elif kind == "message":
            text = "\n".join(part["text"] for part in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "mcp_call":  # a call made here: the model's call, then its result (or error)
            call = {
                "id": item["id"],
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if thought:
                messages[-1].setdefault("reasoning_content", thought)
            answer = (
                item.get("output") if item.get("error") is None else f"Error: {_error_text(item['error'])}"
            )
            messages.append({"role": "tool", "tool_call_id": item["id"], "content": answer or ""})
        else:  # MCP listings, approval requests and answers: not part of the conversation
            continue
        if thought and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("reasoning_content", thought)
        thought = ""
    return messages


def _error_text(error: Any) -> str:
    """An `mcp_call`'s error as the model reads it."""
    if isinstance(error, dict):
        if error.get("message"):
            return str(error["message"])
        parts = error.get("content") or []
        return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)) or json.dumps(error)
    return str(error)


# Headers the HTTP client and the MCP transport set themselves (a caller's would confuse the exchange)
_TRANSPORT_HEADERS = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
}


def mcp_requests(body: ResponseCreateRequest) -> list[McpRequest]:
    """The request's MCP servers (`tools` of type `mcp`), checked: 400s name the tool's field."""
    requests: list[McpRequest] = []
    for index, tool in enumerate(body.tools or []):
        if not isinstance(tool, McpTool):
            continue
        param = f"tools[{index}]"
        for name in ("connector_id", "tunnel_id"):
            if getattr(tool, name) is not None:
                raise InvalidRequest(
                    "OpenAI's connectors and tunnels are not available here: give server_url.",
                    param=f"{param}.{name}",
                )
        if not tool.server_url:
            raise InvalidRequest("An MCP tool needs its server_url.", param=f"{param}.server_url")
        headers = dict(tool.headers or {})
        for name in headers:
            if name.lower() in _TRANSPORT_HEADERS:
                raise InvalidRequest(
                    f"The header {name!r} is the MCP transport's own: it cannot be set.",
                    param=f"{param}.headers",
                )
        if tool.authorization:
            headers["Authorization"] = f"Bearer {tool.authorization}"
        allowed = tool.allowed_tools
        if allowed is not None and not isinstance(allowed, list):
            if allowed.read_only is not None:
                raise InvalidRequest(
                    "read_only filters are not available here: list tool_names.",
                    param=f"{param}.allowed_tools.read_only",
                )
            allowed = allowed.tool_names
        requests.append(
            McpRequest(
                label=tool.server_label,
                url=tool.server_url,
                headers=headers,
                allowed=frozenset(allowed) if allowed is not None else None,
                approval=_approval(tool, param),
                param=f"{param}.server_url",
            )
        )
    return requests


def _approval(tool: McpTool, param: str) -> Any:
    """Whether a tool's call waits for approval: "always" (OpenAI's default), "never", or per tool (a
    tool named in neither list waits)."""
    rule = tool.require_approval
    if rule is None or rule == "always":
        return lambda name: True
    if rule == "never":
        return lambda name: False
    for kind in ("always", "never"):
        chosen = getattr(rule, kind)
        if chosen is not None and chosen.read_only is not None:
            raise InvalidRequest(
                "read_only filters are not available here: list tool_names.",
                param=f"{param}.require_approval.{kind}.read_only",
            )
    never = set(rule.never.tool_names or []) if rule.never else set()
    always = set(rule.always.tool_names or []) if rule.always else set()
    return lambda name: name in always or name not in never


def _tools(body: ResponseCreateRequest) -> list[Item]:
    tools: list[Item] = []
    for index, tool in enumerate(body.tools or []):
        if isinstance(tool, McpTool):
            continue  # offered as the functions its server lists (`mcp_requests`)
        if not isinstance(tool, FunctionTool):
            raise InvalidRequest(
                f"Only function tools are supported here; {tool.type!r} is one of OpenAI's hosted tools.",
                param=f"tools[{index}]",
            )
        definition = tool.model_dump(exclude_none=True, exclude={"type"})
        tools.append({"type": "function", "function": definition})
    return tools


def _tool_choice(body: ResponseCreateRequest) -> Any:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    raise InvalidRequest(
        f"tool_choice of type {choice.type!r} is not supported here: use none, auto, required or "
        '{"type": "function", "name": ...}.',
        param="tool_choice",
    )


def _response_format(body: ResponseCreateRequest) -> Item | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.name is None:
        raise InvalidRequest("text.format of type json_schema needs a name.", param="text.format.name")
    schema = {"name": fmt.name, "schema": fmt.schema_, "description": fmt.description, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def settings_of(body: ResponseCreateRequest) -> Item:
    """What a response object echoes of its request."""
    text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text else {}
    return {
        "instructions": body.instructions,
        "tools": [t.model_dump(exclude_none=True, exclude=_SECRETS) for t in body.tools or []],
        "tool_choice": _echoed_tool_choice(body),
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "text": {"format": {"type": "text"}, **text},
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "reasoning": _reasoning_settings(body),
        "store": body.store is not False,
        "user": body.user,
        "service_tier": applied_tier(numeric_priority(body.service_tier, None), body.service_tier == "flex"),
        "conversation": {"id": conversation} if (conversation := conversation_id(body)) else None,
    }


def conversation_id(body: ResponseCreateRequest) -> str | None:
    """The `conversation` a response continues: its ID, or an object with its `id` (OpenAI's two forms)."""
    given = body.conversation
    if given is None or isinstance(given, str):
        return given
    if not isinstance(given.get("id"), str):
        raise InvalidRequest("conversation: give its ID, or an object with its `id`.", param="conversation")
    identifier: str = given["id"]
    return identifier


_SECRETS = {"headers", "authorization"}  # an MCP tool's tokens: sent to its server, never stored


def _reasoning_settings(body: ResponseCreateRequest) -> Item:
    """`reasoning` as OpenAI echoes it: the effort asked for, and the summary (never made here)."""
    given = body.reasoning
    if given is None:
        return {"effort": None, "summary": None}
    return {"effort": given.effort, "summary": given.summary or given.generate_summary}


def _echoed_tool_choice(body: ResponseCreateRequest) -> Any:
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


# ---------------------------------------------------------------- the output, as it is generated


@dataclass
class OutputAssembler:
    """One response's output items, fed the engine's events through a `ChatChoice`; each feed answers
    the stream events it produced (without sequence numbers: the writer numbers them)."""

    choice: ChatChoice
    output: list[Item] = field(default_factory=list)  # shared by the rounds of a response with MCP tools
    _reasoning: Item | None = None  # the open reasoning item
    _message: Item | None = None  # the open message item
    _calls: dict[int, Item] = field(default_factory=dict)  # open function_call items by call index
    _pending: list[Item] = field(default_factory=list)  # logprobs waiting for their text

    def feed(self, event: GenerationEvent) -> list[Event]:
        delta = self.choice.feed(event)
        events: list[Event] = []
        self._pending += _logprobs(delta.get("logprobs") or [])  # they come before their token's text
        if delta.get("reasoning"):
            events += self._thought(delta["reasoning"])
        if (delta.get("content") or delta.get("tool_calls")) and self._reasoning is not None:
            events += self._close_reasoning("completed")
        if delta.get("content"):
            logprobs, self._pending = self._pending, []
            events += self._text(delta["content"], logprobs)
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        return events

    def finish(self) -> list[Event]:
        """Close every open item: completed, or incomplete when the token budget ran out."""
        status = "incomplete" if self.choice.finish == "length" else "completed"
        events: list[Event] = []
        if self._reasoning is not None:
            events += self._close_reasoning(status)
        if not self.output:  # the model ended at once: an empty message, as OpenAI answers, not no output
            events += self._open_message()
        if self._message is not None:
            events += self._close_message(status)
        for index in sorted(self._calls):
            events += self._close_call(self._calls[index], status)
        self._calls.clear()
        return events

    @property
    def incomplete_reason(self) -> str | None:
        return "max_output_tokens" if self.choice.finish == "length" else None

    def usage(self) -> Item:
        output_tokens = self.choice.completion_tokens
        return {
            "input_tokens": self.choice.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.choice.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.choice.reasoning_tokens},
            "total_tokens": self.choice.prompt_tokens + output_tokens,
        }

    def _thought(self, piece: str) -> list[Event]:
        """A piece of reasoning: the reasoning item opens before the answer's message and calls."""
        events: list[Event] = []
        if self._reasoning is None:
            self._reasoning = _reasoning(item_id("rs"), "", "in_progress")
            self.output.append(self._reasoning)
            index = len(self.output) - 1
            events.append(_item_event("response.output_item.added", index, self._reasoning))
            events.append(
                {
                    "type": "response.content_part.added",
                    "item_id": self._reasoning["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": {"type": "reasoning_text", "text": ""},
                }
            )
        self._reasoning["content"][0]["text"] += piece
        events.append(
            {
                "type": "response.reasoning_text.delta",
                "item_id": self._reasoning["id"],
                "output_index": self.output.index(self._reasoning),
                "content_index": 0,
                "delta": piece,
            }
        )
        return events

    def _close_reasoning(self, status: str) -> list[Event]:
        item, self._reasoning = self._reasoning, None
        assert item is not None
        item["status"] = status
        index = self.output.index(item)
        text = item["content"][0]["text"]
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            {"type": "response.reasoning_text.done", **common, "text": text},
            {
                "type": "response.content_part.done",
                **common,
                "part": {"type": "reasoning_text", "text": text},
            },
            _item_event("response.output_item.done", index, item),
        ]

    def _text(self, piece: str, logprobs: list[Item]) -> list[Event]:
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        self._message["content"][0]["text"] += piece
        self._message["content"][0]["logprobs"] += logprobs
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": self._message["id"],
                "output_index": self.output.index(self._message),
                "content_index": 0,
                "delta": piece,
                "logprobs": logprobs,
            }
        )
        return events

    def _open_message(self) -> list[Event]:
        message: Item = {
            "id": item_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
        }
        part = {"type": "output_text", "text": "", "annotations": []}
        message["content"] = [{**part, "logprobs": []}]
        self._message = message
        index = len(self.output)
        self.output.append(message)
        added = {
            "type": "response.content_part.added",
            "item_id": message["id"],
            "output_index": index,
            "content_index": 0,
            "part": part,
        }
        return [_item_event("response.output_item.added", index, {**message, "content": []}), added]

    def _close_message(self, status: str) -> list[Event]:
        message, self._message = self._message, None
        assert message is not None
        index = self.output.index(message)
        part = message["content"][0]
        message["status"] = status
        common = {"item_id": message["id"], "output_index": index, "content_index": 0}
        done_part = {"type": "output_text", "text": part["text"], "annotations": []}
        return [
            {
                "type": "response.output_text.done",
                **common,
                "text": part["text"],
                "logprobs": part.get("logprobs", []),
            },
            {"type": "response.content_part.done", **common, "part": done_part},
            _item_event("response.output_item.done", index, message),
        ]

    def _call(self, delta: Item) -> list[Event]:
        events: list[Event] = []
        index = delta["index"]
        item = self._calls.get(index)
        function = delta.get("function") or {}
        if item is None:
            if self._message is not None:
                events += self._close_message("completed")
            item = {
                "id": item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta.get("id") or item_id("call"),
                "name": function.get("name", ""),
                "arguments": "",
            }
            self._calls[index] = item
            self.output.append(item)
            events.append(_item_event("response.output_item.added", len(self.output) - 1, item))
        piece = function.get("arguments") or ""
        if piece:
            item["arguments"] += piece
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": self.output.index(item),
                    "delta": piece,
                }
            )
        return events

    def _close_call(self, item: Item, status: str) -> list[Event]:
        index = self.output.index(item)
        item["status"] = status
        return [
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "name": item["name"],
                "arguments": item["arguments"],
            },
            _item_event("response.output_item.done", index, item),
        ]


def _item_event(kind: str, index: int, item: Item) -> Event:
    return {"type": kind, "output_index": index, "item": json.loads(json.dumps(item))}  # a snapshot


def _logprobs(entries: list[Item]) -> list[Item]:
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "bytes": e.get("bytes", []),
            "top_logprobs": e.get("top_logprobs", []),
        }
        for e in entries
    ]


def image_params(body: ResponseCreateRequest, context: list[Item]) -> list[str]:
    """The field each image of the generated chat came from, in its order: the chain's images (from
    `previous_response_id`), then this input's `input[i].content[j].image_url`."""
    params = [
        "previous_response_id"
        for item in context
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "input_image"
    ]
    for index, item in enumerate([] if isinstance(body.input, str) else body.input):
        if isinstance(item, MessageItem) and isinstance(item.content, list):
            params += [
                f"input[{index}].content[{j}].image_url"
                for j, part in enumerate(item.content)
                if isinstance(part, ImagePart)
            ]
    return params
