"""What an import keeps secret while it runs: its credentials and its source as given (a presigned URL
is a credential too), sealed with Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`) before they reach
the database, opened only by the runner that fetches, and dropped when the import ends.

The key is the operator's `MODELHOST_SECRETS_KEY`, else one made once and kept in the data directory
(`secrets.key`, mode 0600, linked into place whole, so that two gateways starting together agree on
one).
A database copied without that key reveals nothing of them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from modelhost.config import Settings

KEY_FILE = "secrets.key"


class Sealer:
    """Seals and opens JSON values with one Fernet key."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def from_settings(cls, settings: Settings) -> Sealer:
        configured = settings.secrets_key
        if configured is not None:
            return cls(configured.get_secret_value().encode())
        return cls(_key_file(settings.data_dir))

    def seal(self, value: Any) -> str:
        return self._fernet.encrypt(json.dumps(value).encode()).decode()

    def open(self, token: str) -> Any:
        """The sealed value; ValueError when this key did not seal it (the key changed)."""
        try:
            return json.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            raise ValueError("sealed with another key") from None


def _key_file(data_dir: Path) -> bytes:
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        temp = data_dir / f".{KEY_FILE}.{os.getpid()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(Fernet.generate_key())
        with contextlib.suppress(FileExistsError):  # linked whole, never seen half written; else theirs
            os.link(temp, path)
        temp.unlink()
    return path.read_bytes().strip()
