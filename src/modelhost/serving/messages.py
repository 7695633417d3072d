"""The Anthropic Messages API on the chat generation path (`POST /v1/messages`,
`POST /v1/messages/count_tokens`; docs/messages.md).

A second wire format over the same generation as chat completions: a Messages request becomes a chat
completion request (`chat_request`: system blocks → a system message, content blocks → chat messages and
parts, tools and `tool_choice` → chat tools, `thinking` → the family's reasoning switch), which
`generation.choices` turns into the engine request exactly as for `/v1/chat/completions`; `ChatChoice`
assembles the model's reasoning, text and tool calls, and `MessageAssembler` turns its deltas into
Anthropic's content blocks and stream events. Only the shapes differ.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from modelhost.errors import InvalidRequest, ModelhostError, anthropic_body
from modelhost.frontend import Generation, Streams, Target, Until
from modelhost.generation.choices import ChatChoice, tokenize_request
from modelhost.generation.contract import GenerationEvent, Tokenized
from modelhost.mcp.tools import MAX_ROUNDS, McpRequest, McpTools, Toolset
from modelhost.protocol.chat import ChatCompletionRequest, TokenizeChatRequest
from modelhost.protocol.messages import (
    CountTokensRequest,
    ImageBlock,
    McpToolResultBlock,
    McpToolUseBlock,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from modelhost.serving.chat import chat_choices

Event = dict[str, Any]
Answer = Event | AsyncIterator[bytes]
# `thinking.budget_tokens` → an effort level, for the families whose switch takes levels (gpt-oss's);
# on/off switches read any level as on (`generation.reasoning.THINKS`).
EFFORT_BUDGETS = ((4096, "low"), (16384, "medium"))
STANDARD = "standard"  # Anthropic's name for the default tier, the one every Messages request runs in


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


# ---------------------------------------------------------------- the request


@dataclass
class Translated:
    """A Messages request as a chat completion request, and the field each of its images came from."""

    chat: ChatCompletionRequest
    image_params: list[str] = field(default_factory=list)


def chat_request(body: CountTokensRequest, mcp_functions: list[Event] | None = None) -> Translated:
    """The chat completion that generates this message (`mcp_functions`: the MCP connector's tools, as
    chat functions). 400s name the Anthropic field at fault."""
    if isinstance(body, MessagesRequest) and body.container is not None:
        raise InvalidRequest("Code-execution containers are not available here.", param="container")
    messages: list[Event] = []
    system = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system or [])
    if system:
        messages.append({"role": "system", "content": system})
    params: list[str] = []
    for index, message in enumerate(body.messages):
        messages += _chat_messages(message.role, message.content, f"messages[{index}]", params)
    tools = _tools(body) + (mcp_functions or [])
    fields: Event = {
        "model": body.model,
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(body, tools),
        "parallel_tool_calls": False
        if body.tool_choice and body.tool_choice.disable_parallel_tool_use
        else None,
        "reasoning_effort": reasoning_effort(body),
        "response_format": _response_format(body),
    }
    if isinstance(body, MessagesRequest):
        fields.update(
            max_tokens=body.max_tokens,
            stop=body.stop_sequences or None,
            # the stop sequence stays in the text, where `StopSequences` finds which one ended it
            include_stop_str_in_output=True if body.stop_sequences else None,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            user=body.metadata.user_id if body.metadata else None,
        )
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(
            f"The messages cannot be generated from: {first['msg']}.", param="messages"
        ) from None
    return Translated(chat, params)


def _chat_messages(role: str, content: str | list[Any], param: str, image_params: list[str]) -> list[Event]:
    """One Anthropic message → chat messages. An assistant turn: its thinking as `reasoning_content`, its
    text, its `tool_use` blocks as tool calls. A user turn: each `tool_result` as a tool message (in
    order, first, as a chat template expects them right after the calls), then the rest (text, images,
    and the images of tool results, which chat templates cannot place in a tool message) as one user
    message. `image_params` receives the field of each image in the order the chat will hold them."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return _assistant_turns(content)
    results: list[Event] = []
    parts: list[Event] = []
    part_params: list[tuple[int, str]] = []  # (position in parts, field) of each image
    for index, block in enumerate(content):
        where = f"{param}.content[{index}]"
        if isinstance(block, ToolResultBlock):
            text, images = _result_of(block, where)
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
            for image, image_param in images:
                part_params.append((len(parts), image_param))
                parts.append(_image_part(image))
        elif isinstance(block, ImageBlock):
            part_params.append((len(parts), f"{where}.source"))
            parts.append(_image_part(block))
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(
            block, (ThinkingBlock, RedactedThinkingBlock, ToolUseBlock, McpToolUseBlock, McpToolResultBlock)
        ):
            raise InvalidRequest(f"A user message cannot hold {block.type} blocks.", param=where)
    image_params += [p for _, p in sorted(part_params)]
    if not parts:
        return results
    if not part_params:  # text alone: one string, as chat templates render best
        return [*results, {"role": "user", "content": "\n".join(p["text"] for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _assistant_turns(content: list[Any]) -> list[Event]:
    """An assistant message; one holding the MCP connector's calls and results is one assistant turn
    per round (its calls), each followed by its results as tool messages."""
    turns: list[Event] = []
    blocks: list[Any] = []
    for block in content:
        if isinstance(block, McpToolResultBlock):
            if blocks:
                turns.append(_assistant(blocks))
                blocks = []
            given = block.content
            text = given if isinstance(given, str) else "\n".join(b.text for b in given or [])
            text = f"Error: {text}" if block.is_error else text
            turns.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
        else:
            blocks.append(block)
    if blocks or not turns:
        turns.append(_assistant(blocks))
    return turns


def _assistant(content: list[Any]) -> Event:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[Event] = []
    for block in content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock | McpToolUseBlock):
            function = {"name": block.name, "arguments": json.dumps(block.input)}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ImageBlock | ToolResultBlock | McpToolResultBlock):
            raise InvalidRequest(f"An assistant message cannot hold {block.type} blocks.", param="messages")
        # redacted_thinking: Anthropic's encrypted reasoning, which no model here can read
    message: Event = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _result_of(block: ToolResultBlock, param: str) -> tuple[str, list[tuple[ImageBlock, str]]]:
    """A tool result's text (`Error: ` before it where `is_error`) and its images with their fields."""
    content = block.content or ""
    if isinstance(content, str):
        text, images = content, []
    else:
        text = "\n".join(b.text for b in content if isinstance(b, TextBlock))
        images = [
            (b, f"{param}.content[{i}].source") for i, b in enumerate(content) if isinstance(b, ImageBlock)
        ]
    return (f"Error: {text}" if block.is_error else text), images


def _image_part(block: ImageBlock) -> Event:
    """An image as a chat `image_url` part: base64 data as a `data:` URI, read by the one media reader."""
    source = block.source
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def mcp_requests(body: CountTokensRequest) -> list[McpRequest]:
    """The MCP connector's servers (`mcp_servers`), those whose tools are enabled: no approval step
    (Anthropic's connector calls the tools the model chooses)."""
    requests: list[McpRequest] = []
    for index, server in enumerate(body.mcp_servers or []):
        config = server.tool_configuration
        if config is not None and config.enabled is False:
            continue
        token = server.authorization_token
        allowed = config.allowed_tools if config is not None else None
        requests.append(
            McpRequest(
                label=server.name,
                url=server.url,
                headers={"Authorization": f"Bearer {token}"} if token else {},
                allowed=frozenset(allowed) if allowed is not None else None,
                approval=lambda name: False,
                param=f"mcp_servers[{index}].url",
            )
        )
    return requests


def _tools(body: CountTokensRequest) -> list[Event]:
    tools: list[Event] = []
    for index, tool in enumerate(body.tools or []):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"Anthropic's server tool {tool.type!r} is not available here: define client tools with "
                "name, description and input_schema.",
                param=f"tools[{index}]",
            )
        if tool.input_schema is None:
            raise InvalidRequest("A tool needs input_schema.", param=f"tools[{index}].input_schema")
        function = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tools


