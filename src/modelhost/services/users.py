"""People in accounts: adding them, their role in each, disabling and removing them, ending everything
they hold; invitations, kept apart from people, and their acceptance by the person who signs in. Every
change writes its audit row in its own transaction (`modelhost.audit`) and makes every gateway process
read keys again (a person's keys do what their role now gives: `auth.authenticator`). Every action on a
person or a membership is authorized by `auth.authority` (the target's role against the caller's).

**Two kinds of people** (`store.models.User`). A person who signs in is made at their first sign-in and
found again by the provider's `sub` (`services.sessions`). A person without sign-in is made here by an
admin's `POST /v1/users`, known by the email the admin typed: the holder of the keys that admin makes
for them, as before single sign-on. A sign-in never becomes one of them, and is never refused because
of one: an email an admin typed proves nothing about who signs in with it.

**Invitations.** An admin invites an email to a role (`POST /v1/invitations`). The invitation is
not a person: it is offered to whoever signs in with that email *verified by the provider*
(`email_verified: true`; `MODELHOST_OIDC_TRUST_EMAIL` believes an unverified one), and becomes a
membership only when they accept it. An invitation lasts `INVITATION_DAYS`.

**Removal sticks.** Removing a person writes a `RemovedMembership`: their provider groups do not make
them a member of that account again until they accept a new invitation there (or, for a person without
sign-in, an admin adds them again). The keys they made or were given there never work again, even then:
a person's key works only under the membership it was made in (`ApiKey.member_since`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.authority import authorize
from modelhost.auth.principal import Principal
from modelhost.auth.quotas import Quota, quota_for
from modelhost.auth.roles import Role
from modelhost.errors import Conflict, NotFound
from modelhost.store.db import Database
from modelhost.store.models import (
    Account,
    ApiKey,
    Invitation,
    Membership,
    RemovedMembership,
    SsoSession,
    User,
)
from modelhost.store.types import new_id, utcnow

INVITATION_DAYS = 14


class Keep:
    """`UserService.update`'s quota when it is not to change."""


KEEP = Keep()


@dataclass(frozen=True, slots=True)
class Member:
    """A person as a member of one account."""

    id: str
    email: str
    name: str | None
    role: Role
    disabled: bool
    signs_in: bool
    created_at: datetime
    quota: Quota | None = None  # their own (`auth.quotas`); None: their role's default, if any


@dataclass(frozen=True, slots=True)
class Invited:
    """An invitation of an account (as its admins see it, and as it is offered to the person)."""

    id: str
    account_id: str
    email: str
    role: Role
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class SignedOutEverywhere:
    user_id: str
    sessions_ended: int
    keys_revoked: int


def _member(user: User, membership: Membership) -> Member:
    return Member(
        user.id,
        user.email,
        user.name,
        Role(membership.role),
        membership.disabled_at is not None,
        user.subject is not None,
        membership.created_at,
        Quota.of(membership.quota),
    )


def _invited(row: Invitation) -> Invited:
    return Invited(row.id, row.account_id, row.email, Role(row.role), row.created_at, row.expires_at)


def _not_found() -> NotFound:
    return NotFound("User not found in this account", param="user_id", code="user_not_found")


def _no_invitation() -> NotFound:
    return NotFound("No such invitation.", param="invitation_id", code="invitation_not_found")


def offered_to(session: Session, user: User, trust_email: bool) -> list[Invitation]:
    """The invitations offered to a person who signs in: those for their email, where the provider
    verified it (or the operator trusts its emails), unexpired, of accounts they are not a member of."""
    if user.subject is None or not (user.email_verified or trust_email):
        return []
    member_of = select(Membership.account_id).where(Membership.user_id == user.id)
    query = (
        select(Invitation)
        .where(
            Invitation.email == user.email,
            Invitation.expires_at > utcnow(),
            Invitation.account_id.not_in(member_of),
        )
        .order_by(Invitation.created_at, Invitation.id)
    )
    return list(session.scalars(query))


