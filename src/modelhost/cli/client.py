"""A small HTTP client for the CLI: the CLI drives the same API every other client uses."""

from __future__ import annotations

from typing import Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """Print one readable error line (never markup, never wrapped mid-word) and exit 1."""
    err.print("[red]error:[/red] " + escape(message), soft_wrap=True)
    raise typer.Exit(1)


class ApiClient:
    def __init__(self, url: str, key: str | None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request; on an error body print its message and exit 1."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.http.base_url}: {exc}")
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                detail = f"{error['message']} ({response.status_code} {error.get('code')})"
            except (ValueError, KeyError, TypeError):
                detail = f"HTTP {response.status_code}: {response.text[:200]}"
            fail(detail)
        try:
            return response.json()
        except ValueError:
            fail(f"the server answered {response.status_code} with a body that is not JSON")
