"""The web console at `/console`: static HTML, JavaScript and CSS served by the gateway itself.

The console is a client of the public API like any other (it calls `/v1/...` with the key the user
typed); these routes only hand out its files, under a strict Content-Security-Policy: scripts, styles
and connections from this origin only, no inline script, no framing. Third-party assets (uPlot) are
copied into `static/vendor/` by `scripts/setup.sh` from the npm packages pinned in `console/`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

import modelhost
from modelhost.errors import NotFound

STATIC = Path(modelhost.__file__).parent / "console" / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob: data:; connect-src 'self'; frame-ancestors 'none'; object-src 'none'; "
    "base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".LICENSE": "text/plain; charset=utf-8",
}

router = APIRouter(include_in_schema=False)


@router.get("/console")
async def console_index() -> FileResponse:
    return _file("index.html")


@router.get("/console/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@router.get("/console/{path:path}")
async def console_asset(path: str) -> FileResponse:
    return _file(path)


def _file(path: str) -> FileResponse:
    """A file of the console, only from its folder and only of the types above."""
    root = STATIC.resolve()
    target = (root / path).resolve()
    media_type = TYPES.get(target.suffix)
    if media_type is None or not target.is_relative_to(root) or not target.is_file():
        raise NotFound(f"No console file at /console/{path}.")
    return FileResponse(target, media_type=media_type, headers=HEADERS)
