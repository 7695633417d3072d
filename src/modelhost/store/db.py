"""Engine and transactions. One `Database` per process (per gateway), shared by all services.

While the database cannot be reached (a PostgreSQL restart, a network cut), every transaction fails with
`DatabaseUnavailable` (503, `Retry-After`), never an unexpected error: the transaction rolled back, so
a write that answered 503 did not happen. PostgreSQL's pool checks each connection before use
(`pool_pre_ping`) and opens new ones when the server is back: nothing has to be restarted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from modelhost.errors import DatabaseUnavailable, InsufficientStorage, is_disk_full

log = logging.getLogger("modelhost.store")

# How long opening a PostgreSQL connection may take: a server that does not answer (rather than refusing)
# must not hold a request for the operating system's TCP timeout (minutes).
CONNECT_TIMEOUT_SECONDS = 5
SQLITE_FULL = "database or disk is full"
POSTGRES_DISK_FULL = "53100"  # SQLSTATE of psycopg's `DiskFull`


def database_full(exc: BaseException) -> bool:
    """The database could not write for want of disk: SQLite's SQLITE_FULL, PostgreSQL's DiskFull, or
    the driver's own `OSError` (ENOSPC) wrapped by SQLAlchemy."""
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    return (
        is_disk_full(orig)
        or getattr(orig, "sqlite_errorname", None) == "SQLITE_FULL"
        or SQLITE_FULL in str(orig)
        or getattr(orig, "sqlstate", None) == POSTGRES_DISK_FULL
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL lets readers run beside the writer; busy_timeout makes writers queue instead of failing."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class Database:
    """Owns the engine. `transaction()` is the only way services touch the database."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite:
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            # no `pool_pre_ping`: a file's connection never goes stale, and the ping was a statement
            # more in every transaction (the background claims and limit syncs too: issue 71)
            self.engine: Engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_engine(
                url,
                pool_pre_ping=True,
                pool_size=10,
                max_overflow=20,
                pool_timeout=10,
                connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
            )
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: commit on success, roll back on any exception.

        A database out of disk is a 507 `insufficient_storage`, one that cannot be reached a 503
        `DatabaseUnavailable`: either way the transaction rolled back, so nothing was half-written, and
        the same call succeeds once the operator frees space or the database is back."""
        try:
            with self._sessions() as session, session.begin():
                yield session
        except DBAPIError as exc:
            if database_full(exc):
                log.warning("the database is full: a write failed (%s)", exc.orig)
                raise InsufficientStorage(
                    "Insufficient storage: the database is full, so nothing was written. "
                    "Retry once space has been freed."
                ) from exc
            if isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated:
                raise DatabaseUnavailable() from exc
            raise
        except PoolTimeout as exc:  # every connection of the pool busy or unopenable
            raise DatabaseUnavailable() from exc

    def wait_until_reachable(self, seconds: float) -> None:
        """Block until the database answers, for at most `seconds`, then go on (the first transaction
        fails as usual if it is still away). A container started beside its database (compose, a pod
        whose database is another pod) comes up first more often than not, and compose with podman does
        not wait on health conditions: retrying here is what makes the start order not matter. SQLite is
        a file: nothing to wait for."""
        if self.is_sqlite or seconds <= 0:
            return
        deadline = time.monotonic() + seconds
        while not self.ping():
            if time.monotonic() >= deadline:
                log.warning("the database is still unreachable after %.0f s: starting anyway", seconds)
                return
            log.warning("waiting for the database at %s", make_url(self.url).render_as_string())
            time.sleep(1)

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    def dispose(self) -> None:
        self.engine.dispose()
