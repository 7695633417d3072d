"""People in accounts: adding them (by email: one person, many accounts), their role in each, disabling
and removing them. Every change writes its audit row in its own transaction (`modelhost.audit`) and
makes every gateway process read keys again (a person's keys do what their role now gives:
`auth.authenticator`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from modelhost import audit
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.authority import authorize
from modelhost.auth.principal import Principal
from modelhost.auth.roles import Role
from modelhost.errors import Conflict, NotFound
from modelhost.store.db import Database
from modelhost.store.models import Membership, User
from modelhost.store.types import new_id, utcnow


@dataclass(frozen=True, slots=True)
class Member:
    """A person as a member of one account."""

    id: str
    email: str
    name: str | None
    role: Role
    disabled: bool
    created_at: datetime


def _member(user: User, membership: Membership) -> Member:
    return Member(
        user.id,
        user.email,
        user.name,
        Role(membership.role),
        membership.disabled_at is not None,
        membership.created_at,
    )


def _not_found() -> NotFound:
    return NotFound("User not found in this account", param="user_id", code="user_not_found")


class UserService:
    def __init__(self, database: Database, authenticator: Authenticator) -> None:
        self._database = database
        self._authenticator = authenticator

    def add(
        self, account_id: str, email: str, name: str | None, role: Role, caller: Principal | None
    ) -> Member:
        """Make `email` a member with `role` (the person is made on first use of the email, lower-cased):
        409 if already a member, 403 for a role that can do more than the caller (`auth.authority`)."""
        authorize(caller, (), grants=role)
        email = email.strip().lower()
        with self._database.transaction() as session:
            user = session.scalars(select(User).where(User.email == email)).one_or_none()
            if user is None:
                user = User(id=new_id("user"), email=email, name=name, created_at=utcnow())
                session.add(user)
                session.flush()
            elif session.get(Membership, (user.id, account_id)) is not None:
                raise Conflict(
                    f"{email} is already a member of this account.", param="email", code="member_exists"
                )
            membership = Membership(
                user_id=user.id, account_id=account_id, role=role.value, created_at=utcnow()
            )
            session.add(membership)
            session.flush()
            fields = {"email": email, "name": name, "role": role.value}
            audit.record(session, "user.added", "user", user.id, account_id, audit.created(fields))
            return _member(user, membership)

    def list_members(self, account_id: str) -> list[Member]:
        with self._database.transaction() as session:
            query = (
                select(User, Membership)
                .join(Membership, Membership.user_id == User.id)
                .where(Membership.account_id == account_id)
                .order_by(Membership.created_at, User.id)
            )
            return [_member(user, membership) for user, membership in session.execute(query)]

    def get(self, account_id: str, user_id: str) -> Member:
        with self._database.transaction() as session:
            user, membership = session.get(User, user_id), session.get(Membership, (user_id, account_id))
            if user is None or membership is None:
                raise _not_found()
            return _member(user, membership)

    def update(
        self,
        account_id: str,
        user_id: str,
        role: Role | None,
        disabled: bool | None,
        caller: Principal | None,
    ) -> Member:
        """Change a member's role or disable them (their keys here are refused with 401 `user_disabled`),
        effective on their next request on this gateway process, within `key_cache_seconds` on others.
        A member is changed, and a role given, only by someone who can do as much (`auth.authority`:
        an owner only by an owner)."""
        with self._database.transaction() as session:
            user = session.get(User, user_id)
            membership = session.get(Membership, (user_id, account_id), with_for_update=True)
            if user is None or membership is None:
                raise _not_found()
            authorize(caller, (Role(membership.role),), grants=role)
            before = {"role": membership.role, "disabled": membership.disabled_at is not None}
            if role is not None:
                membership.role = role.value
            if disabled is not None and disabled != (membership.disabled_at is not None):
                membership.disabled_at = utcnow() if disabled else None
            after = {"role": membership.role, "disabled": membership.disabled_at is not None}
            audit.record(session, "user.updated", "user", user_id, account_id, audit.diff(before, after))
            member = _member(user, membership)
        self._authenticator.forget_all()
        return member

    def remove(self, account_id: str, user_id: str, caller: Principal | None) -> None:
        """The person is no longer a member: their keys here are refused (401 `not_a_member`)."""
        with self._database.transaction() as session:
            membership = session.get(Membership, (user_id, account_id), with_for_update=True)
            if membership is None:
                raise _not_found()
            authorize(caller, (Role(membership.role),))
            audit.record(
                session, "user.removed", "user", user_id, account_id, audit.removed({"role": membership.role})
            )
            session.delete(membership)
        self._authenticator.forget_all()