class UserService:
    def __init__(self, database: Database, authenticator: Authenticator, trust_email: bool = False) -> None:
        self._database = database
        self._authenticator = authenticator
        self.trust_email = trust_email

    def add(
        self, account_id: str, email: str, name: str | None, role: Role, caller: Principal | None
    ) -> Member:
        """Make `email` a member with `role`: a person without sign-in (made on first use of the email,
        lower-cased, shared by every account that adds it): 409 if already a member, 403 for a role that
        can do more than the caller (`auth.authority`)."""
        authorize(caller, (), grants=role)
        email = email.strip().lower()
        with self._database.transaction() as session:
            query = select(User).where(User.email == email, User.subject.is_(None))
            user = session.scalars(query).one_or_none()
            if user is None:
                user = User(id=new_id("user"), email=email, name=name, created_at=utcnow())
                session.add(user)
                session.flush()
            elif session.get(Membership, (user.id, account_id)) is not None:
                raise Conflict(
                    f"{email} is already a member of this account.", param="email", code="member_exists"
                )
            membership = _join(session, user, account_id, role, "invite")
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
        quota: Quota | Keep | None = KEEP,
    ) -> Member:
        """Change a member's role, their own quota (None: their role's default applies) or disable them
        (their keys here are refused with 401 `user_disabled`), effective on their next request on this
        gateway process, within `key_cache_seconds` on others. A member is changed, and a role given,
        only by someone who can do as much (`auth.authority`: an owner only by an owner)."""
        with self._database.transaction() as session:
            user = session.get(User, user_id)
            membership = session.get(Membership, (user_id, account_id), with_for_update=True)
            if user is None or membership is None:
                raise _not_found()
            authorize(caller, (Role(membership.role),), grants=role)
            before = {
                "role": membership.role,
                "disabled": membership.disabled_at is not None,
                "quota": membership.quota,
            }
            if role is not None:
                membership.role = role.value
            if disabled is not None and disabled != (membership.disabled_at is not None):
                membership.disabled_at = utcnow() if disabled else None
            if not isinstance(quota, Keep):
                membership.quota = None if quota is None else quota.stored()
            after = {
                "role": membership.role,
                "disabled": membership.disabled_at is not None,
                "quota": membership.quota,
            }
            audit.record(session, "user.updated", "user", user_id, account_id, audit.diff(before, after))
            member = _member(user, membership)
        self._authenticator.forget_all()
        return member

    def quota_of(self, account_id: str, user_id: str) -> tuple[Quota | None, str | None]:
        """The member's quota now and where it comes from (`auth.quotas.quota_for`)."""
        with self._database.transaction() as session:
            membership = session.get(Membership, (user_id, account_id))
            account = session.get(Account, account_id)
            if membership is None:
                raise _not_found()
            return quota_for(membership.quota, account.role_quotas if account else None, membership.role)

    def role_quotas(self, account_id: str) -> dict[Role, Quota]:
        """The account's default quota of each role that has one."""
        with self._database.transaction() as session:
            account = session.get(Account, account_id)
            return _role_quotas(account.role_quotas if account is not None else None)

    def set_role_quotas(
        self, account_id: str, changes: dict[Role, Quota | None], caller: Principal | None
    ) -> dict[Role, Quota]:
        """Give each role in `changes` that default quota (None: none): only for roles that can do no
        more than the caller (`auth.authority`, as a change of such a member). Every key follows at once
        (their quota is read with them)."""
        stored = {role: None if quota is None else quota.stored() for role, quota in changes.items()}
        return _role_quotas(self._set_per_role(account_id, "role_quotas", stored, caller))

    def role_weights(self, account_id: str) -> dict[Role, float]:
        """The account's weight of each role that has one other than 1 (`auth.weights`)."""
        with self._database.transaction() as session:
            account = session.get(Account, account_id)
            return _role_weights(account.role_weights if account is not None else None)

    def set_role_weights(
        self, account_id: str, changes: dict[Role, float | None], caller: Principal | None
    ) -> dict[Role, float]:
        """Give each role in `changes` that weight inside the account (None, or 1: the default again),
        for roles that can do no more than the caller, as their quotas. Every key follows at once (its
        weights are read with it)."""
        stored = {role: None if weight == 1.0 else weight for role, weight in changes.items()}
        return _role_weights(self._set_per_role(account_id, "role_weights", stored, caller))

    def _set_per_role(
        self, account_id: str, column: str, changes: dict[Role, Any], caller: Principal | None
    ) -> Any:
        """Change one per-role setting of the account (`role_quotas`, `role_weights`: {role: value}; a
        value None removes the role's), for roles that can do no more than the caller
        (`auth.authority`); audited as `account.<column>_updated`. Every key follows at once (the keys'
        cache is emptied). The stored setting after."""
        authorize(caller, changes)
        with self._database.transaction() as session:
            account = session.get(Account, account_id, with_for_update=True)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
            before = dict(getattr(account, column) or {})
            after = {**before, **{role.value: value for role, value in changes.items()}}
            after = {role: value for role, value in after.items() if value is not None}
            setattr(account, column, after or None)
            audit.record(
                session,
                f"account.{column}_updated",
                "account",
                account_id,
                account_id,
                audit.diff(before, after),
            )
        self._authenticator.forget_all()
        return after or None

    def remove(self, account_id: str, user_id: str, caller: Principal | None) -> None:
        """The person is no longer a member: their keys here are refused (401 `not_a_member`) and never
        work again; their groups at the provider do not bring them back (module docstring)."""
        with self._database.transaction() as session:
            membership = session.get(Membership, (user_id, account_id), with_for_update=True)
            if membership is None:
                raise _not_found()
            authorize(caller, (Role(membership.role),))
            audit.record(
                session, "user.removed", "user", user_id, account_id, audit.removed({"role": membership.role})
            )
            session.delete(membership)
            session.merge(RemovedMembership(user_id=user_id, account_id=account_id, removed_at=utcnow()))
        self._authenticator.forget_all()

    def sign_out_everywhere(
        self, account_id: str, user_id: str, caller: Principal | None
    ) -> SignedOutEverywhere:
        """Sign a member out of this account everywhere: every sign-in session of theirs acting in it
        ends, none opened before now acts in it again (`Membership.signed_out_at`: the provider must sign
        them in anew), and every key of theirs in it is revoked. Their sessions in other accounts are
        those accounts' business and go on. Audited as `user.signed_out_everywhere`."""
        now = utcnow()
        with self._database.transaction() as session:
            membership = session.get(Membership, (user_id, account_id), with_for_update=True)
            if membership is None:
                raise _not_found()
            authorize(caller, (Role(membership.role),))
            membership.signed_out_at = now
            ended = session.execute(
                update(SsoSession)
                .where(
                    SsoSession.user_id == user_id,
                    SsoSession.account_id == account_id,
                    SsoSession.ended_at.is_(None),
                )
                .values(ended_at=now)
            ).rowcount  # type: ignore[attr-defined]
            keys = list(
                session.scalars(
                    select(ApiKey.id).where(
                        ApiKey.user_id == user_id,
                        ApiKey.account_id == account_id,
                        ApiKey.revoked_at.is_(None),
                    )
                )
            )
            session.execute(update(ApiKey).where(ApiKey.id.in_(keys)).values(revoked_at=now))
            changes = {
                "sessions_ended": {"before": None, "after": ended},
                "keys_revoked": {"before": None, "after": keys},
            }
            audit.record(session, "user.signed_out_everywhere", "user", user_id, account_id, changes)
        self._authenticator.forget_all()
        return SignedOutEverywhere(user_id, ended, len(keys))

    # ---------------------------------------------------------------------------- invitations

    def invite(self, account_id: str, email: str, role: Role, caller: Principal | None) -> Invited:
        """Invite `email` (lower-cased) to `role`: 409 if it is invited already, 403 for a role that can
        do more than the caller (`auth.authority`)."""
        authorize(caller, (), grants=role)
        email = email.strip().lower()
        now = utcnow()
        with self._database.transaction() as session:
            found = session.scalars(
                select(Invitation).where(Invitation.account_id == account_id, Invitation.email == email)
            ).one_or_none()
            if found is not None and found.expires_at > now:
                raise _already_invited(email)
            if found is not None:
                session.delete(found)
                session.flush()
            row = Invitation(
                id=new_id("inv"),
                account_id=account_id,
                email=email,
                role=role.value,
                created_at=now,
                expires_at=now + timedelta(days=INVITATION_DAYS),
            )
            session.add(row)
            try:
                session.flush()
            except IntegrityError:  # another admin invited the same email at the same moment
                raise _already_invited(email) from None
            fields = {"email": email, "role": role.value}
            audit.record(
                session, "invitation.created", "invitation", row.id, account_id, audit.created(fields)
            )
            return _invited(row)

    def invitations(self, account_id: str) -> list[Invited]:
        """The account's invitations not yet accepted nor expired."""
        with self._database.transaction() as session:
            query = (
                select(Invitation)
                .where(Invitation.account_id == account_id, Invitation.expires_at > utcnow())
                .order_by(Invitation.created_at, Invitation.id)
            )
            return [_invited(row) for row in session.scalars(query)]

    def revoke_invitation(self, account_id: str, invitation_id: str, caller: Principal | None) -> None:
        """Withdraw an invitation: only by someone who could give its role (`auth.authority`)."""
        with self._database.transaction() as session:
            row = session.get(Invitation, invitation_id, with_for_update=True)
            if row is None or row.account_id != account_id:
                raise _no_invitation()
            authorize(caller, (Role(row.role),))
            fields = {"email": row.email, "role": row.role}
            audit.record(
                session, "invitation.revoked", "invitation", row.id, account_id, audit.removed(fields)
            )
            session.delete(row)

    def offered(self, user_id: str) -> list[Invited]:
        """The invitations offered to a person who signs in (`offered_to`)."""
        with self._database.transaction() as session:
            user = session.get(User, user_id)
            return [] if user is None else [_invited(r) for r in offered_to(session, user, self.trust_email)]

    def accept(self, user_id: str, invitation_id: str) -> str:
        """The person becomes a member with the invitation's role (the authority is the invitation's: an
        admin who could give that role made it, `invite`); its account ID. 404 for an invitation not
        offered to them."""
        with self._database.transaction() as session:
            user = session.get(User, user_id)
            row = self._offered_one(session, user, invitation_id)
            assert user is not None
            _join(session, user, row.account_id, Role(row.role), "invite")
            fields = {"email": user.email, "role": row.role, "invitation": row.id}
            audit.record(session, "user.added", "user", user.id, row.account_id, audit.created(fields))
            session.delete(row)
            account_id = row.account_id
        self._authenticator.forget_all()
        return account_id

    def decline(self, user_id: str, invitation_id: str) -> None:
        with self._database.transaction() as session:
            row = self._offered_one(session, session.get(User, user_id), invitation_id)
            fields = {"email": row.email, "role": row.role}
            audit.record(
                session, "invitation.declined", "invitation", row.id, row.account_id, audit.removed(fields)
            )
            session.delete(row)

    def _offered_one(self, session: Session, user: User | None, invitation_id: str) -> Invitation:
        found = [] if user is None else offered_to(session, user, self.trust_email)
        row = next((r for r in found if r.id == invitation_id), None)
        if row is None:
            raise _no_invitation()
        return row


def _role_quotas(stored: dict[str, dict[str, int | None]] | None) -> dict[Role, Quota]:
    quotas = {Role(role): Quota.of(quota) for role, quota in (stored or {}).items()}
    return {role: quota for role, quota in quotas.items() if quota is not None}


def _role_weights(stored: dict[str, float] | None) -> dict[Role, float]:
    return {Role(role): float(weight) for role, weight in (stored or {}).items()}


def _already_invited(email: str) -> Conflict:
    return Conflict(
        f"{email} is invited already; revoke that invitation first.", param="email", code="invitation_exists"
    )


def _join(session: Session, user: User, account_id: str, role: Role, source: str) -> Membership:
    """Make `user` a member of `account_id` (an admin's or the person's own decision: a removal no longer
    holds)."""
    session.execute(
        delete(RemovedMembership).where(
            RemovedMembership.user_id == user.id, RemovedMembership.account_id == account_id
        )
    )
    membership = Membership(
        user_id=user.id, account_id=account_id, role=role.value, source=source, created_at=utcnow()
    )
    session.add(membership)
    session.flush()
    return membership
