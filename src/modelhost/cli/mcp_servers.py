"""`modelhost mcp-servers`: the account's allow-list of MCP server URLs that hosted MCP tools (the
Responses and Messages APIs) may reach (docs/responses.md, "MCP tools"). None by default."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from modelhost.cli.client import ApiClient
from modelhost.cli.options import DEFAULT_URL, AccountKey, Json, Url

mcp_servers_app = typer.Typer(
    help="MCP servers your account's hosted MCP tools may reach (docs/responses.md).", no_args_is_help=True
)
Urls = Annotated[list[str], typer.Argument(help="MCP server URLs (scheme, host, port and a path prefix).")]
PATH = "/v1/mcp-servers"


def _show(answer: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    for url in answer["urls"]:
        print(url)


@mcp_servers_app.command("list")
def mcp_servers_list(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List the MCP server URLs on your account's allow-list."""
    _show(ApiClient(url, key).call("GET", PATH), as_json)


@mcp_servers_app.command("add")
def mcp_servers_add(
    urls: Urls, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Add MCP server URLs to your account's allow-list (owners and admins)."""
    client = ApiClient(url, key)
    listed = client.call("GET", PATH)["urls"]
    _show(client.call("PUT", PATH, json={"urls": [*listed, *urls]}), as_json)


@mcp_servers_app.command("remove")
def mcp_servers_remove(
    urls: Urls, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Remove MCP server URLs (as listed) from your account's allow-list."""
    client = ApiClient(url, key)
    listed = client.call("GET", PATH)["urls"]
    missing = [u for u in urls if u not in listed]
    if missing:
        raise typer.BadParameter(f"not on the list: {', '.join(missing)}", param_hint="URLS")
    _show(client.call("PUT", PATH, json={"urls": [u for u in listed if u not in urls]}), as_json)
