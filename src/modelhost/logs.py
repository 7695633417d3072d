"""Log lines that say which request they are about, and the request IDs behind them.

Every answer carries `x-request-id` (as OpenAI's API does: the openai SDK shows it as
`response._request_id`, for users to quote in a bug report). The ID is the caller's own `X-Request-Id`
when it is well-formed, else a new one; while the request runs it sits in a context variable, so every
log line written on its behalf (ours, uvicorn's access line) and the message of a 5xx error body name
it, and an operator finds the lines of the request a user reports with one grep.
"""

from __future__ import annotations

import logging
import re
import secrets
from contextvars import ContextVar
from typing import Any

REQUEST_ID: ContextVar[str | None] = ContextVar("modelhost_request_id", default=None)
# The request's trace ID while tracing is on (`modelhost.tracing`), named beside its request ID.
TRACE_ID: ContextVar[str | None] = ContextVar("modelhost_trace_id", default=None)
HEADER = "x-request-id"
# A caller's own ID is kept when it is this short and plain (a UUID, `req_...`, a trace ID); anything
# else (too long, spaces, control characters: log injection) is replaced by one of ours.
WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")


def new_request_id() -> str:
    """`req_` and 32 hex digits, the form of OpenAI's IDs."""
    return f"req_{secrets.token_hex(16)}"


def request_id_for(incoming: str | None) -> str:
    """The caller's ID when it is well-formed, else a new one."""
    if incoming is not None and WELL_FORMED.fullmatch(incoming):
        return incoming
    return new_request_id()


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (`-` outside a request) to every record its handler writes, and `trace`: the
    request's trace ID as ` trace=<id>` while tracing is on, else nothing (the line is as before)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        trace_id = TRACE_ID.get()
        record.trace = f" trace={trace_id}" if trace_id is not None else ""
        return True


def log_config(level: str = "info") -> dict[str, Any]:
    """uvicorn's logging (its error and access loggers) and ours (`modelhost.*`) on standard error, each
    line with its request ID: given to `uvicorn.Config(log_config=...)`, which applies it at start."""
    filters = {"request_id": {"()": RequestIdFilter}}
    stream = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "filters": ["request_id"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": filters,
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(asctime)s %(levelprefix)s %(name)s [%(request_id)s%(trace)s] %(message)s",
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": "%(asctime)s %(levelprefix)s [%(request_id)s%(trace)s] %(client_addr)s - "
                '"%(request_line)s" %(status_code)s',
            },
        },
        "handlers": {
            "default": {**stream, "formatter": "default"},
            "access": {**stream, "formatter": "access"},
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["access"], "level": level.upper(), "propagate": False},
            "modelhost": {"handlers": ["default"], "level": level.upper(), "propagate": False},
        },
    }
