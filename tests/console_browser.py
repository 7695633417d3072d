"""A Chromium tab signed in to the console with a key, for the tests of features whose pages live beside
their own servers (tests/test_console.py has its own module-wide browser)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def signed_in(url: str, key: str) -> Iterator[tuple[Any, list[str]]]:
    """The console at `url`, signed in with `key`: its page and the page errors seen (a test asserts
    there are none). Skips the test where Debian's chromium is not installed."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{url}/console")
            page.fill("#sign-in-key", key)
            page.click("#sign-in button")
            page.wait_for_selector("#balance")
            yield page, errors
        finally:
            browser.close()
