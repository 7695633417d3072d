"""Dependencies declared once and injected: services, the caller's principal by kind."""

from __future__ import annotations

import asyncio
import functools
import hmac
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NoReturn, TypeVar

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection
from starlette.types import Scope

from modelhost import audit, tracing
from modelhost.api.disconnects import SCOPE_KEY as DISCONNECTS
from modelhost.api.disconnects import Disconnects
from modelhost.auth.authenticator import bearer_token
from modelhost.auth.limits import Admitted
from modelhost.auth.principal import Principal, PrincipalKind, acting_for
from modelhost.auth.quotas import Person
from modelhost.auth.roles import action_of
from modelhost.batches.files import Owner
from modelhost.container import Services
from modelhost.errors import (
    ClientClosedRequest,
    ExpiredAPIKey,
    InvalidAPIKey,
    PermissionDenied,
    TooManyFailedKeys,
)
from modelhost.routing import DeploymentRef, resolve_deployment
from modelhost.services.sessions import SESSION_PREFIX

T = TypeVar("T")
# A route's key check: the caller's principal, or None where the route lets this request through without a
# key (a signed file link: `require_caller_unless_signed`)
Guard = Callable[[Request], Awaitable[Principal | None]]
PRINCIPAL = "modelhost.principal"  # where the scope keeps the principal once a request's key is checked
# where the scope keeps the person a request counts towards (`auth.quotas.Person`; a person's key or session)
PERSON = "modelhost.person"
ADMITTED = "modelhost.admitted"  # where the scope keeps a rate-limited request's `Admitted` ticket
# where the scope keeps (deployment, artifact): the version that serves the request, which its answer names
# and the version metrics count
SERVED_ARTIFACT = "modelhost.artifact"
# where the scope keeps (the key check that ran, what it found): each runs once per request (`_once`)
GUARDED = "modelhost.guarded"
ARTIFACT_HEADER = b"x-modelhost-artifact"
# The mark of a batch line sent in-process by the batch runner (`api.batch_lines`), with its creator's
# principal already in the scope: it runs at low priority and outside the per-minute limits. No
# request from outside can carry it: a scope starts empty of our keys.
BATCH_LINE = "modelhost.batch_line"
# The version (artifact) a server-made request runs on, whatever its deployment's split says (an eval run
# of one version of a rollout: `api.batch_lines`); never from outside, as BATCH_LINE
PINNED_VERSION = "modelhost.pinned_version"
# A person signed in through the OpenID provider holds a session by this cookie (`services.sessions`)
SESSION_COOKIE = "modelhost_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Declared so that /docs shows the bearer scheme on every protected route; the header itself is
# read by `_authenticate`, which also handles malformed headers with our error body.
_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer mh-...`")


def get_services(request: HTTPConnection) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def _authenticate(request: HTTPConnection) -> Principal:
    """Cache first (no I/O on the hot path); the database only on a miss, off the event loop. Once per
    request: the key is checked before the route runs (`api.middleware.KeyFirst`), and the route's own
    dependency finds the principal in the scope. A client address that keeps sending wrong keys gets
    429 for the keys this gateway does not already know to be valid (`auth.failures`)."""
    checked: Principal | None = request.scope.get(PRINCIPAL)
    if checked is not None:
        _act_as(request, checked)
        return checked
    services = get_services(request)
    authenticator = services.authenticator
    authorization, api_key = _key_headers(request.scope)
    if not authorization and api_key is None and SESSION_COOKIE in request.cookies:
        by_cookie = await signed_in(request, request.cookies[SESSION_COOKIE], by_cookie=True)
        request.scope[PRINCIPAL] = by_cookie
        _act_as(request, by_cookie)
        return by_cookie
    with tracing.step("authenticate") as span:
        token = bearer_token(authorization, api_key)
        client = request.scope.get("client")  # (host, port), or None
        address = client[0] if client else ""
        if token.startswith(SESSION_PREFIX):  # a signed-in CLI's session (`modelhost login`)
            _refuse_while_guessing(services, address)
            try:
                session = await signed_in(request, token, by_cookie=False)
            except InvalidAPIKey:
                services.failed_keys.failed(address)
                raise
            request.scope[PRINCIPAL] = session
            _act_as(request, session)
            return session
        try:
            known, principal = authenticator.cached(token)
        except InvalidAPIKey:  # malformed
            _refuse_while_guessing(services, address)
            services.failed_keys.failed(address)
            raise
        if principal is None:
            _refuse_while_guessing(services, address)
            if not known:
                principal = await authenticator.loads.load(token, lambda: authenticator.load(token))
        if span is not None:
            span.set_attribute("modelhost.key.cached", known)
        if principal is None:
            services.failed_keys.failed(address)
            raise InvalidAPIKey("Invalid API key.")
        if authenticator.expired(principal):
            raise ExpiredAPIKey("This API key has expired; use another key or create a new one.")
        if principal.refusal is not None:
            code, message = principal.refusal
            raise InvalidAPIKey(message, code=code)
    request.scope[PRINCIPAL] = principal
    _act_as(request, principal)
    return principal


def _key_headers(scope: Scope) -> tuple[str | None, str | None]:
    """The request's `Authorization` and `X-API-Key` (the first of each), read from the scope in one
    pass: every keyed request asks, and Starlette's `Headers` would be built and searched twice."""
    authorization = api_key = None
    for name, value in scope["headers"]:  # ASGI gives header names lower-cased
        if name == b"authorization":
            if authorization is None:
                authorization = value.decode("latin-1")
        elif name == b"x-api-key" and api_key is None:
            api_key = value.decode("latin-1")
    return authorization, api_key


def session_secret(request: Request) -> tuple[str, bool] | None:
    """The request's sign-in session, as (secret, by cookie): a signed-in CLI's bearer token (`mhs-`),
    else, on a request with no key at all, the console's cookie; None without either."""
    authorization, api_key = _key_headers(request.scope)
    if authorization or api_key is not None:
        try:
            token = bearer_token(authorization, api_key)
        except InvalidAPIKey:
            return None
        return (token, False) if token.startswith(SESSION_PREFIX) else None
    cookie = request.cookies.get(SESSION_COOKIE)
    return (cookie, True) if cookie else None


async def signed_in(request: HTTPConnection, secret: str, by_cookie: bool) -> Principal:
    """The principal of a sign-in session (401 `session_ended` once it has ended). A state-changing
    request made with the console's cookie must also send the session's CSRF token (a bearer token is
    never sent by a browser on its own)."""
    found = await get_services(request).sessions.principal(secret)
    if found is None:
        raise InvalidAPIKey("This session has ended; sign in again.", code="session_ended")
    if by_cookie:
        check_csrf(request, found.csrf)
    return found


def check_csrf(request: HTTPConnection, csrf: str | None) -> None:
    """A state-changing request made with the console's cookie sends the session's CSRF token. A
    WebSocket has no method: a browser opens one cross-site with the cookie, so it needs the token too."""
    if request.scope.get("method") in SAFE_METHODS:
        return
    sent = request.headers.get(CSRF_HEADER, "")
    if csrf is None or not hmac.compare_digest(sent.encode(), csrf.encode()):
        raise PermissionDenied(
            f"A signed-in session's change needs its CSRF token in `{CSRF_HEADER}` (GET /v1/auth/session).",
            code="csrf_failed",
        )


def _refuse_while_guessing(services: Services, address: str) -> None:
    wait = services.failed_keys.retry_after(address)
    if wait is not None:
        raise TooManyFailedKeys(
            f"Too many invalid API keys from this address; retry in {wait} s.",
            headers={"Retry-After": str(wait)},
        )


async def trusted_caller(request: Request) -> bool:
    """Whether the request carries a valid key, checked as `_authenticate` does (cache first), without
    refusing it: the middleware asks this before the route's own key check, which then finds the key
    in the cache. A wrong key is not counted here (the key check counts it)."""
    authorization, api_key = _key_headers(request.scope)
    if not authorization and not api_key:
        secret = request.cookies.get(SESSION_COOKIE)
        return secret is not None and (await get_services(request).sessions.principal(secret)) is not None
    services = get_services(request)
    authenticator = services.authenticator
    try:
        token = bearer_token(authorization, api_key)
        known, principal = authenticator.cached(token)
    except InvalidAPIKey:
        return False
    if not known and services.failed_keys.retry_after(request.client.host if request.client else "") is None:
        principal = await authenticator.loads.load(token, lambda: authenticator.load(token))
    return principal is not None and not authenticator.expired(principal) and principal.refusal is None


def _act_as(request: HTTPConnection, principal: Principal) -> None:
    """The request's actor, for the audit rows its changes write (`modelhost.audit`: one context
    variable, read by the services, instead of an actor threaded through every service call)."""
    client = request.scope.get("client")  # (host, port), or None
    address = client[0] if client else None
    audit.acting(
        audit.Actor(
            principal.kind,
            principal.key_id,
            principal.account_id,
            address,
            principal.user_id,
            principal.email,
            principal.subject,
        )
    )


def _permit(request: HTTPConnection, principal: Principal) -> Principal:
    """The key's role gives the route's action (`auth.roles`, by the request's path: the batch runner's
    lines too; a WebSocket's opening is a `GET`), else 403. The operator's key is above accounts: its
    routes check nothing more."""
    if principal.kind is not PrincipalKind.ADMIN:
        action = action_of(request.scope.get("method", "GET"), request.scope["path"])
        if action not in principal.actions:
            raise PermissionDenied(
                f"This key's role ({principal.role}) does not allow {action} (docs/access.md).",
            )
    return principal


def _once(check: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """A route's key check, run once per request: first by `api.middleware.KeyFirst` before the body is
    read, whose answer (the principal, its role checked, the audit's actor set for this request's task)
    the route's own dependency then finds in the scope instead of checking it all again (issue 71: the
    second check cost every request about 4 % of the gateway's CPU). FastAPI reads the check's own
    signature (`functools.wraps`), so /docs still shows the bearer scheme."""

    @functools.wraps(check)
    async def once(request: Request, _doc: object = None) -> T:
        done: tuple[object, T] | None = request.scope.get(GUARDED)
        if done is not None and done[0] is once:
            return done[1]
        found = await check(request, _doc)
        request.scope[GUARDED] = (once, found)
        return found

    return once


@_once
async def require_admin(request: Request, _doc: object = Depends(_bearer)) -> Principal:
    if get_services(request).settings.admin_key_value is None and session_secret(request) is None:
        raise InvalidAPIKey("Admin routes are disabled: the operator has not set MODELHOST_ADMIN_KEY.")
    principal = await _authenticate(request)
    if principal.kind is not PrincipalKind.ADMIN:
        raise InvalidAPIKey("This route needs the admin key.")
    return principal


@_once
async def require_account(request: Request, _doc: object = Depends(_bearer)) -> Principal:
    principal = await _authenticate(request)
    if principal.kind is not PrincipalKind.ACCOUNT:
        raise InvalidAPIKey("This route needs an account key.")
    return _permit(request, principal)


@_once
async def require_caller(request: Request, _doc: object = Depends(_bearer)) -> Principal:
    """Inference and `/v1/models`: an account key or a deployment key."""
    return await caller(request)


async def caller(connection: HTTPConnection) -> Principal:
    """The key check of inference: an account key or a deployment key whose role calls models. Routes
    take it as `require_caller` (once per request); a WebSocket route calls it when its socket opens
    (the middleware that checks keys first sees HTTP requests only)."""
    principal = await _authenticate(connection)
    if principal.kind is PrincipalKind.ADMIN:
        raise InvalidAPIKey("The admin key cannot call this route; use an account or deployment key.")
    return _permit(connection, principal)


@_once
async def require_auditor(request: Request, _doc: object = Depends(_bearer)) -> Principal:
    """The audit log: an account key (its account's rows) or the admin key (every row)."""
    principal = await _authenticate(request)
    if principal.kind not in (PrincipalKind.ACCOUNT, PrincipalKind.ADMIN):
        raise InvalidAPIKey("This route needs an account key or the admin key.")
    return _permit(request, principal)


@_once
async def require_caller_unless_signed(request: Request, _doc: object = Depends(_bearer)) -> Principal | None:
    """A file's bytes (`GET /v1/files/{id}/content`): a generated file's signed link (`expires` and
    `signature` in the query: the link is the credential, checked by the file store) needs no key, and is
    throttled as every request without one; anything else needs a caller's key, as `require_caller`."""
    query = request.query_params
    if "signature" in query or "expires" in query:
        return None
    return await require_caller(request)


AdminPrincipal = Annotated[Principal, Depends(require_admin)]
AccountPrincipal = Annotated[Principal, Depends(require_account)]
CallerPrincipal = Annotated[Principal, Depends(require_caller)]
AuditorPrincipal = Annotated[Principal, Depends(require_auditor)]
GUARDS: tuple[Guard, ...] = (
    require_admin,
    require_account,
    require_caller,
    require_auditor,
    require_caller_unless_signed,
)


def guard_of(dependant: Dependant) -> Guard | None:
    """The key check a route declares (one of `GUARDS`, directly or through its other dependencies);
    None for a public route."""
    for dependency in dependant.dependencies:
        if dependency.call in GUARDS:
            guard: Guard = dependency.call
            return guard
        found = guard_of(dependency)
        if found is not None:
            return found
    return None


def account_id_of(principal: Principal) -> str:
    assert principal.account_id is not None
    return principal.account_id


def owner_of(principal: Principal) -> Owner:
    """Whose files and batches the caller sees (`batches.files.Owner`): a deployment key its own."""
    assert principal.account_id is not None and principal.key_id is not None
    return Owner(principal.account_id, principal.key_id, principal.kind is PrincipalKind.DEPLOYMENT)


async def deployment_for(
    request: HTTPConnection,
    principal: Principal,
    model: str | None,
    endpoint: str | None = None,
    *,
    user: str | None = None,
) -> DeploymentRef:
    """The deployment an inference request runs on, decided by `modelhost.routing` for this route.

    The endpoint is the matched route's path template, so the endpoint → task table is the only
    thing that decides support; no model is touched before this answers. The request was admitted with
    its key (credits, spend caps, rate limits: `api.admission`). `user` (the body's `user` field) keeps
    the caller on one version of a canary sticky by user; a request then runs on the version
    `DeploymentRef.with_version` chose (its `runtime_key`), which its answer names.
    """
    services = get_services(request)
    if endpoint is None:
        route = request.scope.get("route")
        endpoint = str(route.path) if route is not None else request.url.path
    account_id = account_id_of(principal)
    refs = services.deployments.cached_refs(account_id)
    if refs is None:
        refs = await services.deployments.ref_loads.load(
            account_id, lambda: services.deployments.refs(account_id)
        )
    deployment = resolve_deployment(principal, endpoint, model, refs)
    # its version (a rollout, a canary): the answer names it (`x-modelhost-artifact`, by RequestPath)
    subject = (user or principal.key_id) if deployment.sticky == "user" else principal.key_id
    pinned: str | None = request.scope.get(PINNED_VERSION)
    deployment = deployment.on_version(pinned) if pinned else deployment.with_version(subject)
    if deployment.serving_artifact is not None:
        request.scope[SERVED_ARTIFACT] = (deployment.id, deployment.serving_artifact)
        tracing.current_attributes({"modelhost.artifact_id": deployment.serving_artifact})
    if tracing.ENABLED:  # the request's span is named for its model (`api.middleware.RequestPath`)
        request.scope[tracing.MODEL] = model
    acting_for(principal, low=BATCH_LINE in request.scope)  # the key its replica's fair queuing counts
    return deployment


async def admit(request: HTTPConnection, principal: Principal, *, billed: bool = True) -> None:
    """Admit a request to a route that `api.admission` says costs the server (called by the key check,
    `api.middleware.KeyFirst`, for every such route: never by a route itself): refused with 402 once
    the account is out of credits and with 429 past its spend caps (when `billed`: it runs a model or
    stores bytes), with 429 over its person's quota (auth/quotas.py) and over its key's or account's
    rate limits (auth/limits.py; `api.middleware.RequestPath` gives the place back when the request
    ends, and adds its tokens to its person's use). Batch lines skip the per-minute limits, not the
    quotas (docs/limits.md)."""
    services = get_services(request)
    account_id = account_id_of(principal)
    with tracing.step("limits") as span:  # credits, spend caps, rate limits
        if billed:
            await services.billing.require_credits(account_id)
            await services.billing.require_within_caps(account_id, principal.account_limits)
        person = principal.person()
        counted = person is not None and PERSON not in request.scope  # once per request, as below
        if counted:
            assert person is not None
            await services.quotas.require_within(person, principal.quota)
        subjects = () if BATCH_LINE in request.scope else principal.limited()
        if subjects and ADMITTED not in request.scope:  # once per request, whatever models it names
            if span is not None:
                span.set_attribute("modelhost.rate_limited", True)
            request.scope[ADMITTED] = services.limits.admit(subjects)
        if counted:  # its tokens are added when it ends (`api.middleware.RequestPath`)
            assert person is not None
            request.scope[PERSON] = services.quotas.admitted(person)


def release_admission(scope: Scope, tokens: int) -> None:
    """An admitted request (or a realtime session) ended having used `tokens`: its place and tokens go
    back to the rate limiter, and its tokens to its person's use (`admit` took them). Once: what it
    gave back leaves the scope."""
    admitted: Admitted | None = scope.pop(ADMITTED, None)
    person: Person | None = scope.pop(PERSON, None)
    if admitted is None and person is None:
        return
    services: Services = scope["app"].state.services
    if admitted is not None:
        services.limits.release(admitted.ticket, tokens)
    if person is not None:
        services.quotas.ended(person, tokens)


async def run_inference(request: Request, deployment_id: str, item: dict[str, Any]) -> dict[str, Any]:
    """Run one item on a deployment; if the client disconnects first, its work is dropped."""
    return await await_or_disconnect(request, get_services(request).runtime.infer(deployment_id, item))


async def await_or_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or cancel it when the client goes away first (499, nobody reads it).

    `work` runs in this task. The gateway's HTTP server says when the connection is lost
    (`api.disconnects`): a callback cancels this task, no task of its own. Elsewhere (an in-process
    transport) one watcher task reads `receive()` until it says the client left, and cancels it."""
    this = asyncio.current_task()
    assert this is not None
    left = False

    def leave() -> None:
        nonlocal left
        left = True
        this.cancel()

    disconnects: Disconnects | None = request.scope.get(DISCONNECTS)
    if disconnects is not None:
        if disconnects.gone:
            _closed(work)
        disconnects.add(leave)
        stop: Callable[[], Any] = functools.partial(disconnects.discard, leave)
    else:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass  # the body has been read: `receive` only reports the client leaving
            leave()

        stop = asyncio.get_running_loop().create_task(watch()).cancel
    try:
        return await work
    except asyncio.CancelledError:
        if left and this.uncancel() == 0:
            _closed(None)
        raise
    finally:
        stop()


def _closed(work: Awaitable[Any] | None) -> NoReturn:
    """499: the client left before the answer was ready (`work`, never awaited, is closed)."""
    if inspect.iscoroutine(work):
        work.close()
    elif isinstance(work, asyncio.Future):
        work.cancel()
    raise ClientClosedRequest("The client closed the connection before the answer was ready.") from None
