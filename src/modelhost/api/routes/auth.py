"""Single sign-on (docs/access.md): the sign-in through the OpenID provider, the session it opens (a
cookie), switching accounts, signing out. Public routes: the session's own cookie is their credential."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse

from modelhost.api.deps import SESSION_COOKIE, ServicesDep, session_secret, signed_in
from modelhost.api.errors import error_responses
from modelhost.auth.anonymous import COST, SIGN_IN_COST
from modelhost.container import Services
from modelhost.errors import InvalidAPIKey, InvalidRequest
from modelhost.protocol.management import (
    DeviceCode,
    DeviceSignInStarted,
    DeviceStart,
    HandoffCode,
    SessionAccount,
    SessionInfo,
    SessionToken,
    SignedOut,
    SignInConfig,
)

# a sign-in's step writes a row or asks the identity provider: it costs the anonymous throttle more
SIGN_IN = {COST: SIGN_IN_COST}
router = APIRouter(prefix="/v1/auth", tags=["sign-in"], responses=error_responses(400, 401))


async def _secret(request: Request) -> str:
    """The request's session: a signed-in CLI's bearer token, else the browser's cookie (401 without
    either, or once it has ended); a change made with the cookie must send the session's CSRF token."""
    found = session_secret(request)
    if found is None:
        raise InvalidAPIKey("Not signed in.", code="session_ended")
    await signed_in(request, *found)
    return found[0]


@router.get("/config", summary="Whether this server offers single sign-on (the console's sign-in page asks)")
def sign_in_config(services: ServicesDep) -> SignInConfig:
    return SignInConfig(sso=services.sessions.oidc is not None)


@router.get(
    "/login",
    summary="Sign in through the OpenID provider: redirects to it (then back to `return_to`, a path here)",
    status_code=302,
    responses=error_responses(404),
    openapi_extra=SIGN_IN,
)
async def login(
    services: ServicesDep,
    return_to: Annotated[str | None, Query(max_length=500)] = None,
    login_hint: Annotated[str | None, Query(max_length=320)] = None,
    cli_port: Annotated[int | None, Query(ge=1024, le=65535)] = None,
    cli_state: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_-]{16,128}$")] = None,
) -> RedirectResponse:
    """`cli_port` and `cli_state`: `modelhost login --browser` waits on 127.0.0.1:`cli_port`; the
    session goes there (a one-time code, with `cli_state` back) instead of into a cookie."""
    if (cli_port is None) != (cli_state is None):
        raise InvalidRequest("Give cli_port and cli_state together.", param="cli_state")
    loopback = (cli_port, cli_state) if cli_port is not None and cli_state is not None else None
    url = await services.sessions.start(return_to, login_hint, loopback)
    return RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})


@router.get(
    "/callback",
    summary="Where the OpenID provider sends the browser back: opens the session (a cookie)",
    status_code=302,
    responses=error_responses(403),
    openapi_extra=SIGN_IN,
)
async def callback(
    services: ServicesDep,
    code: Annotated[str | None, Query(max_length=2000)] = None,
    state: Annotated[str | None, Query(max_length=500)] = None,
    error: Annotated[str | None, Query(max_length=200)] = None,
    iss: Annotated[str | None, Query(max_length=500)] = None,
) -> RedirectResponse:
    if error is not None:
        raise InvalidAPIKey(f"The OpenID provider refused the sign-in: {error}", code="sign_in_failed")
    if not code or not state:
        raise InvalidRequest("The callback needs `code` and `state`.", param="code")
    oidc = services.sessions.oidc
    if iss is not None and oidc is not None and iss != oidc.config.issuer:  # RFC 9207: a mix-up
        raise InvalidAPIKey("The callback names another issuer (`iss`).", code="sign_in_failed")
    signed_in = await services.sessions.finish(code, state)
    answer = RedirectResponse(signed_in.return_to, status_code=302, headers={"Cache-Control": "no-store"})
    if signed_in.secret is None:  # handed to the CLI's loopback
        return answer
    settings = services.settings
    answer.set_cookie(
        SESSION_COOKIE,
        signed_in.secret,
        max_age=settings.session_max_seconds,
        path="/",
        httponly=True,
        samesite="lax",
        secure=(settings.public_url or "").startswith("https://"),
    )
    return answer


@router.get("/session", summary="The signed-in session: who, which account, its CSRF token")
async def session_info(request: Request, services: ServicesDep) -> SessionInfo:
    secret = await _secret(request)
    view = await asyncio.to_thread(services.sessions.view, secret)
    return SessionInfo(
        id=view.id,
        user_id=view.user_id,
        email=view.email,
        name=view.name,
        operator=view.operator,
        account_id=view.account_id,
        role=role.value if (role := view.accounts.get(view.account_id or "")) else None,
        accounts=[SessionAccount(id=a, role=r.value) for a, r in sorted(view.accounts.items())],
        csrf_token=view.csrf_token,
        expires_at=view.expires_at,
    )


@router.post(
    "/session/account",
    summary="Act in another of your accounts (`account_id`; null: as the operator, where you are one)",
    responses=error_responses(403, 404),
)
async def switch_account(request: Request, services: ServicesDep, body: SessionAccount) -> SessionInfo:
    secret = await _secret(request)
    await asyncio.to_thread(services.sessions.switch, secret, body.id)
    return await session_info(request, services)


@router.post("/logout", summary="Sign out: the session ends; the provider's logout URL where it has one")
async def logout(request: Request, services: ServicesDep) -> SignedOut:
    secret = await _secret(request)
    after = (services.settings.public_url or "").rstrip("/") + "/console"
    logout_url = await services.sessions.end(secret, after)
    return SignedOut(logout_url=logout_url)


@router.post(
    "/device",
    summary="Start a device sign-in (the CLI's `modelhost login`): a code the person confirms at the "
    "provider",
    responses=error_responses(404),
    openapi_extra=SIGN_IN,
)
async def device_start(services: ServicesDep, body: DeviceStart | None = None) -> DeviceSignInStarted:
    started = await services.sessions.device_start(body.login_hint if body is not None else None)
    return DeviceSignInStarted(
        device_code=started.device_code,
        user_code=started.user_code,
        verification_uri=started.verification_uri,
        verification_uri_complete=started.verification_uri_complete,
        expires_in=started.expires_in,
        interval=started.interval,
    )


@router.post(
    "/device/token",
    summary="Poll a device sign-in: 400 `authorization_pending` (or `slow_down`) until the person has "
    "confirmed, then the session's bearer token",
    responses=error_responses(403, 404),
    openapi_extra=SIGN_IN,
)
async def device_token(services: ServicesDep, body: DeviceCode) -> SessionToken:
    return await _token(services, await services.sessions.device_finish(body.device_code))


@router.post(
    "/cli/token",
    summary="The session a browser sign-in handed to `modelhost login --browser` (its one-time `code`)",
    openapi_extra=SIGN_IN,
)
async def cli_token(services: ServicesDep, body: HandoffCode) -> SessionToken:
    return await _token(services, await asyncio.to_thread(services.sessions.cli_token, body.code))


async def _token(services: Services, secret: str) -> SessionToken:
    """A session handed to the CLI: its secret (shown once), whose it is and until when."""
    view = await asyncio.to_thread(services.sessions.view, secret)
    return SessionToken(session_token=secret, email=view.email, expires_at=view.expires_at)
