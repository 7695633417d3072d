"""Migration 0029 (issue 70: people who sign in apart from people an admin made, invitations, keys bound
to their membership, sessions renewed) on a database in use: nothing is lost, and what is new is filled
in from what was there."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import ApiKey, Membership, SsoSession, User

THEN = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
ROWS = (
    "INSERT INTO accounts (id, name, credits_granted_micro, created_at) VALUES ('acct_a', 'a', 0, :t)",
    "INSERT INTO users (id, email, subject, created_at) VALUES ('user_in', 'a@x.com', 'sub-a', :t), "
    "('user_made', 'b@x.com', NULL, :t)",
    "INSERT INTO memberships (user_id, account_id, role, created_at, source) VALUES "
    "('user_in', 'acct_a', 'admin', :t, 'sso'), ('user_made', 'acct_a', 'developer', :t, 'invite')",
    "INSERT INTO sso_sessions (id, secret_hash, user_id, account_id, operator, csrf_token, id_token, "
    "created_at, last_seen_at) VALUES ('ses_a', 'h', 'user_in', 'acct_a', false, 'c', 't', :t, :t)",
    "INSERT INTO api_keys (id, account_id, secret_hash, secret_prefix, created_at, user_id) VALUES "
    "('key_made', 'acct_a', 'kh', 'mh-', :t, 'user_made')",
)


def test_upgrading_keeps_people_their_sessions_and_memberships_and_dates_what_is_new(
    database_url: str,
) -> None:
    database = Database(database_url)
    try:
        migrate.upgrade(database, "0028")
        with database.engine.begin() as conn:
            for statement in ROWS:
                conn.execute(sa.text(statement), {"t": THEN.replace(tzinfo=None)})
        migrate.upgrade(database)
        with database.transaction() as session:
            # on SQLite the users table is rebuilt: its dependants' rows stay (foreign keys off meanwhile)
            assert session.get(SsoSession, "ses_a") is not None
            assert session.get(Membership, ("user_in", "acct_a")) is not None
            signed_in, made = session.get(User, "user_in"), session.get(User, "user_made")
            assert signed_in is not None and made is not None
            assert (signed_in.signed_in_at, made.signed_in_at) == (THEN, None)  # their newest session
            key = session.get(ApiKey, "key_made")
            assert key is not None and key.member_since == THEN  # under the membership there was
            session.add(User(id="user_twin", email="a@x.com", subject="sub-b", created_at=THEN))
        with database.transaction() as session:  # people who sign in may share an email
            twin = session.get(User, "user_twin")
            assert twin is not None
            session.delete(twin)  # (a downgrade makes emails unique again)
        command.downgrade(migrate.alembic_config(database), "0028")
        with database.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM memberships")).scalar() == 2
            assert conn.execute(sa.text("SELECT count(*) FROM sso_sessions")).scalar() == 1
        migrate.upgrade(database)
    finally:
        database.dispose()