def _tool_choice(body: CountTokensRequest, tools: list[Event]) -> Any:
    choice = body.tool_choice
    if choice is None:
        return None
    if not tools:
        if choice.type == "none":
            return None
        raise InvalidRequest("tool_choice needs tools.", param="tool_choice")
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest(
                'tool_choice of type "tool" needs the name of a tool.', param="tool_choice.name"
            )
        if choice.name not in {t["function"]["name"] for t in tools}:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not in tools.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def reasoning_effort(body: CountTokensRequest) -> str | None:
    """`thinking` (and `output_config.effort`) as the chat request's reasoning effort, which the replica
    maps onto the family's switch: `disabled` → `none` (off); `enabled` → an effort level chosen by its
    `budget_tokens` (`EFFORT_BUDGETS`; any level is "on" for an on/off switch); `adaptive` → the given
    `output_config.effort`, else `medium`. Unset: the model's default."""
    effort = body.output_config.effort if body.output_config else None
    thinking = body.thinking
    if thinking is None:
        return effort
    if thinking.type == "disabled":
        return "none"
    if thinking.type == "adaptive" or thinking.budget_tokens is None:
        return effort or "medium"
    return next((level for below, level in EFFORT_BUDGETS if thinking.budget_tokens < below), "high")


def _response_format(body: CountTokensRequest) -> Event | None:
    fmt = body.output_config.format if body.output_config else None
    if fmt is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_, "strict": True}}


