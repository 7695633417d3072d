"""Each account's allow-list of MCP server URLs: a hosted MCP tool reaches only a server an entry of its
account matches, and none by default (an MCP URL in a request is attacker-chosen: the account's admins
say which servers its keys may make this server call, on top of the network rules of `media.fetch`).

The matching rule: an entry is an http(s) URL without query, fragment or credentials; a server URL
matches it when scheme, host and port are the same (the default port written or not) and its path is
the entry's path or lies below it (`/mcp` matches `/mcp` and `/mcp/v2`, not `/mcp2`). An entry with no
path allows the whole origin.

Paths are compared as written, so a path that a client or a server would read as another one is
refused, in an entry and in a server URL alike: a dot segment (`/mcp/public/../private`, which the
HTTP client itself resolves to `/mcp/private`), a percent-encoded dot, slash or backslash (`%2e`,
`%2f`, `%5c`, which a server may decode), a backslash, or an empty segment (`//`). What is matched is
then exactly what is requested.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
from sqlalchemy import delete, select

from modelhost import audit
from modelhost.errors import InvalidRequest
from modelhost.store.db import Database
from modelhost.store.models import McpServerEntry

MAX_ENTRIES = 100
_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def normalised(url: str, param: str) -> str:
    """An entry as stored: scheme and host lower-cased, the default port and a trailing `/` dropped;
    InvalidRequest naming `param` for anything but a plain http(s) URL."""
    origin, path = _parts(url.strip(), param)
    scheme, host, port = origin
    shown_host = f"[{host}]" if ":" in host else host
    netloc = shown_host if port == _DEFAULT_PORTS[scheme] else f"{shown_host}:{port}"
    return f"{scheme}://{netloc}{path}"


def permits(entries: list[str], url: str, param: str) -> bool:
    """Whether `url` (a request's MCP server URL) matches one of `entries` (module docstring)."""
    origin, path = _parts(url, param)
    for entry in entries:
        allowed_origin, prefix = _parts(entry, "entry")
        if origin == allowed_origin and (path == prefix or path.startswith(prefix + "/") or not prefix):
            return True
    return False


def _parts(url: str, param: str) -> tuple[tuple[str, str, int], str]:
    try:
        split = urlsplit(url)
        port = split.port
        requested = httpx.URL(url)  # as the MCP client reads it: the same host, or refused
    except (ValueError, httpx.InvalidURL):
        raise InvalidRequest(f"{url!r} is not a valid URL.", param=param) from None
    scheme = split.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not split.hostname:
        raise InvalidRequest(f"{url!r} is not an http(s) URL with a host.", param=param)
    if split.username or split.password or split.fragment:
        raise InvalidRequest(f"{url!r}: no credentials or fragment in an MCP server URL.", param=param)
    if any(c.isspace() or not c.isprintable() or c == "\\" for c in url) or (
        requested.host.lower() != split.hostname.lower()
    ):
        raise InvalidRequest(
            f"{url!r} is not a plain URL (no spaces, control characters or backslashes).",
            param=param,
            code="invalid_mcp_server_url",
        )
    path = split.path.rstrip("/")
    segments = path.split("/")[1:]
    if _ENCODED.search(path) or any(s in ("", ".", "..") for s in segments):
        raise InvalidRequest(
            f"{url!r}: an MCP server URL's path has no `.` or `..` segments, no empty segments and no "
            'encoded dots, slashes or backslashes (docs/responses.md, "MCP tools").',
            param=param,
            code="invalid_mcp_server_url",
        )
    return (scheme, split.hostname.lower(), port or _DEFAULT_PORTS[scheme]), path


class McpAllowList:
    """The stored lists, per account; each change audited (`account.mcp_servers_updated`)."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def get(self, account_id: str) -> list[str]:
        with self._database.transaction() as session:
            rows = session.scalars(
                select(McpServerEntry.url)
                .where(McpServerEntry.account_id == account_id)
                .order_by(McpServerEntry.url)
            )
            return list(rows)

    def put(self, account_id: str, urls: list[str]) -> list[str]:
        """Replace the account's list with `urls` (normalised, duplicates dropped)."""
        if len(urls) > MAX_ENTRIES:
            raise InvalidRequest(f"At most {MAX_ENTRIES} MCP server URLs per account.", param="urls")
        entries = sorted({normalised(url, f"urls[{i}]") for i, url in enumerate(urls)})
        with self._database.transaction() as session:
            before = list(
                session.scalars(select(McpServerEntry.url).where(McpServerEntry.account_id == account_id))
            )
            session.execute(delete(McpServerEntry).where(McpServerEntry.account_id == account_id))
            session.add_all(McpServerEntry(account_id=account_id, url=url) for url in entries)
            changes = audit.diff({"urls": sorted(before)}, {"urls": entries})
            audit.record(session, "account.mcp_servers_updated", "account", account_id, account_id, changes)
        return entries
