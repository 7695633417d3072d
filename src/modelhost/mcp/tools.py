"""Hosted MCP tools, front-end neutral: the servers a request names checked (the account's allow-list,
the vetted addresses) and listed before any answer, their tools offered to the model as functions under
their own names, and each call the model makes run here, traced and audited, within the bounds below
(docs/responses.md, "MCP tools"; the Messages API's MCP connector shares all of it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelhost import audit, tracing
from modelhost.errors import InvalidRequest, McpServerFailed
from modelhost.mcp.allowlist import McpAllowList, permits
from modelhost.mcp.client import McpFailure, McpServer, call_tool, list_tools, vetted_server
from modelhost.outbound import Bounds, FetchFailed, IPNetwork
from modelhost.store.db import Database

Item = dict[str, Any]

MAX_ROUNDS = 8  # model turns that may call MCP tools in one response; the next turn gets no MCP tools
CALL_TIMEOUT_SECONDS = 60.0  # one MCP operation (a listing, a call)
TOTAL_SECONDS = 300.0  # every MCP operation of one response together
MAX_TOOLS = 128  # tools offered from every server of a request together
MAX_RESULT_CHARS = 100_000  # a call's result text; a longer one is an error given to the model
# Bytes of one answer of an MCP server (a listing's page, a call's result), cut off past them before it
# is parsed: a result of MAX_RESULT_CHARS characters, each escaped (`\uXXXX`) and given twice (as
# text and as structured content), fits.
MAX_ANSWER_BYTES = 4 * 1024**2
MAX_LIST_PAGES = 16  # pages of one server's tools/list
SESSION_REQUESTS = (
    6  # an MCP session's own requests: initialize, its notification, the GET, its retries, DELETE
)


@dataclass(frozen=True)
class McpRequest:
    """One MCP server as a request names it, in either API's shape. `allowed`: the tool names offered
    (None: all); `approval`: whether a tool's call waits for the client's approval."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False)
    allowed: frozenset[str] | None
    approval: Callable[[str], bool]
    param: str  # the request field that named the server, for errors

    def offers(self, name: str) -> bool:
        """Whether the tool `name` is offered (`allowed`)."""
        return self.allowed is None or name in self.allowed


@dataclass(frozen=True)
class OfferedTool:
    server: McpServer
    name: str
    description: str | None
    input_schema: Item
    needs_approval: bool

    def function(self) -> Item:
        """The tool as a chat function: its own name, description and schema."""
        definition: Item = {"name": self.name, "parameters": self.input_schema}
        if self.description:
            definition["description"] = self.description
        return {"type": "function", "function": definition}


@dataclass
class Toolset:
    """A request's MCP servers, listed: `listings` (label, tools as listed) for the answer's listing
    items, `tools` by name, and the deadline of every MCP operation of the response."""

    listings: list[tuple[str, list[Item]]]
    tools: dict[str, OfferedTool]
    servers: dict[str, McpServer]
    deadline: float

    def functions(self) -> list[Item]:
        return [tool.function() for tool in self.tools.values()]


@dataclass(frozen=True)
class CallOutcome:
    """A call's result text, or its error (`kind`: `tool` when the tool reported it, `protocol` when the
    call itself failed: the server unreachable, a timeout, bad arguments)."""

    output: str | None
    error: str | None = None
    kind: str | None = None


