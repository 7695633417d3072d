"""The exception hierarchy behind the one error body `{"error": {message, type, code, param}}`.

Services raise these; one handler in `api.errors` turns any of them into a response. Nothing else
in the code builds error bodies. A batch item's error, which is one item's output rather than an
exception (`tasks.base.TaskHandler`), is built and read here too: `item_error`, `error_of`,
`is_item_error`.
"""

from __future__ import annotations

import errno
from typing import Any


class ModelhostError(Exception):
    """Base of every error a client may see. Subclasses fix the status, type and code."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        """The one error body, `{"error": {message, type, code, param}}`: what the API's handler and the
        HTTP server's own answers (`server.http`) send."""
        detail = {"message": self.message, "type": self.error_type, "code": self.code, "param": self.param}
        return {"error": detail}


# Anthropic's error types by status (the Messages API's routes answer in Anthropic's shape: `anthropic_body`)
ANTHROPIC_TYPES = {
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_body(exc: ModelhostError) -> dict[str, object]:
    """The same error in Anthropic's shape, `{"type": "error", "error": {type, message}}`, with the same
    status: what `/v1/messages*` answer (docs/messages.md, "Errors"), so that Anthropic's SDKs raise their
    own exception classes. A full deployment queue (`Overloaded`) is Anthropic's `overloaded_error`."""
    if isinstance(exc, Overloaded):
        kind = "overloaded_error"
    elif exc.status_code < 500:
        kind = ANTHROPIC_TYPES.get(exc.status_code, "invalid_request_error")
    else:
        kind = ANTHROPIC_TYPES.get(exc.status_code, "api_error")
    message = (
        f"{exc.param}: {exc.message}" if exc.param and not exc.message.startswith(exc.param) else exc.message
    )
    return {"type": "error", "error": {"type": kind, "message": message}}


def item_error(
    message: str, param: str | None = None, code: str | None = None, *, internal: bool = False
) -> dict[str, Any]:
    """A batch item's error as its output, `{"error": {message, param, code}}`: that item's 400 (`param`
    names the field to fix; the other items of its batch are unaffected), or, `internal`, the replica's
    fault (a 503). The one builder of it, in the worker's handlers, the engines and the Ray backend;
    the gateway reads it (`runtime.gateway.dispatch.item_failure`)."""
    error: dict[str, Any] = {"message": message, "param": param, "code": code}
    if internal:
        error["internal"] = True
    return {"error": error}


def error_of(exc: ModelhostError) -> dict[str, Any]:
    """A client error raised while preparing one item (bad media, bad parameter) as its output."""
    return item_error(exc.message, exc.param, exc.code)


def is_item_error(output: dict[str, Any]) -> bool:
    """Whether a batch item's output is its error (`item_error`) rather than its answer."""
    return "error" in output


def param_name(field: str, index: int, count: int) -> str:
    """`image` for a single input, `image[2]` for the third of a list: what error bodies name."""
    return field if count == 1 else f"{field}[{index}]"


class InvalidRequest(ModelhostError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidMedia(InvalidRequest):
    """An image, audio or video input that cannot be read: bad base64, not decodable, too large,
    a URL to a private address, a path outside the media root..."""

    code = "invalid_media"


class EndpointNotSupported(ModelhostError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "endpoint_not_supported"


class InvalidAPIKey(ModelhostError):
    """Missing, malformed, wrong, revoked or out-of-scope key (api.md §5)."""

    status_code = 401
    error_type = "InvalidAPIKeyError"
    code = "invalid_api_key"


class PermissionDenied(ModelhostError):
    """A valid key whose role does not give the route's action (`auth.roles`; docs/access.md)."""

    status_code = 403
    error_type = "permission_error"
    code = "permission_denied"


class ExpiredAPIKey(InvalidAPIKey):
    """A key past its `expires_at` (set at creation, or by rotating it: its grace period ended)."""

    code = "expired_api_key"


class InsufficientCredits(ModelhostError):
    status_code = 402
    error_type = "insufficient_credits_error"
    code = "insufficient_credits"


class NotFound(ModelhostError):
    status_code = 404
    error_type = "not_found_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"

    def __init__(self, model: str | None = None) -> None:
        super().__init__("Model not found", param="model")
        self.model = model


class MethodNotAllowed(ModelhostError):
    status_code = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(ModelhostError):
    """The client stopped sending a request's headers or body (answered by the HTTP server itself)."""

    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class Conflict(ModelhostError):
    status_code = 409
    error_type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(ModelhostError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class Overloaded(ModelhostError):
    status_code = 429
    error_type = "overloaded_error"
    code = "overloaded"


class RateLimitExceeded(ModelhostError):
    """A key's or account's rate limit (docs/limits.md). As OpenAI's, the type names the limit reached:
    the subclasses below."""

    status_code = 429
    error_type = "requests"
    code = "rate_limit_exceeded"


class RequestsLimitReached(RateLimitExceeded):
    error_type = "requests"


class TokensLimitReached(RateLimitExceeded):
    error_type = "tokens"


class ConcurrencyLimitReached(RateLimitExceeded):
    error_type = "concurrent_requests"


class TooManyFailedKeys(RateLimitExceeded):
    """One client address sent too many wrong keys in a minute (`auth.failures`): keys it presents are
    not looked up until `Retry-After` has passed."""

    error_type = "requests"
    code = "too_many_failed_keys"


class TooManyAnonymousRequests(RateLimitExceeded):
    """One client address sent more requests without a key than the anonymous throttle allows
    (`auth.anonymous`): answered without running the route until `Retry-After` has passed."""

    error_type = "requests"
    code = "too_many_anonymous_requests"


class InsufficientQuota(ModelhostError):
    """An account's spend cap (credits per day or month) is reached: OpenAI's 429 for a quota."""

    status_code = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


class ClientClosedRequest(ModelhostError):
    """The client went away; nobody reads this answer, but metrics and logs see status 499."""

    status_code = 499
    error_type = "client_closed_request"
    code = "client_closed_request"


class DeploymentUnavailable(ModelhostError):
    status_code = 503
    error_type = "service_unavailable_error"
    code = "deployment_unavailable"


class ServiceUnavailable(ModelhostError):
    status_code = 503
    error_type = "service_unavailable_error"
    code = "service_unavailable"


class InsufficientCapacity(ServiceUnavailable):
    """The deployment cannot be loaded now: the memory budget is held by deployments that are busy,
    pinned (hot) or loaded too recently to evict, and none made room within the wait
    (docs/runtime.md, "Capacity"). The message says what it needs and what holds the budget."""

    code = "insufficient_capacity"


class CapacityConflict(Conflict):
    """A hot deployment that cannot fit beside the other hot ones (or a footprint larger than the whole
    budget): refused when it is created or changed, with what it needs and what is pinned."""

    code = "insufficient_capacity"


class BaseNotShared(Conflict):
    """An adapter deployment whose shared base the operator stopped sharing: detached from it, it serves
    nothing (docs/adapters.md, "Unsharing a base"). The message names the base and says what to do."""

    code = "base_not_shared"


class DatabaseUnavailable(ServiceUnavailable):
    """The database cannot be reached (stopped, restarting, out of connections). Nothing was written:
    the transaction that met it rolled back. Retry after a moment; the pool reconnects by itself."""

    def __init__(self, message: str = "The database is unavailable; retry shortly.") -> None:
        super().__init__(message, headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})


DATABASE_RETRY_AFTER_SECONDS = 2


class InsufficientStorage(ModelhostError):
    """A write found its store full: the data directory's blob store, the database... The message says
    which. Nothing half-written is kept, so the same request succeeds once the operator frees space."""

    status_code = 507
    error_type = "insufficient_storage_error"
    code = "insufficient_storage"


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException | None) -> bool:
    """An `OSError` saying the disk (or the user's quota on it) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


class Crashed(ModelhostError):
    """The process running the request died while running it: its replica (`replica_crashed`) or, for a
    batch line, its gateway process (`gateway_crashed`). The request is not sent again, since it may be
    what killed the process (a poisoned request must cost one process, not every one it reaches); the
    OpenAI and Anthropic SDKs are asked not to send it again either (`x-should-retry: false`)."""

    status_code = 502
    code = "replica_crashed"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"x-should-retry": "false"})


class GatewayTimeout(ModelhostError):
    status_code = 504
    error_type = "timeout_error"
    code = "timeout"


class InternalError(ModelhostError):
    """Raised for nothing; the handler maps unexpected exceptions to this shape without details."""


def rebuild(
    name: str, message: str, *, param: str | None, code: str | None, headers: dict[str, str]
) -> ModelhostError:
    """The error another process raised, as the same class here (it crossed the control socket by
    name): the caller's client sees the same status, type and code as if it had been raised here."""
    cls = _by_name().get(name, ModelhostError)
    error = cls.__new__(cls)
    ModelhostError.__init__(error, message, param=param, code=code, headers=headers)
    return error


def _by_name() -> dict[str, type[ModelhostError]]:
    found: dict[str, type[ModelhostError]] = {"ModelhostError": ModelhostError}
    pending = [ModelhostError]
    while pending:
        for sub in pending.pop().__subclasses__():
            found[sub.__name__] = sub
            pending.append(sub)
    return found


class McpServerFailed(ModelhostError):
    """A hosted MCP tool's server could not be reached or could not list its tools, before any answer:
    424, as OpenAI answers it (the request was fine; a server it depends on failed)."""

    status_code = 424
    error_type = "invalid_request_error"
    code = "mcp_server_error"
