"""Key secrets: `mh-` plus 256 random bits, stored only as their SHA-256.

A fast hash is safe here because the secret is high-entropy (no dictionary to try); it also keeps
the per-request cost of authentication to microseconds.
"""

from __future__ import annotations

import hashlib
import math
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


ADMIN_KEY_MIN_BITS = 128
# A stretch this long that repeats or steps (below) counts for nothing. Random keys never have one: in 32
# random hex characters the chance is about 1 in 10 million (1 in 10 billion in token_urlsafe's)
PATTERN_RUN = 8
# Repeats of a longer period are not looked for: one copy of more than 64 characters is judged as random
# as any other characters, and that is already more than 128 bits
MAX_PERIOD = 64
MAKE_ONE = (
    "make one with `openssl rand -hex 32` or `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
)
_HEX = frozenset("0123456789abcdef")
_CLASSES = (  # (size, its characters) of the alphabets a key is judged by
    (26, frozenset("abcdefghijklmnopqrstuvwxyz")),
    (26, frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")),
    (10, frozenset("0123456789")),
    (33, frozenset(" !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")),
)
OTHER_CLASS = 128  # characters outside printable ASCII, as one class


def admin_key_bits(key: str) -> float:
    """The bits of guessing an admin key is estimated to take: log2 of its alphabet's size times the
    characters that are not part of a pattern.

    - The alphabet is what the key uses, by class: 16 for a key of hexadecimal digits only (one case),
      else the sum of the classes it has characters of (lowercase 26, uppercase 26, digits 10, ASCII
      punctuation and space 33, anything else 128).
    - A pattern is a stretch of at least `PATTERN_RUN` characters each of which follows from those
      before it: the character a fixed distance back (a repeat of a period up to `MAX_PERIOD`:
      `aaaa…`, `abab…`, a 16-letter word written twice), or the previous one plus the same step
      (`0123…`, `aceg…`, `zyxw…`); such a stretch counts for nothing.

    So 32 random hex characters (`openssl rand -hex 16`) give 128 bits and `secrets.token_urlsafe(24)`
    about 190; a repeated or sequential key gives far less. Words are not recognised: a key that is a
    sentence is judged as random letters, so make keys with a random generator (`MAKE_ONE`)."""
    if not key:
        return 0.0
    if set(key.lower()) <= _HEX and (key == key.lower() or key == key.upper()):
        alphabet = 10 if key.isdigit() else 16
    else:
        alphabet = sum(size for size, members in _CLASSES if not members.isdisjoint(key))
        alphabet += OTHER_CLASS if any(ord(c) > 126 or ord(c) < 32 for c in key) else 0
    return (len(key) - len(_patterned(key))) * math.log2(max(alphabet, 2))


def _patterned(key: str) -> set[int]:
    """The positions of `key` that are part of a pattern (`admin_key_bits`)."""
    codes = [ord(c) for c in key]
    n = len(codes)
    periods = range(1, min(n // 2, MAX_PERIOD) + 1)
    rules = [[i >= p and codes[i] == codes[i - p] for i in range(n)] for p in periods]
    rules.append([i >= 2 and codes[i] - codes[i - 1] == codes[i - 1] - codes[i - 2] for i in range(n)])
    patterned: set[int] = set()
    for follows in rules:
        start = None
        for i in range(n + 1):
            if i < n and follows[i]:
                start = i if start is None else start
                continue
            if start is not None and i - start >= PATTERN_RUN:
                patterned.update(range(start, i))
            start = None
    return patterned


def admin_key_weakness(key: str) -> str | None:
    """Why an operator's admin key is too weak to serve with, or None. The admin key opens every
    account, so it must take at least `ADMIN_KEY_MIN_BITS` of guessing (`admin_key_bits`): any 32
    random hex characters, `secrets.token_urlsafe(24)`, and what `make run` and `quickstart` write
    (`mh-admin-` and `secrets.token_urlsafe(24)`) pass; a short, repeated or sequential key does not."""
    bits = admin_key_bits(key)
    if bits >= ADMIN_KEY_MIN_BITS:
        return None
    return (
        f"MODELHOST_ADMIN_KEY is too weak: about {int(bits)} bits of guessing, estimated from its length "
        f"and the characters it uses (repeated or sequential stretches count for nothing), where at least "
        f"{ADMIN_KEY_MIN_BITS} are needed; {MAKE_ONE}"
    )
