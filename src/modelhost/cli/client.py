"""A small HTTP client for the CLI: the CLI drives the same API every other client uses."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def watch(
    current: dict[str, Any],
    refresh: Callable[[dict[str, Any]], dict[str, Any]],
    report: Callable[[dict[str, Any]], Iterable[str]],
    ended: Collection[str],
    every: float,
) -> dict[str, Any]:
    """Look at a piece of work (a batch, an eval run, a fine-tuning job) every `every` seconds until its
    `status` is one of `ended`, and answer it then. What `report` says of each look is printed on
    stderr, a line each, so that stdout holds only the answer (a table, or JSON for a script)."""
    while True:
        for line in report(current):
            err.print(line, soft_wrap=True, markup=False, highlight=False)
        if current["status"] in ended:
            return current
        time.sleep(every)
        current = refresh(current)


def when_changed(describe: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], list[str]]:
    """A `report` for `watch`: `describe`'s line, each time it differs from the last one printed."""
    shown: list[str] = []

    def report(current: dict[str, Any]) -> list[str]:
        line = describe(current)
        if shown and shown[-1] == line:
            return []
        shown.append(line)
        return [line]

    return report


def fail(message: str) -> NoReturn:
    """Print one readable error line (never markup, never wrapped mid-word) and exit 1."""
    err.print("[red]error:[/red] " + escape(message), soft_wrap=True)
    raise typer.Exit(1)


class ApiClient:
    def __init__(self, url: str, key: str | None, timeout: float = 60.0, anonymous: bool = False) -> None:
        """Calls with `key`; without one, with the session `modelhost login` kept for `url` (unless
        `anonymous`)."""
        if not key and not anonymous:
            from modelhost.cli.session import stored_token  # the session module imports this one

            key = stored_token(url)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def refuse(self, response: httpx.Response) -> None:
        """Exit 1 with the API's error message where `response` is an error."""
        _refuse_error(response)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request; on an error body print its message and exit 1."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.http.base_url}: {exc}")
        _refuse_error(response)
        try:
            return response.json()
        except ValueError:
            fail(f"the server answered {response.status_code} with a body that is not JSON")

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A response whose body is read as it arrives (a file's content, never held whole in memory);
        errors as `call` prints them, also those that cut the transfer short."""
        reached = False
        try:
            with self.http.stream(method, path, **kwargs) as response:
                reached = True
                if response.status_code >= 400:
                    response.read()
                    _refuse_error(response)
                yield response
        except httpx.HTTPError as exc:
            where = self.http.base_url
            fail(f"the transfer from {where} failed: {exc}" if reached else f"cannot reach {where}: {exc}")


def _refuse_error(response: httpx.Response) -> None:
    """Exit 1 with the API's error message where the response is an error."""
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        detail = f"{error['message']} ({response.status_code} {error.get('code')})"
    except (ValueError, KeyError, TypeError):
        detail = f"HTTP {response.status_code}: {response.text[:200]}"
    fail(detail)