# ---------------------------------------------------------------- the answer


@dataclass
class StopSequences:
    """Finds the stop sequence that ended the text (the engine keeps it in the text for this) and keeps
    it out of the answer: text that may be the start of one is held back until the next piece says."""

    sequences: list[str]
    held: str = ""
    matched: str | None = None

    def feed(self, piece: str) -> str:
        text = self.held + piece
        ends = (n for s in self.sequences for n in range(1, len(s) + 1) if text.endswith(s[:n]))
        keep = max(ends, default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self) -> str:
        """The text held back, less the stop sequence that ends it."""
        text, self.held = self.held, ""
        for sequence in self.sequences:
            if text.endswith(sequence):
                self.matched = sequence
                return text[: -len(sequence)]
        return text


@dataclass
class MessageAssembler:
    """One message's content blocks, fed the engine's events through a `ChatChoice`; each feed answers
    the Anthropic stream events it produced (`content_block_start` / `_delta` / `_stop`)."""

    choice: ChatChoice
    stops: StopSequences
    content: list[Event] = field(default_factory=list)
    _open: Event | None = None  # the block being written
    _calls: dict[int, Event] = field(default_factory=dict)  # tool_use blocks by call index
    _arguments: dict[int, str] = field(default_factory=dict)  # their input JSON so far

    def feed(self, event: GenerationEvent) -> list[Event]:
        delta = self.choice.feed(event)
        events: list[Event] = []
        if delta.get("reasoning_content"):
            events += self._piece("thinking", delta["reasoning_content"])
        text = self.stops.feed(delta.get("content") or "")
        if self.choice.finish is not None:
            text += self.stops.finish()
        if text:
            events += self._piece("text", text)
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        if self.choice.finish is not None:
            events += self._close()
        return events

    @property
    def stop_reason(self) -> str:
        if self.choice.finish == "length":
            return "max_tokens"
        if self._calls:
            return "tool_use"
        return "stop_sequence" if self.stops.matched is not None else "end_turn"

    def usage(self) -> Event:
        """Anthropic's usage: `input_tokens` are the prompt tokens computed for this request, those the
        engine's prefix cache gave are `cache_read_input_tokens` (their sum is the prompt)."""
        return {
            "input_tokens": self.choice.prompt_tokens - self.choice.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.choice.cached_tokens,
            "output_tokens": self.choice.completion_tokens,
        }

    def message(self, head: Event) -> Event:
        return {
            **head,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stops.matched,
            "usage": {**self.usage(), "service_tier": STANDARD},
        }

    def _piece(self, kind: str, piece: str) -> list[Event]:
        """A piece of thinking or text: into the open block of its kind, or a new one."""
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            block = {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})}
            events += self._start(block)
        assert self._open is not None
        self._open[kind] += piece
        delta = {"type": f"{kind}_delta", kind: piece}
        events.append({"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta})
        return events

    def _call(self, delta: Event) -> list[Event]:
        events: list[Event] = []
        index = delta["index"]
        function = delta.get("function") or {}
        if index not in self._calls:
            events += self._close()
            block = {"type": "tool_use", "id": delta.get("id") or f"toolu_{secrets.token_hex(12)}"}
            block.update(name=function.get("name", ""), input={})
            events += self._start(block)
            self._calls[index], self._arguments[index] = block, ""
        piece = function.get("arguments") or ""
        if piece:
            self._arguments[index] += piece
            delta = {"type": "input_json_delta", "partial_json": piece}
            position = self.content.index(self._calls[index])
            events.append({"type": "content_block_delta", "index": position, "delta": delta})
        return events

    def _start(self, block: Event) -> list[Event]:
        self.content.append(block)
        self._open = block
        start = {"type": "content_block_start", "index": len(self.content) - 1, "content_block": dict(block)}
        return [start]

    def _close(self) -> list[Event]:
        block, self._open = self._open, None
        if block is None:
            return []
        if block["type"] == "tool_use":
            index = next(i for i, b in self._calls.items() if b is block)
            block["input"] = _input_of(self._arguments[index])
        return [{"type": "content_block_stop", "index": self.content.index(block)}]


def _input_of(arguments: str) -> Event:
    """A call's input object; text that is not one (a model's malformed call) is kept under `input`."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"input": arguments}
    return parsed if isinstance(parsed, dict) else {"input": parsed}


# ---------------------------------------------------------------- serving


async def create_message(
    body: MessagesRequest,
    generation: Generation,
    target: Target,
    until: Until,
    mcp_tools: McpTools | None = None,
    account_id: str = "",
) -> Answer:
    """A message on `target`, whole or as Anthropic's event stream (`frontend`: the one pipeline every
    front-end shares). Its reasoning effort is optional: a family without a switch generates as it always
    does rather than refusing the request (Claude Code asks for thinking whatever the model;
    docs/messages.md). With `mcp_servers`, the MCP connector's rounds (`McpLoop`)."""
    servers = mcp_requests(body)
    if servers:
        assert mcp_tools is not None
        toolset = await mcp_tools.open(account_id, servers)
        loop = McpLoop(body, generation, target, mcp_tools, account_id, toolset)
        head = {"id": message_id(), "type": "message", "role": "assistant", "model": body.model}
        await loop.start()
        if body.stream:
            return _sse(loop.events(head))
        async for _ in loop.events(head):
            pass
        return loop.message(head)
    translated = chat_request(body)
    requests, mode = await generation.chat(
        translated.chat,
        target,
        effort_param="thinking",
        effort_optional=True,
        image_params=translated.image_params,
    )
    (choice,) = chat_choices(translated.chat, mode, 1)
    assembler = MessageAssembler(choice, StopSequences(body.stop_sequences or []))
    head = {"id": message_id(), "type": "message", "role": "assistant", "model": body.model}
    if body.stream:
        streams = await generation.open(target, requests)
        return _sse(_events(head, assembler, streams))
    _, events = await generation.whole(target, requests, until)
    for _, event in events:
        assembler.feed(event)
    return assembler.message(head)


async def _events(head: Event, assembler: MessageAssembler, streams: Streams) -> AsyncIterator[Event]:
    """Anthropic's event sequence: `message_start`, a `ping`, the content blocks' events,
    `message_delta` (stop reason, usage), `message_stop`."""
    started = False
    async for _, event in streams.merged():
        produced = assembler.feed(event)
        if not started:  # the first event carries the prompt's token counts
            started = True
            start = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
            usage = {**assembler.usage(), "output_tokens": 0, "service_tier": STANDARD}
            yield {"type": "message_start", "message": {**start, "usage": usage}}
            yield {"type": "ping"}
        for item in produced:
            yield item
    delta = {"stop_reason": assembler.stop_reason, "stop_sequence": assembler.stops.matched}
    yield {"type": "message_delta", "delta": delta, "usage": assembler.usage()}
    yield {"type": "message_stop"}


async def _sse(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """Each event as `event: <type>` and `data: {...}`, as Anthropic sends them; an error once the 200 has
    gone out is an `error` event in Anthropic's shape."""
    try:
        async for event in events:
            yield _frame(event)
    except ModelhostError as exc:
        yield _frame(anthropic_body(exc))


def _frame(event: Event) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def count_tokens(
    body: CountTokensRequest, generation: Generation, target: Target, until: Until
) -> Event:
    """`{"input_tokens"}`: the prompt a message with this body would start from, rendered by the
    deployment's own chat template and tokenizer (the replica's `/tokenize` path)."""
    if body.mcp_servers:
        raise InvalidRequest(
            "count_tokens does not reach MCP servers: count without mcp_servers.", param="mcp_servers"
        )
    translated = chat_request(body)
    chat = translated.chat
    if translated.image_params:
        raise InvalidRequest(
            "count_tokens counts text; image blocks are not counted.", param=translated.image_params[0]
        )
    tokenize = TokenizeChatRequest.model_validate(
        {
            "model": chat.model,
            "messages": chat.messages,
            "tools": chat.tools if chat.tool_choice != "none" else None,
            "chat_template_kwargs": chat.chat_template_kwargs,
        }
    )
    request = tokenize_request(tokenize)
    if chat.reasoning_effort is not None:
        request.reasoning_effort, request.reasoning_effort_optional = chat.reasoning_effort, True
    _, events = await generation.whole(target, [request], until)
    tokenized = events[-1][1]
    assert isinstance(tokenized, Tokenized) and tokenized.tokens is not None
    return {"input_tokens": len(tokenized.tokens)}


# ---------------------------------------------------------------- the MCP connector


class McpLoop:
    """A message whose model may call the MCP connector's tools: each round is generated as a stream;
    the model's calls to MCP tools become `mcp_tool_use` blocks (their `tool_use` events are not sent),
    made here, each followed by its `mcp_tool_result` block; then the model goes on from the results, up
    to `MAX_ROUNDS` rounds (the last one without MCP tools). A call to a client tool ends the message
    (`tool_use`), as without MCP."""

    def __init__(
        self,
        body: MessagesRequest,
        generation: Generation,
        target: Target,
        mcp_tools: McpTools,
        account_id: str,
        toolset: Toolset,
    ) -> None:
        self._body, self._generation, self._target = body, generation, target
        self._mcp, self._account_id, self._toolset = mcp_tools, account_id, toolset
        self.content: list[Event] = []
        self._turns: list[Event] = []  # the rounds so far, as chat messages after the request's own
        self._usage: Event | None = None
        self._assembler: MessageAssembler | None = None
        self._streams: Streams | None = None

    async def start(self, last: bool = False) -> None:
        """Open the next round's stream (the first one before any answer: a prompt that does not fit
        fails the request)."""
        translated = chat_request(self._body, None if last else self._toolset.functions())
        chat = translated.chat
        if self._turns:
            dumped = chat.model_dump(exclude_none=True)
            chat = ChatCompletionRequest.model_validate(
                {**dumped, "messages": dumped["messages"] + self._turns}
            )
        requests, mode = await self._generation.chat(
            chat,
            self._target,
            effort_param="thinking",
            effort_optional=True,
            image_params=translated.image_params,
        )
        (choice,) = chat_choices(chat, mode, 1)
        stops = StopSequences(self._body.stop_sequences or [])
        self._assembler = MessageAssembler(choice, stops, content=self.content)
        self._streams = await self._generation.open(self._target, requests)

    async def events(self, head: Event) -> AsyncIterator[Event]:
        started = False
        for round_ in range(MAX_ROUNDS + 1):
            assembler, streams = self._assembler, self._streams
            assert assembler is not None and streams is not None
            first = len(self.content)
            hidden: set[int] = set()
            async for _, event in streams.merged():
                produced = assembler.feed(event)
                if not started:
                    started = True
                    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
                    usage = {**assembler.usage(), "output_tokens": 0}
                    yield {"type": "message_start", "message": {**start, "usage": usage}}
                    yield {"type": "ping"}
                for item in produced:
                    block = item.get("content_block") or {}
                    if block.get("type") == "tool_use" and block.get("name") in self._toolset.tools:
                        hidden.add(item["index"])
                    if item.get("index") not in hidden:
                        yield item
            self._usage = _added(self._usage, assembler.usage())
            client_calls = any(
                b["type"] == "tool_use" for i, b in enumerate(self.content) if i >= first and i not in hidden
            )
            if not hidden or client_calls or assembler.choice.finish == "length" or round_ == MAX_ROUNDS:
                break
            turn = _turn_of(self.content[first:])
            results: list[Event] = []
            for index in sorted(hidden):
                async for item in self._call(index, results):
                    yield item
            self._turns += [turn, *results]
            await self.start(last=round_ + 1 == MAX_ROUNDS)
        assert self._assembler is not None
        delta = {"stop_reason": self._assembler.stop_reason, "stop_sequence": self._assembler.stops.matched}
        yield {"type": "message_delta", "delta": delta, "usage": self._usage}
        yield {"type": "message_stop"}

    async def _call(self, index: int, results: list[Event]) -> AsyncIterator[Event]:
        """The model's call at `index` as an `mcp_tool_use` block, made, then its `mcp_tool_result`."""
        made = self.content[index]
        tool = self._toolset.tools[made["name"]]
        use = {"type": "mcp_tool_use", "id": made["id"], "name": tool.name, "server_name": tool.server.label}
        self.content[index] = use = {**use, "input": made["input"]}
        yield {"type": "content_block_start", "index": index, "content_block": dict(use)}
        yield {"type": "content_block_stop", "index": index}
        outcome = await self._mcp.call(self._account_id, self._toolset, tool.name, json.dumps(made["input"]))
        text = outcome.output if outcome.error is None else outcome.error
        result = {
            "type": "mcp_tool_result",
            "tool_use_id": made["id"],
            "is_error": outcome.error is not None,
            "content": [{"type": "text", "text": text or ""}],
        }
        self.content.append(result)
        position = len(self.content) - 1
        yield {"type": "content_block_start", "index": position, "content_block": result}
        yield {"type": "content_block_stop", "index": position}
        answer = f"Error: {text}" if outcome.error is not None else text
        results.append({"role": "tool", "tool_call_id": made["id"], "content": answer or ""})

    def message(self, head: Event) -> Event:
        assert self._assembler is not None
        return {
            **head,
            "content": self.content,
            "stop_reason": self._assembler.stop_reason,
            "stop_sequence": self._assembler.stops.matched,
            "usage": self._usage,
        }


def _turn_of(blocks: list[Event]) -> Event:
    """One round's blocks (before its calls are made) as the assistant turn the next round reads."""
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    thoughts = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
        }
        for b in blocks
        if b["type"] == "tool_use"
    ]
    turn: Event = {"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls}
    if thoughts:
        turn["reasoning_content"] = "\n".join(thoughts)
    return turn


def _added(total: Event | None, more: Event) -> Event:
    return more if total is None else {name: total[name] + more[name] for name in more}
