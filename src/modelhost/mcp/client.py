"""The MCP operations of hosted MCP tools (list the tools, call one), each one MCP session of the
bounded outbound client (`outbound.mcp`: vetted addresses only, no redirect, no other origin, every
answer cut off past its bytes, the operation's time and requests bounded).

A server URL in a request is attacker-chosen, as a media URL is: its host is resolved once, when the
request names it (`vetted_server`), and every session connects to those addresses only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelhost.outbound import Bounds, IPNetwork, Vetted, vet
from modelhost.outbound.mcp import SessionFailed, mcp_session

Item = dict[str, Any]


class McpFailure(Exception):
    """An MCP operation that failed: the server unreachable, an error answer, a timeout, a bound
    crossed; `str` says why."""


@dataclass(frozen=True)
class McpServer:
    """A request's MCP server, checked: its URL allowed for the account and its addresses vetted."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False)  # the caller's tokens: never logged, stored or echoed
    vetted: Vetted


async def vetted_server(
    label: str, url: str, headers: dict[str, str], networks: tuple[IPNetwork, ...], param: str
) -> McpServer:
    """The server with its host's addresses vetted now (FetchFailed naming `param` if refused)."""
    return McpServer(label, url, dict(headers), await vet(url, networks, param=param))


async def list_tools(
    server: McpServer, bounds: Bounds, *, keep: Callable[[str], bool], most: int, pages: int
) -> list[Item]:
    """The server's tools that `keep` takes, as `{name, description, input_schema}`: the listing stops
    once it holds `most` of them (the caller refuses more than it offers) and fails past `pages` pages,
    every page within what is left of `bounds`; McpFailure if it fails."""
    tools: list[Item] = []
    try:
        async with mcp_session(server.vetted, server.headers, bounds) as client:
            cursor: str | None = None
            for _ in range(pages):
                page = await client.list_tools(cursor=cursor)
                for tool in page.tools:
                    if keep(tool.name):
                        tools.append(
                            {
                                "name": tool.name,
                                "description": tool.description,
                                "input_schema": tool.input_schema,
                            }
                        )
                        if len(tools) >= most:
                            return tools
                cursor = page.next_cursor
                if not cursor:
                    return tools
            raise McpFailure(f"its listing goes on past {pages} pages")
    except SessionFailed as exc:
        raise McpFailure(str(exc)) from None


async def call_tool(server: McpServer, name: str, arguments: Item, bounds: Bounds) -> tuple[str, bool]:
    """(the result's text, whether the tool reported an error); McpFailure if the call itself failed."""
    try:
        async with mcp_session(server.vetted, server.headers, bounds) as client:
            result = await client.call_tool(name, arguments, read_timeout_seconds=bounds.seconds)
    except SessionFailed as exc:
        raise McpFailure(str(exc)) from None
    texts = [getattr(part, "text", None) for part in result.content]
    text = "\n".join(t for t in texts if t is not None)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content)
    return text, bool(result.is_error)
