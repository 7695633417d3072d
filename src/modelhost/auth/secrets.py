"""Key secrets: `mh-` plus 256 random bits, stored only as their SHA-256.

A fast hash is safe here because the secret is high-entropy (no dictionary to try); it also keeps
the per-request cost of authentication to microseconds.
"""

from __future__ import annotations

import hashlib
import re
import secrets

SECRET_PREFIX = "mh-"
_SECRET_SHAPE = re.compile(r"^mh-[A-Za-z0-9_-]{16,128}$")


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def looks_like_secret(token: str) -> bool:
    """Reject malformed tokens before any lookup (and before they reach the cache)."""
    return bool(_SECRET_SHAPE.fullmatch(token))


def display_prefix(secret: str) -> str:
    return secret[:10]
