"""A small HTTP client for the CLI: the CLI drives the same API every other client uses."""

from __future__ import annotations

from typing import Any

import httpx
import typer
from rich.console import Console

err = Console(stderr=True)


class ApiClient:
    def __init__(self, url: str, key: str | None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request; on an error body print its message and exit 1."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            err.print(f"[red]error:[/red] cannot reach {self.http.base_url}: {exc}")
            raise typer.Exit(1) from exc
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                detail = f"{error['message']} ({response.status_code} {error.get('code')})"
            except (ValueError, KeyError, TypeError):
                detail = f"HTTP {response.status_code}: {response.text[:200]}"
            err.print(f"[red]error:[/red] {detail}")
            raise typer.Exit(1)
        return response.json()
