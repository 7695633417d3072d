"""The options every command that calls the API shares, declared once: the server, the key, `--json`."""

from __future__ import annotations

from typing import Annotated

import typer

DEFAULT_URL = "http://127.0.0.1:8000"

Url = Annotated[str, typer.Option("--url", envvar="MODELHOST_URL", help="Base URL of the server.")]
AccountKey = Annotated[
    str | None,
    typer.Option("--key", envvar="MODELHOST_API_KEY", help="Account key (mh-...).", show_default=False),
]
AdminKey = Annotated[
    str | None,
    typer.Option("--admin-key", envvar="MODELHOST_ADMIN_KEY", help="Admin key.", show_default=False),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# the size of a page of a list (the API's largest: 100)
PageLimit = Annotated[int, typer.Option(min=1, max=100, help="At most this many.")]
