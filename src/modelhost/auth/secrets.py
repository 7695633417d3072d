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


ADMIN_KEY_MIN_LENGTH = 32
ADMIN_KEY_MIN_DISTINCT = 16


def admin_key_weakness(key: str) -> str | None:
    """Why an operator's admin key is too weak to serve with, or None. The admin key opens every
    account, so it must be long and random: at least 32 characters, of which at least 16 distinct (a
    key of one repeated pattern is not random). `mh-admin-` and `secrets.token_urlsafe(24)` (what
    `make run` and `quickstart` write) has 32 random characters after its prefix."""
    if len(key) < ADMIN_KEY_MIN_LENGTH:
        return f"MODELHOST_ADMIN_KEY has {len(key)} characters; it needs at least {ADMIN_KEY_MIN_LENGTH}"
    if len(set(key)) < ADMIN_KEY_MIN_DISTINCT:
        return (
            f"MODELHOST_ADMIN_KEY repeats a few characters ({len(set(key))} distinct); it needs at least "
            f"{ADMIN_KEY_MIN_DISTINCT} distinct random characters"
        )
    return None
