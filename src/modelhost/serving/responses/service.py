"""Generating a response: prepare (chain, checks), open the engine stream (errors before any answer),
run it into OpenAI's event sequence, store it; background responses run as tasks of the gateway
process that took them, beating in the database so that a cancel from any process reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from modelhost.auth.limits import start_counting
from modelhost.clock import heartbeat_seconds
from modelhost.errors import InvalidRequest, ModelhostError
from modelhost.frontend import Generation, Streams, Target
from modelhost.generation.choices import ChatChoice, tool_schemas
from modelhost.generation.contract import GenerationRequest
from modelhost.mcp.tools import MAX_ROUNDS, McpTools, Toolset
from modelhost.protocol.chat import ChatCompletionRequest
from modelhost.protocol.responses import McpApprovalResponseItem, ResponseCreateRequest
from modelhost.routing import split_key
from modelhost.serving.responses import mcp
from modelhost.serving.responses.conversations import ConversationStore
from modelhost.serving.responses.items import (
    OutputAssembler,
    chat_request,
    conversation_id,
    image_params,
    input_items,
    mcp_requests,
    settings_of,
)
from modelhost.serving.responses.store import INTERRUPTED, ResponseStore, Scope, response_view
from modelhost.store.models import StoredResponse
from modelhost.store.types import new_id, utcnow

log = logging.getLogger(__name__)
Event = dict[str, Any]
FINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


@dataclass
class Prepared:
    """A checked request: what to generate and what to store."""

    id: str
    account_id: str
    target: Target
    model: str
    store: bool
    background: bool
    previous_response_id: str | None
    settings: dict[str, Any]
    context: list[Any]
    input_items: list[Any]
    engine_request: GenerationRequest
    mode: str
    tool_names: list[str]
    conversation_id: str | None = None  # the conversation this turn is appended to once it has finished
    created_at: datetime = field(default_factory=utcnow)  # when the request came, stored as such
    tool_schemas: dict[str, Any] = field(default_factory=dict)  # `ChatChoice.tool_schemas`
    body: ResponseCreateRequest | None = None  # for the later rounds of a response with MCP tools
    toolset: Toolset | None = None  # the request's MCP servers, listed
    pre_output: list[Any] = field(default_factory=list)  # MCP listings and approved calls, made first

    def view(self, status: str, **values: Any) -> Event:
        """The response object at this point (`values`: output, usage, error, incomplete_reason)."""
        now = utcnow()
        row = StoredResponse(
            id=self.id,
            model=self.model,
            status=status,
            background=self.background,
            previous_response_id=self.previous_response_id,
            settings=self.settings,
            output=values.get("output", []),
            usage=values.get("usage"),
            error=values.get("error"),
            incomplete_reason=values.get("incomplete_reason"),
            created_at=self.created_at,
            updated_at=now,
            completed_at=now,
        )
        return response_view(row)

    @property
    def deployment_id(self) -> str:
        return split_key(self.target.runtime_key)[0]


@dataclass
class Opened:
    """An opened engine stream, past its first event, and the assembler of its output."""

    streams: Streams
    assembler: OutputAssembler


class Responses:
    def __init__(
        self,
        store: ResponseStore,
        conversations: ConversationStore,
        generation: Generation,
        stale_seconds: float,
        mcp_tools: McpTools,
    ) -> None:
        self.store = store
        self.conversations = conversations
        self._generation = generation
        self._mcp = mcp_tools
        self._beat_seconds = heartbeat_seconds(stale_seconds)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def prepare(
        self,
        body: ResponseCreateRequest,
        account_id: str,
        scope: Scope,
        target: Target,
    ) -> Prepared:
        """The checked request on `target`, its engine request built by the one pipeline every front-end
        shares (`frontend`): `input_image` parts' images (this input's and the chain's) are read as chat
        completions read theirs, the deployment's sampling defaults applied."""
        store = body.store is not False
        if body.background and not store:
            raise InvalidRequest("background responses are stored: set store to true.", param="background")
        context: list[Any] = []
        items = input_items(body.input)
        conversation = conversation_id(body)
        if conversation is not None and body.previous_response_id:
            raise InvalidRequest(
                "Mutually exclusive parameters: give either previous_response_id or conversation.",
                param="conversation",
            )
        if body.previous_response_id:
            previous = body.previous_response_id
            context = await asyncio.to_thread(self.store.chain, account_id, scope, previous)
        elif conversation is not None:
            context = await asyncio.to_thread(
                self.conversations.context, account_id, scope, conversation, items
            )
        servers = mcp_requests(body)
        toolset = await self._mcp.open(account_id, servers) if servers else None
        pre_output = [mcp.listing(label, tools) for label, tools in toolset.listings] if toolset else []
        pre_output += await self._approved_calls(body, account_id, toolset, context)
        chat = chat_request(body, [*context, *items, *pre_output], toolset.functions() if toolset else None)
        requests, mode = await self._chat(body, chat, target, context)
        return Prepared(
            id=new_id("resp"),
            account_id=account_id,
            target=target,
            model=body.model,
            store=store,
            background=bool(body.background),
            previous_response_id=body.previous_response_id,
            settings=settings_of(body),
            context=context,
            input_items=items,
            engine_request=requests[0],
            mode=mode,
            tool_names=[t.function.name for t in chat.tools or []],
            conversation_id=conversation,
            tool_schemas=tool_schemas(chat.tools or []),
            body=body,
            toolset=toolset,
            pre_output=pre_output,
        )

    async def _chat(
        self, body: ResponseCreateRequest, chat: ChatCompletionRequest, target: Target, context: list[Any]
    ) -> tuple[list[GenerationRequest], str]:
        return await self._generation.chat(
            chat,
            target,
            effort_param="reasoning.effort",
            format_param="text.format",
            image_params=image_params(body, context),
        )

    async def _approved_calls(
        self, body: ResponseCreateRequest, account_id: str, toolset: Toolset | None, context: list[Any]
    ) -> list[Any]:
        """The calls this input approves (`mcp_approval_response` items), made before generating: each an
        `mcp_call` item (a denied one with its denial as the error the model reads)."""
        asked = {item["id"]: item for item in context if item["type"] == "mcp_approval_request"}
        made: list[Any] = []
        for index, item in enumerate([] if isinstance(body.input, str) else body.input):
            if not isinstance(item, McpApprovalResponseItem):
                continue
            param = f"input[{index}].approval_request_id"
            request = asked.get(item.approval_request_id)
            if request is None:
                raise InvalidRequest(
                    f"No mcp_approval_request {item.approval_request_id!r} in the previous response's chain.",
                    param=param,
                )
            if not self._mcp.issued(account_id, request):  # written by a client, not asked by this server
                raise InvalidRequest(
                    f"The mcp_approval_request {item.approval_request_id!r} was not issued by this server "
                    "(or its server label, tool or arguments were changed): only a request a response "
                    "asked can be approved.",
                    param=param,
                )
            tool = toolset.tools.get(request["name"]) if toolset else None
            if tool is None or tool.server.label != request["server_label"]:
                raise InvalidRequest(
                    f"The approved call's server {request['server_label']!r} and tool {request['name']!r} "
                    "must be among this request's tools.",
                    param=param,
                )
            call = mcp.call_item(
                request["server_label"], request["name"], request["arguments"], request["id"]
            )
            assert toolset is not None
            outcome = (
                await self._mcp.call(account_id, toolset, request["name"], request["arguments"])
                if item.approve
                else mcp.DENIED
            )
            mcp.settle(call, outcome)
            made.append(call)
        return made

    async def open(self, prepared: Prepared) -> Opened:
        """Start generating and wait for the first event: a prompt that does not fit fails here."""
        streams = await self._generation.open(prepared.target, [prepared.engine_request])
        choice = ChatChoice(0, prepared.mode, prepared.tool_names, tool_schemas=prepared.tool_schemas)
        return Opened(streams, OutputAssembler(choice, output=list(prepared.pre_output)))

    async def run(self, prepared: Prepared, generation: Opened, *, record: bool) -> AsyncIterator[Event]:
        """OpenAI's event sequence (without sequence numbers), ending with the final response, which
        is stored (`record`) before that last event goes out."""
        assembler = generation.assembler
        yield {"type": "response.created", "response": prepared.view("in_progress")}
        yield {"type": "response.in_progress", "response": prepared.view("in_progress")}
        output = assembler.output
        for index, item in enumerate(prepared.pre_output):  # MCP listings and approved calls
            for event in [*mcp.opened_events(index, item), *mcp.closed_events(index, item)]:
                yield event
        toolset = prepared.toolset
        hidden = mcp.Hidden(frozenset(toolset.tools) if toolset else frozenset())
        error: Event | None = None
        usage: Event | None = None
        streams = generation.streams
        for round_ in range(MAX_ROUNDS + 1):
            first = len(output)
            async with contextlib.aclosing(streams.merged()) as stream:
                try:
                    async for _, engine_event in stream:
                        for event in assembler.feed(engine_event):
                            if hidden.visible(event):
                                yield event
                        if assembler.choice.finish is not None:
                            break
                except ModelhostError as exc:  # the replica failed mid-way (after the 200 went out)
                    error = {"code": exc.code, "message": exc.message}
                    yield {"type": "error", "code": exc.code, "message": exc.message, "param": exc.param}
            for event in assembler.finish():
                if hidden.visible(event):
                    yield event
            usage = mcp.added_usage(usage, assembler.usage())
            calls = [i for i, item in enumerate(output) if i >= first and item["id"] in hidden.ids]
            if error is not None or toolset is None or not calls:
                break
            waiting = False
            for index in calls:  # each MCP tool call becomes its item, made here or waiting for approval
                made = output[index]
                tool = toolset.tools[made["name"]]
                if tool.needs_approval:
                    label, arguments = tool.server.label, made["arguments"]
                    signed = self._mcp.approval_id(prepared.account_id, label, tool.name, arguments)
                    output[index] = mcp.approval_item(signed, label, tool.name, arguments)
                    waiting = True
                    for event in [
                        *mcp.opened_events(index, output[index]),
                        *mcp.closed_events(index, output[index]),
                    ]:
                        yield event
                    continue
                output[index] = call = mcp.call_item(tool.server.label, tool.name, made["arguments"])
                for event in mcp.opened_events(index, call):
                    yield event
                mcp.settle(
                    call, await self._mcp.call(prepared.account_id, toolset, tool.name, call["arguments"])
                )
                for event in mcp.closed_events(index, call):
                    yield event
            client_calls = any(item["type"] == "function_call" for item in output[first:])
            if waiting or client_calls or assembler.choice.finish == "length":
                break
            try:  # the next round: the model reads the results; the last one gets no MCP tools
                assert prepared.body is not None
                offered = toolset.functions() if round_ + 1 < MAX_ROUNDS else None
                conversation = [*prepared.context, *prepared.input_items, *output]
                chat = chat_request(prepared.body, conversation, offered)
                requests, mode = await self._chat(prepared.body, chat, prepared.target, prepared.context)
                streams = await self._generation.open(prepared.target, [requests[0]])
            except ModelhostError as exc:
                error = {"code": exc.code, "message": exc.message}
                yield {"type": "error", "code": exc.code, "message": exc.message, "param": exc.param}
                break
            names = [t.function.name for t in chat.tools or []]
            choice = ChatChoice(0, mode, names, tool_schemas=tool_schemas(chat.tools or []))
            assembler = OutputAssembler(choice, output=output)
        outcome: Event = {"output": output, "usage": usage}
        if error is not None:
            status = "failed"
            outcome["error"] = error
        else:
            status = "incomplete" if assembler.incomplete_reason else "completed"
            outcome["incomplete_reason"] = assembler.incomplete_reason
        if prepared.conversation_id is not None and status != "failed":
            turn = [*prepared.input_items, *assembler.output]
            await asyncio.to_thread(self.conversations.append, prepared.conversation_id, turn)
        final = prepared.view(status, **outcome)
        if record:
            final = await asyncio.to_thread(self._store, prepared, status, outcome)
        yield {"type": FINAL_EVENTS[status], "response": final}

    def _store(self, prepared: Prepared, status: str, outcome: Event) -> Event:
        """Write the response: finished (with its `outcome`), or `queued` for a background one."""
        return self.store.create(
            prepared.account_id,
            prepared.deployment_id,
            prepared.model,
            status=status,
            background=prepared.background,
            previous_response_id=prepared.previous_response_id,
            settings=prepared.settings,
            context=prepared.context,
            input_items=prepared.input_items,
            response_id=prepared.id,
            created_at=prepared.created_at,
            **outcome,
        )

    # ---------------------------------------------------------------- background

    async def submit(self, prepared: Prepared, tokens_used: Callable[[int], None] | None = None) -> Event:
        """Store the response as `queued` and generate it in a task of this process. Its request is
        answered before it runs: `tokens_used` is told the tokens it took once it ends (the key's
        rate limits)."""
        queued = await asyncio.to_thread(self._store, prepared, "queued", {})
        task = asyncio.get_running_loop().create_task(self._background(prepared, tokens_used))
        self._tasks[prepared.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(prepared.id, None))
        return queued

    async def _background(self, prepared: Prepared, tokens_used: Callable[[int], None] | None) -> None:
        if not await asyncio.to_thread(self.store.start, prepared.id):
            return  # cancelled before it started
        used = start_counting()  # this task's own count: its request's was given back when answered
        this = asyncio.current_task()
        assert this is not None
        beating = asyncio.create_task(self._beat(prepared.id, this))
        try:
            generation = await self.open(prepared)
            final: Event = {}
            async for event in self.run(prepared, generation, record=False):  # `finish` records it
                final = event
            response = final["response"]
            values = {k: response[k] for k in ("status", "output", "usage", "error")}
            incomplete = response.get("incomplete_details")
            values["incomplete_reason"] = incomplete["reason"] if incomplete else None
            await asyncio.to_thread(self.store.finish, prepared.id, **values)
        except ModelhostError as exc:
            error = {"code": exc.code, "message": exc.message}
            await asyncio.to_thread(self.store.finish, prepared.id, status="failed", error=error)
        except asyncio.CancelledError:
            # cancelled by a cancel (already recorded: this is then a no-op) or by the server stopping
            self.store.finish(prepared.id, status="failed", error=INTERRUPTED)
            raise
        except Exception:  # never leave a response in progress because of a bug here
            log.exception("background response %s", prepared.id)
            error = {"code": "generation_error", "message": "The response failed; see the server log."}
            await asyncio.to_thread(self.store.finish, prepared.id, status="failed", error=error)
        finally:
            beating.cancel()
            if tokens_used is not None and used[0]:
                tokens_used(used[0])

    async def _beat(self, response_id: str, task: asyncio.Task[None]) -> None:
        """Beat while generating; a response cancelled or deleted elsewhere is stopped here."""
        while True:
            await asyncio.sleep(self._beat_seconds)
            if not await asyncio.to_thread(self.store.beat, response_id):
                task.cancel()
                return

    async def cancel(self, account_id: str, scope: Scope, response_id: str) -> Event:
        response = await asyncio.to_thread(self.store.cancel, account_id, scope, response_id)
        self._stop(response_id)
        return response

    async def delete(self, account_id: str, scope: Scope, response_id: str) -> None:
        await asyncio.to_thread(self.store.delete, account_id, scope, response_id)
        self._stop(response_id)

    def _stop(self, response_id: str) -> None:
        task = self._tasks.get(response_id)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        """Stop this process's background responses (they are recorded as interrupted)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