class McpTools:
    """The gateway's hosted-MCP service: the allow-list, the networks the operator allows, the audit
    log it writes to, and the key its approval requests are signed with."""

    def __init__(
        self, allowlist: McpAllowList, networks: tuple[IPNetwork, ...], database: Database, secret: bytes
    ) -> None:
        self.allowlist = allowlist
        self._networks = networks
        self._database = database
        self._approval_key = hmac.new(secret, b"modelhost mcp approval requests", hashlib.sha256).digest()

    async def open(self, account_id: str, requests: list[McpRequest]) -> Toolset:
        """Check and list every server (a 400 naming the field for a URL off the allow-list or on a
        refused address, before any MCP request; a 424 for a server that cannot list its tools)."""
        entries = await asyncio.to_thread(self.allowlist.get, account_id)
        labels = [r.label for r in requests]
        for request in requests:
            if labels.count(request.label) > 1:
                raise InvalidRequest(f"Two MCP servers are labelled {request.label!r}.", param=request.param)
            if not permits(entries, request.url, request.param):
                raise InvalidRequest(
                    f"The MCP server {request.url} is not on this account's allow-list of MCP servers "
                    "(an account admin adds it: PUT /v1/mcp-servers, docs/responses.md).",
                    param=request.param,
                    code="mcp_server_not_allowed",
                )
        deadline = time.monotonic() + TOTAL_SECONDS
        servers: dict[str, McpServer] = {}
        for request in requests:
            try:
                servers[request.label] = await vetted_server(
                    request.label, request.url, request.headers, self._networks, request.param
                )
            except FetchFailed as exc:
                raise InvalidRequest(exc.message, param=request.param, code="mcp_server_refused") from None
        listings: list[tuple[str, list[Item]]] = []
        tools: dict[str, OfferedTool] = {}
        for request in requests:
            server = servers[request.label]
            with tracing.step("mcp list tools", _attributes(server), kind=tracing.CLIENT):
                try:  # a listing stops once it holds one tool more than may be offered
                    kept = await list_tools(
                        server,
                        self._bounds(deadline, pages=MAX_LIST_PAGES),
                        keep=request.offers,
                        most=MAX_TOOLS + 1 - len(tools),
                        pages=MAX_LIST_PAGES,
                    )
                except McpFailure as exc:
                    raise McpServerFailed(
                        f"The MCP server {request.label!r} ({request.url}) could not list its tools: {exc}",
                        param=request.param,
                    ) from None
            listings.append((request.label, kept))
            for tool in kept:
                if tool["name"] in tools:
                    raise InvalidRequest(
                        f"Two MCP servers offer a tool named {tool['name']!r}: filter one out with "
                        "allowed_tools.",
                        param=request.param,
                    )
                tools[tool["name"]] = OfferedTool(
                    server,
                    tool["name"],
                    tool["description"],
                    tool["input_schema"],
                    request.approval(tool["name"]),
                )
            if len(tools) > MAX_TOOLS:
                raise InvalidRequest(
                    f"The MCP servers offer more than {MAX_TOOLS} tools (filter with allowed_tools).",
                    param=request.param,
                    code="mcp_too_many_tools",
                )
        return Toolset(listings, tools, servers, deadline)

    async def call(self, account_id: str, toolset: Toolset, name: str, arguments: str) -> CallOutcome:
        """Call `name` with `arguments` (the model's JSON): traced, audited, bounded."""
        tool = toolset.tools[name]
        with tracing.step("mcp call", {**_attributes(tool.server), "gen_ai.tool.name": name}, tracing.CLIENT):
            outcome = await self._call(tool, arguments, toolset.deadline)
            tracing.current_attributes({"modelhost.mcp.outcome": outcome.kind or "ok"})
        await asyncio.to_thread(self._audit, account_id, tool, outcome)
        return outcome

    async def _call(self, tool: OfferedTool, arguments: str, deadline: float) -> CallOutcome:
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            return CallOutcome(None, f"The arguments are not JSON: {arguments!r}", "protocol")
        if not isinstance(parsed, dict):
            return CallOutcome(None, "The arguments are not a JSON object.", "protocol")
        if time.monotonic() >= deadline:
            return CallOutcome(
                None, f"No time left for MCP calls ({TOTAL_SECONDS:g} s per response).", "protocol"
            )
        try:
            text, is_error = await call_tool(tool.server, tool.name, parsed, self._bounds(deadline, pages=1))
        except McpFailure as exc:
            return CallOutcome(None, str(exc), "protocol")
        if len(text) > MAX_RESULT_CHARS:
            return CallOutcome(None, f"The result is longer than {MAX_RESULT_CHARS} characters.", "protocol")
        return CallOutcome(None, text, "tool") if is_error else CallOutcome(text)

    def _bounds(self, deadline: float, *, pages: int) -> Bounds:
        """One MCP operation's: what is left of the response's time (at most CALL_TIMEOUT_SECONDS), its
        answers' bytes, its session's requests."""
        budget = _budget(deadline)
        return Bounds(
            networks=self._networks,
            max_bytes=MAX_ANSWER_BYTES,
            seconds=budget,
            idle_seconds=budget,
            requests=SESSION_REQUESTS + pages,
        )

    def approval_id(self, account_id: str, label: str, name: str, arguments: str) -> str:
        """The ID of an approval request this server issues: a nonce and an HMAC (this server's key) of
        the account, the server's label, the tool and the arguments, so that only a request it issued
        is honoured when its approval comes back (`issued`)."""
        nonce = secrets.token_hex(8)
        return f"mcpr_{nonce}{self._mac(nonce, account_id, label, name, arguments)}"

    def issued(self, account_id: str, request: Item) -> bool:
        """Whether `request` (an `mcp_approval_request` item from the chain) is one this server issued
        to this account, for this server label, tool and arguments."""
        identifier, fields = request.get("id"), (request.get("server_label"), request.get("name"))
        arguments = request.get("arguments")
        if (
            not isinstance(identifier, str)
            or not identifier.startswith("mcpr_")
            or not isinstance(arguments, str)
        ):
            return False
        nonce, mac = identifier[5:21], identifier[21:]
        if len(nonce) != 16 or not all(isinstance(f, str) for f in fields):
            return False
        label, name = str(fields[0]), str(fields[1])
        return hmac.compare_digest(mac, self._mac(nonce, account_id, label, name, arguments))

    def _mac(self, nonce: str, account_id: str, label: str, name: str, arguments: str) -> str:
        message = json.dumps([nonce, account_id, label, name, arguments]).encode()
        return hmac.new(self._approval_key, message, hashlib.sha256).hexdigest()[:40]

    def _audit(self, account_id: str, tool: OfferedTool, outcome: CallOutcome) -> None:
        with self._database.transaction() as session:
            fields = {"server_label": tool.server.label, "server_url": tool.server.url, "tool": tool.name}
            fields["outcome"] = outcome.kind or "ok"
            audit.record(
                session,
                "mcp_server.called",
                "mcp_server",
                tool.server.label,
                account_id,
                audit.created(fields),
            )


def _budget(deadline: float) -> float:
    return max(0.1, min(CALL_TIMEOUT_SECONDS, deadline - time.monotonic()))


def _attributes(server: McpServer) -> dict[str, str]:
    return {"server.address": server.url, "modelhost.mcp.server_label": server.label}
