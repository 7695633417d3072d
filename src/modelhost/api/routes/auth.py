"""Single sign-on (docs/access.md): the sign-in through the OpenID provider, the session it opens (a
cookie), switching accounts, signing out. Public routes: the session's own cookie is their credential."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import RedirectResponse

from modelhost.api.deps import SESSION_COOKIE, ServicesDep, check_csrf, session_secret
from modelhost.api.errors import error_responses
from modelhost.api.routes.users import present_invitation
from modelhost.auth.anonymous import COST, SIGN_IN_COST
from modelhost.container import Services
from modelhost.errors import InvalidAPIKey, InvalidRequest
from modelhost.protocol.common import Deleted
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
from modelhost.services.sessions import LOGIN_SECONDS, SIGN_IN_COOKIE, Holder

# a sign-in's step writes a row or asks the identity provider: it costs the anonymous throttle more
SIGN_IN = {COST: SIGN_IN_COST}
router = APIRouter(prefix="/v1/auth", tags=["sign-in"], responses=error_responses(400, 401))
COOKIE_PATH = "/v1/auth"  # the sign-in cookie goes back to the sign-in routes only


async def _holder(request: Request, services: Services) -> tuple[str, Holder]:
    """The request's session: a signed-in CLI's bearer token, else the browser's cookie (401 without
    either, or once it has ended), in whatever account it acts (a person with only invitations acts in
    none); a change made with the cookie must send the session's CSRF token."""
    found = session_secret(request)
    holder = await services.sessions.holder(found[0]) if found is not None else None
    if found is None or holder is None:
        raise InvalidAPIKey("Not signed in, or the session has ended; sign in again.", code="session_ended")
    if found[1]:
        check_csrf(request, holder.csrf)
    return found[0], holder


def _secure(services: Services) -> bool:
    return (services.settings.public_url or "").startswith("https://")


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
    session goes there (a one-time code, with `cli_state` back) instead of into a cookie. The sign-in
    is bound to this browser by a sealed cookie (`modelhost_sign_in`) its callback checks."""
    if (cli_port is None) != (cli_state is None):
        raise InvalidRequest("Give cli_port and cli_state together.", param="cli_state")
    loopback = (cli_port, cli_state) if cli_port is not None and cli_state is not None else None
    started = await services.sessions.start(return_to, login_hint, loopback)
    answer = RedirectResponse(started.url, status_code=302, headers={"Cache-Control": "no-store"})
    answer.set_cookie(
        SIGN_IN_COOKIE,
        started.cookie,
        max_age=LOGIN_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="lax",  # sent on the provider's top-level redirect back to the callback
        secure=_secure(services),
    )
    return answer


@router.get(
    "/callback",
    summary="Where the OpenID provider sends the browser back: opens the session (a cookie)",
    status_code=302,
    responses=error_responses(403),
    openapi_extra=SIGN_IN,
)
async def callback(
    request: Request,
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
    signed_in = await services.sessions.finish(code, state, request.cookies.get(SIGN_IN_COOKIE))
    answer = RedirectResponse(signed_in.return_to, status_code=302, headers={"Cache-Control": "no-store"})
    answer.delete_cookie(
        SIGN_IN_COOKIE, path=COOKIE_PATH, httponly=True, samesite="lax", secure=_secure(services)
    )
    if signed_in.secret is None:  # handed to the CLI's loopback
        return answer
    answer.set_cookie(
        SESSION_COOKIE,
        signed_in.secret,
        max_age=services.settings.session_max_seconds,
        path="/",
        httponly=True,
        samesite="lax",
        secure=_secure(services),
    )
    return answer


@router.get(
    "/session", summary="The signed-in session: who, which account, invitations offered, its CSRF token"
)
async def session_info(request: Request, services: ServicesDep) -> SessionInfo:
    secret, _ = await _holder(request, services)
    return await _info(services, secret)


async def _info(services: Services, secret: str) -> SessionInfo:
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
        invitations=[present_invitation(i) for i in view.invitations],
        csrf_token=view.csrf_token,
        expires_at=view.expires_at,
    )


@router.post(
    "/session/account",
    summary="Act in another of your accounts (`account_id`; null: as the operator, where you are one)",
    responses=error_responses(403, 404),
)
async def switch_account(request: Request, services: ServicesDep, body: SessionAccount) -> SessionInfo:
    secret, _ = await _holder(request, services)
    await asyncio.to_thread(services.sessions.switch, secret, body.id)
    return await _info(services, secret)


@router.post(
    "/invitations/{invitation_id}/accept",
    summary="Accept an invitation offered to you: a member of its account, where the session now acts",
    responses=error_responses(403, 404),
)
async def accept_invitation(
    request: Request, services: ServicesDep, invitation_id: str = Path(max_length=64)
) -> SessionInfo:
    secret, holder = await _holder(request, services)
    await asyncio.to_thread(services.sessions.accept, holder, invitation_id)
    return await _info(services, secret)


@router.post(
    "/invitations/{invitation_id}/decline",
    summary="Decline an invitation offered to you (it is withdrawn)",
    responses=error_responses(403, 404),
)
async def decline_invitation(
    request: Request, services: ServicesDep, invitation_id: str = Path(max_length=64)
) -> Deleted:
    _, holder = await _holder(request, services)
    await asyncio.to_thread(services.sessions.decline, holder, invitation_id)
    return Deleted(id=invitation_id, object="invitation.deleted")


@router.post("/logout", summary="Sign out: the session ends; the provider's logout URL where it has one")
async def logout(request: Request, services: ServicesDep) -> SignedOut:
    secret, _ = await _holder(request, services)
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
