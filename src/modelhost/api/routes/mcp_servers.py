"""The account's allow-list of MCP servers for hosted MCP tools (`mcp_servers:read` / `:write`: owners
and admins), and the operator's view of any account's (`/v1/admin/accounts/{id}/mcp-servers`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Path

from modelhost.api.deps import AccountPrincipal, AdminPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.protocol.management import McpServers

router = APIRouter(tags=["mcp"], responses=error_responses(400, 401, 403))
AccountId = Path(max_length=64)


@router.get("/v1/mcp-servers", summary="The MCP server URLs this account's hosted MCP tools may reach")
async def get_mcp_servers(principal: AccountPrincipal, services: ServicesDep) -> McpServers:
    urls = await asyncio.to_thread(services.mcp.allowlist.get, account_id_of(principal))
    return McpServers(urls=urls)


@router.put("/v1/mcp-servers", summary="Replace this account's allow-list of MCP server URLs")
async def put_mcp_servers(body: McpServers, principal: AccountPrincipal, services: ServicesDep) -> McpServers:
    urls = await asyncio.to_thread(services.mcp.allowlist.put, account_id_of(principal), body.urls)
    return McpServers(urls=urls)


@router.get(
    "/v1/admin/accounts/{account_id}/mcp-servers",
    summary="An account's allow-list of MCP server URLs",
    tags=["admin"],
    responses=error_responses(404),
)
async def admin_get_mcp_servers(
    _admin: AdminPrincipal, services: ServicesDep, account_id: str = AccountId
) -> McpServers:
    await asyncio.to_thread(services.accounts.get, account_id)  # 404 for no such account
    return McpServers(urls=await asyncio.to_thread(services.mcp.allowlist.get, account_id))


@router.put(
    "/v1/admin/accounts/{account_id}/mcp-servers",
    summary="Replace an account's allow-list of MCP server URLs",
    tags=["admin"],
    responses=error_responses(404),
)
async def admin_put_mcp_servers(
    body: McpServers, _admin: AdminPrincipal, services: ServicesDep, account_id: str = AccountId
) -> McpServers:
    await asyncio.to_thread(services.accounts.get, account_id)
    return McpServers(urls=await asyncio.to_thread(services.mcp.allowlist.put, account_id, body.urls))
