"""Sign-in sessions: a person signs in through the OpenID provider (`auth.oidc`) and holds a server-side
session by a cookie (docs/access.md, "Single sign-on").

**Sign-in.** `start` writes nothing: what the callback will check (`state`, the `nonce`, the PKCE
verifier, where to go next) is sealed (`imports.sealing`: encrypted and authenticated with the server's
key) into a short-lived cookie the route sets on the browser that starts the sign-in. `finish` opens
that cookie and compares its `state` with the callback's (constant time): a callback opened in another
browser (an attacker's own callback URL, sent to a victim: login CSRF) has no such cookie and is
refused. Then the code is exchanged (the provider redeems a code once) and the ID token checked, and:
the person is found by the provider's `sub`, else made (just in time; never an admin-made person found
by email: `services.users`); their memberships follow their groups (`auth.oidc.grants_of`): a group's
role is given or updated, a membership that came from a group that is gone is removed, one made by
invitation stays, one an admin removed is not made again. Someone with no account, not the operator and
with no invitation to accept is refused (403).

**Sessions.** The cookie's secret is stored hashed; a session acts in one of the person's accounts (the
console switches) with the role they hold there now, read as keys are (cached `key_cache_seconds`: a
disabled or removed person's session stops within that on every gateway process). It ends after
`session_idle_seconds` without a request, `session_max_seconds` after sign-in, or at sign-out. Every
`session_renew_seconds` it is renewed against the provider with the refresh token it got at sign-in: the
provider says again who the person is (a person it deleted is refused: the session ends) and what their
groups are (memberships follow them, and the operator flag: an ex-operator's session loses operator
rights then). A session without a refresh token ends when it is due. One gateway process renews a
session (a guarded update claims it); while the provider cannot be reached the session goes on until
the next renewal. State-changing requests carry the session's CSRF token (`x-csrf-token`), checked in
`api.deps`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.auth import roles
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.limits import Limits
from modelhost.auth.oidc import (
    DeviceSignIn,
    Identity,
    OidcClient,
    ProviderUnreachable,
    SignInFailed,
    Tokens,
    grants_of,
    pkce_pair,
)
from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.auth.quotas import quota_for
from modelhost.auth.roles import Role
from modelhost.auth.weights import tenant_weights
from modelhost.errors import NotFound, PermissionDenied
from modelhost.imports.sealing import Sealer
from modelhost.services.users import Invited, UserService, offered_to
from modelhost.store.db import Database
from modelhost.store.models import Account, Membership, RemovedMembership, SsoHandoff, SsoSession, User
from modelhost.store.types import new_id

log = logging.getLogger("modelhost.sessions")

SESSION_PREFIX = "mhs-"
SIGN_IN_COOKIE = "modelhost_sign_in"  # a sign-in under way, bound to the browser that started it
LOGIN_SECONDS = 600  # a sign-in not finished within this is refused
SEEN_EVERY_SECONDS = 60  # a session's last use is written at most this often
HANDOFF_SECONDS = 60  # a browser sign-in's code for the CLI's loopback is good this long, once
LOOPBACK = "loopback:"  # a sign-in's `return_to` when the CLI waits on 127.0.0.1 (its port and state)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionRules:
    """How long sessions last and what groups mean (settings: docs/access.md)."""

    idle_seconds: int
    max_seconds: int
    renew_seconds: int
    group_prefix: str
    operator_group: str


@dataclass(frozen=True, slots=True)
class SignInStarted:
    """Where the browser goes to sign in, and the sealed cookie that binds the sign-in to it."""

    url: str
    cookie: str


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A finished sign-in: the cookie's secret (shown once; None when the session goes to the CLI's
    loopback instead) and where the browser goes next."""

    secret: str | None
    return_to: str


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a live session, whatever account it acts in (the sign-in routes' own caller)."""

    session_id: str
    user_id: str
    email: str
    subject: str | None
    csrf: str


@dataclass(frozen=True, slots=True)
class SessionView:
    """What `GET /v1/auth/session` shows."""

    id: str
    user_id: str
    email: str
    name: str | None
    operator: bool
    account_id: str | None
    accounts: dict[str, Role]
    invitations: list[Invited]
    csrf_token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class _Due:
    """A session this process claimed to renew: its refresh token (sealed) and whose it is."""

    session_id: str
    subject: str | None
    refresh_token: str


def safe_return_to(value: str | None) -> str:
    """Only a path on this server (`/console`, never `//other.host` or a URL): no open redirect."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/console"
    return value[:500]


class SessionService:
    def __init__(
        self,
        database: Database,
        authenticator: Authenticator,
        oidc: OidcClient | None,
        sealer: Sealer,
        users: UserService,
        rules: SessionRules,
    ) -> None:
        self._database = database
        self._authenticator = authenticator
        self.oidc = oidc
        self._sealer = sealer
        self._users = users
        self.idle = timedelta(seconds=rules.idle_seconds)
        self.lifetime = timedelta(seconds=rules.max_seconds)
        self.renewal = timedelta(seconds=rules.renew_seconds)
        self._group_prefix, self._operator_group = rules.group_prefix, rules.operator_group

    def _client(self) -> OidcClient:
        if self.oidc is None:
            raise NotFound(
                "Single sign-on is not configured on this server (MODELHOST_OIDC_ISSUER).",
                code="sso_not_configured",
            )
        return self.oidc

    def _now(self) -> datetime:
        return self._authenticator.now()

    # ---------------------------------------------------------------------------------- sign-in

    async def start(
        self, return_to: str | None, login_hint: str | None, loopback: tuple[int, str] | None = None
    ) -> SignInStarted:
        """The provider's authorization URL for a new sign-in, and the cookie that carries what its
        callback checks (nothing is written: an anonymous request costs no row). `loopback`: the CLI's
        (port, state) when it signs in through a browser (`modelhost login --browser`): the callback then
        hands the session to `http://127.0.0.1:<port>/callback` instead of setting a cookie."""
        client = self._client()
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier, _ = pkce_pair()
        target = f"{LOOPBACK}{loopback[0]}:{loopback[1]}" if loopback else safe_return_to(return_to)
        pending = {"state": state, "nonce": nonce, "verifier": verifier, "return_to": target}
        cookie = self._sealer.seal({**pending, "at": self._now().timestamp()})
        return SignInStarted(await client.authorization_url(state, nonce, verifier, login_hint), cookie)

    async def finish(self, code: str, state: str, cookie: str | None) -> SignedIn:
        """Finish the sign-in this browser started (`cookie`, from `start`) and open its session."""
        client = self._client()
        nonce, verifier, return_to = self._pending(state, cookie)
        tokens = await client.exchange(code, verifier)
        identity = await client.verify(tokens.id_token, nonce)
        secret, session_id = await asyncio.to_thread(self._open, identity, tokens)
        if not return_to.startswith(LOOPBACK):
            return SignedIn(secret, return_to)
        port, cli_state = return_to.removeprefix(LOOPBACK).split(":", 1)
        handoff = secrets.token_urlsafe(32)
        await asyncio.to_thread(self._hand_off, handoff, session_id)
        query = urlencode({"code": handoff, "state": cli_state})
        return SignedIn(None, f"http://127.0.0.1:{port}/callback?{query}")

    def _pending(self, state: str, cookie: str | None) -> tuple[str, str, str]:
        """The sign-in this browser started, if the callback's `state` is its own: its nonce, PKCE
        verifier and where the browser goes next."""
        if not cookie:
            raise SignInFailed(
                "This browser did not start this sign-in (it has no sign-in cookie): sign in again here."
            )
        try:
            pending: Any = self._sealer.open(cookie)
            found = (pending["state"], pending["nonce"], pending["verifier"], pending["return_to"])
            started = float(pending["at"])
        except (ValueError, TypeError, KeyError):
            raise SignInFailed("This sign-in's cookie is not one this server made; sign in again.") from None
        if not all(isinstance(part, str) for part in found):
            raise SignInFailed("This sign-in's cookie is not one this server made; sign in again.")
        if not secrets.compare_digest(found[0].encode(), state.encode()):
            raise SignInFailed(
                "This callback is not the sign-in this browser started (`state`); sign in again."
            )
        if self._now().timestamp() - started > LOGIN_SECONDS:
            raise SignInFailed("This sign-in is too old; sign in again.")
        return found[1], found[2], found[3]

    def _hand_off(self, handoff: str, session_id: str) -> None:
        with self._database.transaction() as session:
            session.add(SsoHandoff(code_hash=_hash(handoff), session_id=session_id, created_at=self._now()))

    def cli_token(self, handoff: str) -> str:
        """The session a browser sign-in handed to the CLI's loopback (`code`, used once, within a
        minute), under a new secret: the one made at the callback never left the server."""
        with self._database.transaction() as session:
            found = session.get(SsoHandoff, _hash(handoff), with_for_update=True)
            if found is not None:
                session.delete(found)
            fresh = found is not None and found.created_at > self._now() - timedelta(seconds=HANDOFF_SECONDS)
            row = session.get(SsoSession, found.session_id) if found is not None and fresh else None
            if row is None or row.ended_at is not None:
                raise SignInFailed("This sign-in code is unknown, already used or too old; sign in again.")
            secret = SESSION_PREFIX + secrets.token_urlsafe(32)
            row.secret_hash = _hash(secret)
        self._authenticator.forget_all()
        return secret

    async def device_start(self, login_hint: str | None) -> DeviceSignIn:
        """A device sign-in for the CLI (`modelhost login`): the person confirms it at the provider."""
        return await self._client().device_authorization(login_hint)

    async def device_finish(self, device_code: str) -> str:
        """The session's secret once the person confirmed the device sign-in (the CLI's bearer token);
        `DeviceNotYet` before."""
        client = self._client()
        tokens = await client.device_exchange(device_code)
        identity = await client.verify(tokens.id_token, None)
        secret, _ = await asyncio.to_thread(self._open, identity, tokens)
        return secret

    def _open(self, identity: Identity, tokens: Tokens) -> tuple[str, str]:
        """The session of a checked identity, its memberships made to follow its groups: its secret and
        its ID."""
        operator, accounts = grants_of(identity.groups, self._group_prefix, self._operator_group)
        secret, now = SESSION_PREFIX + secrets.token_urlsafe(32), self._now()
        with self._database.transaction() as session:
            user = _person(session, identity, now)
            audit.acting(audit.Actor("session", None, None, None, user.id, user.email, user.subject))
            member_of = _follow_groups(session, user, accounts, now)
            if not member_of and not operator and not offered_to(session, user, self._users.trust_email):
                raise PermissionDenied(
                    "You are a member of no modelhost account: ask for a group "
                    f"`{self._group_prefix}:<account ID>:<role>` at your identity provider, or for an "
                    "invitation.",
                    code="no_account",
                )
            session_id = new_id("ses")
            session.add(
                SsoSession(
                    id=session_id,
                    secret_hash=_hash(secret),
                    user_id=user.id,
                    account_id=member_of[0] if member_of else None,
                    operator=operator,
                    csrf_token=secrets.token_urlsafe(32),
                    id_token=tokens.id_token,
                    refresh_token=self._seal_refresh(tokens),
                    created_at=now,
                    renewed_at=now,
                    last_seen_at=now,
                )
            )
        self._authenticator.forget_all()
        return secret, session_id

    def _seal_refresh(self, tokens: Tokens) -> str | None:
        return None if tokens.refresh_token is None else self._sealer.seal(tokens.refresh_token)

    # --------------------------------------------------------------------------------- sessions

    async def principal(self, secret: str) -> Principal | None:
        """The session's principal now (cached as keys are), or None: unknown, ended, idle, too old,
        refused at its renewal, or acting in no account as no operator. A session due for renewal is
        renewed first (module docstring)."""
        if not secret.startswith(SESSION_PREFIX) or len(secret) > 100:
            return None
        key = "session:" + _hash(secret)
        known, principal = self._authenticator.cache.get(key)
        if known:
            return principal
        due: list[_Due] = []

        def read() -> Principal | None:
            found, claimed = self._read(secret)
            due.extend([claimed] if claimed is not None else [])
            return found

        principal = await asyncio.to_thread(self._authenticator.cache.fresh_or_stale, key, read)
        if due:
            await self._renew(due[0])
            principal = await asyncio.to_thread(
                self._authenticator.cache.fresh_or_stale, key, lambda: self._read(secret)[0]
            )
        return principal

    async def holder(self, secret: str) -> Holder | None:
        """Who holds the session `secret`, while it lasts (renewed first when due), whatever account it
        acts in: a person with only invitations to accept has a session in no account."""
        await self.principal(secret)
        return await asyncio.to_thread(self._holder, secret)

    def _holder(self, secret: str) -> Holder | None:
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            user = session.get(User, row.user_id) if row is not None else None
            if row is None or user is None or not self._live(row, self._now()):
                return None
            return Holder(row.id, user.id, user.email, user.subject, row.csrf_token)

    def _live(self, row: SsoSession, now: datetime) -> bool:
        return (
            row.ended_at is None
            and now - row.last_seen_at <= self.idle
            and now - row.created_at <= self.lifetime
        )

    def _read(self, secret: str) -> tuple[Principal | None, _Due | None]:
        """The session's principal, and the renewal this process claimed when it is due."""
        now = self._now()
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            if row is None or row.ended_at is not None:
                return None, None
            if not self._live(row, now):
                row.ended_at = now
                return None, None
            due = self._claim_renewal(session, row, now)
            if row.ended_at is not None:
                return None, None
            if now - row.last_seen_at > timedelta(seconds=SEEN_EVERY_SECONDS):
                row.last_seen_at = now
            user = session.get(User, row.user_id)
            if user is None:
                return None, None
            return _principal_of(session, row, user), due

    def _claim_renewal(self, session: Session, row: SsoSession, now: datetime) -> _Due | None:
        """When the session is due for renewal: this process's claim on it (one process renews it), or
        the session ended (no refresh token to renew it with)."""
        last = row.renewed_at or row.created_at
        if now - last <= self.renewal:
            return None
        if row.refresh_token is None or self.oidc is None:
            row.ended_at = now
            log.info("session %s ended: due for renewal, and no refresh token to renew it with", row.id)
            return None
        guard = SsoSession.renewed_at.is_(None) if row.renewed_at is None else SsoSession.renewed_at == last
        claimed = session.execute(
            update(SsoSession).where(SsoSession.id == row.id, guard).values(renewed_at=now)
        ).rowcount  # type: ignore[attr-defined]
        if claimed != 1:
            return None  # another process renews it
        user = session.get(User, row.user_id)
        return _Due(row.id, user.subject if user is not None else None, row.refresh_token)

    async def _renew(self, due: _Due) -> None:
        """Ask the provider again who the session's person is and what their groups are; the session
        ends when it refuses."""
        client = self._client()
        try:
            refresh_token = self._sealer.open(due.refresh_token)
            if not isinstance(refresh_token, str):
                raise SignInFailed("The session's refresh token is not one this server sealed.")
            tokens = await client.refresh(refresh_token)
            identity = await client.verify(tokens.id_token, None)
            if identity.subject != due.subject:
                raise SignInFailed("The provider renewed the session for another person.")
        except ProviderUnreachable as exc:
            log.warning("session %s not renewed (the provider did not answer): %s", due.session_id, exc)
            return
        except (SignInFailed, ValueError) as exc:
            log.info("session %s ended at renewal: %s", due.session_id, exc)
            await asyncio.to_thread(self._end_row, due.session_id)
            return
        await asyncio.to_thread(self._renewed, due.session_id, identity, tokens)

    def _renewed(self, session_id: str, identity: Identity, tokens: Tokens) -> None:
        """What the provider said at renewal, applied: the person, their memberships, the operator flag;
        the session moves to another of their accounts if it lost its own."""
        operator, accounts = grants_of(identity.groups, self._group_prefix, self._operator_group)
        now = self._now()
        with self._database.transaction() as session:
            row = session.get(SsoSession, session_id, with_for_update=True)
            if row is None or row.ended_at is not None:
                return
            user = _person(session, identity, now)
            audit.acting(audit.Actor("session", row.id, None, None, user.id, user.email, user.subject))
            member_of = _follow_groups(session, user, accounts, now)
            row.operator, row.id_token = operator, tokens.id_token
            row.refresh_token = self._seal_refresh(tokens) or row.refresh_token
            lost = row.account_id not in member_of if row.account_id is not None else not operator
            if lost:  # its account (or, acting as the operator, the operator group)
                row.account_id = member_of[0] if member_of else None
        self._authenticator.forget_all()

    def _end_row(self, session_id: str) -> None:
        with self._database.transaction() as session:
            row = session.get(SsoSession, session_id)
            if row is not None and row.ended_at is None:
                row.ended_at = self._now()
        self._authenticator.forget_all()

    def view(self, secret: str) -> SessionView:
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            user = session.get(User, row.user_id) if row is not None else None
            if row is None or user is None:
                raise NotFound("No session.", code="no_session")
            members = session.scalars(
                select(Membership).where(Membership.user_id == row.user_id, Membership.disabled_at.is_(None))
            )
            accounts = {m.account_id: Role(m.role) for m in members if _may_act_in(row, m)}
        return SessionView(
            id=row.id,
            user_id=user.id,
            email=user.email,
            name=user.name,
            operator=row.operator,
            account_id=row.account_id,
            accounts=accounts,
            invitations=self._users.offered(user.id),
            csrf_token=row.csrf_token,
            expires_at=min(row.created_at + self.lifetime, row.last_seen_at + self.idle),
        )

    def switch(self, secret: str, account_id: str | None) -> None:
        """Act in another of the person's accounts (None: as the operator, where they are one)."""
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            if row is None:
                raise NotFound("No session.", code="no_session")
            if account_id is None and not row.operator:
                raise PermissionDenied("You are not the operator.")
            if account_id is not None:
                member = session.get(Membership, (row.user_id, account_id))
                if member is None or not _may_act_in(row, member):
                    raise NotFound(
                        "You are not a member of that account (or were signed out of it everywhere: "
                        "sign in again).",
                        param="account_id",
                        code="not_a_member",
                    )
            row.account_id = account_id
        self._authenticator.forget_all()

    def accept(self, holder: Holder, invitation_id: str) -> None:
        """The session's person accepts an invitation offered to them: a member now, and the session
        acts in that account."""
        audit.acting(
            audit.Actor(
                "session", holder.session_id, None, None, holder.user_id, holder.email, holder.subject
            )
        )
        account_id = self._users.accept(holder.user_id, invitation_id)
        with self._database.transaction() as session:
            row = session.get(SsoSession, holder.session_id)
            if row is not None:
                row.account_id = account_id
        self._authenticator.forget_all()

    def decline(self, holder: Holder, invitation_id: str) -> None:
        audit.acting(
            audit.Actor(
                "session", holder.session_id, None, None, holder.user_id, holder.email, holder.subject
            )
        )
        self._users.decline(holder.user_id, invitation_id)

    async def end(self, secret: str, after: str) -> str | None:
        """Sign out: the session ends everywhere; the provider's logout URL, where it has one."""
        id_token = await asyncio.to_thread(self._end, secret)
        if id_token is None or self.oidc is None:
            return None
        return await self.oidc.logout_url(id_token, after)

    def _end(self, secret: str) -> str | None:
        """End the session: its ID token (for the provider's logout), None if there was none."""
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            if row is None:
                return None
            row.ended_at = self._now()
            id_token = row.id_token
        self._authenticator.forget_all()
        return id_token


def _session_row(session: Session, secret: str) -> SsoSession | None:
    return session.scalars(select(SsoSession).where(SsoSession.secret_hash == _hash(secret))).one_or_none()


def _may_act_in(row: SsoSession, member: Membership) -> bool:
    """Whether the session may act in the membership's account: the member is enabled, and was not
    signed out of it everywhere since the session was opened (`UserService.sign_out_everywhere`)."""
    return member.disabled_at is None and (
        member.signed_out_at is None or row.created_at > member.signed_out_at
    )


def _principal_of(session: Session, row: SsoSession, user: User) -> Principal | None:
    """What a live session acts as now: the operator (acting in no account), or the person's role in its
    account; None when neither."""
    if row.account_id is None:
        if not row.operator:
            return None
        return Principal(
            kind=PrincipalKind.ADMIN,
            key_id=row.id,
            user_id=user.id,
            email=user.email,
            subject=user.subject,
            csrf=row.csrf_token,
        )
    member = session.get(Membership, (row.user_id, row.account_id))
    if member is None or not _may_act_in(row, member):
        return None
    account = session.get(Account, row.account_id)
    role = Role(member.role)
    return Principal(
        kind=PrincipalKind.ACCOUNT,
        account_id=row.account_id,
        key_id=row.id,
        account_limits=None if account is None else Limits.of(account.limits),
        quota=quota_for(member.quota, None if account is None else account.role_quotas, member.role)[0],
        weights=tenant_weights(account, role.value),
        role=role,
        actions=roles.PERMISSIONS[role],
        user_id=user.id,
        email=user.email,
        subject=user.subject,
        csrf=row.csrf_token,
    )


def _person(session: Session, identity: Identity, now: datetime) -> User:
    """The person who signed in: by `sub`, else a new person. Never one found by email: a person without
    sign-in (`POST /v1/users`) has the email an admin typed, which proves nothing (`services.users`).
    Their name, email and whether it is verified are the provider's, as of now."""
    user = session.scalars(select(User).where(User.subject == identity.subject)).one_or_none()
    email = identity.email or f"{identity.subject}@sso.invalid"
    if user is None:
        user = User(
            id=new_id("user"),
            email=email,
            name=identity.name,
            subject=identity.subject,
            email_verified=identity.email_verified,
            signed_in_at=now,
            created_at=now,
        )
        session.add(user)
        session.flush()
        audit.record(
            session,
            "user.created",
            "user",
            user.id,
            None,
            audit.created({"email": email, "name": identity.name}),
        )
        return user
    if identity.name and user.name != identity.name:
        user.name = identity.name
    user.email, user.email_verified, user.signed_in_at = email, identity.email_verified, now
    return user


def _follow_groups(session: Session, user: User, accounts: dict[str, Role], now: datetime) -> list[str]:
    """The person's memberships made to follow their groups (never into an account an admin removed
    them from); the accounts they are an enabled member of now (those of their groups first)."""
    existing = {
        m.account_id: m for m in session.scalars(select(Membership).where(Membership.user_id == user.id))
    }
    removed = set(
        session.scalars(select(RemovedMembership.account_id).where(RemovedMembership.user_id == user.id))
    )
    for account_id, role in accounts.items():
        if account_id in removed or session.get(Account, account_id) is None:
            continue  # removed by an admin (it sticks), or a group for an account that does not exist
        member = existing.get(account_id)
        if member is None:
            member = Membership(
                user_id=user.id, account_id=account_id, role=role.value, source="sso", created_at=now
            )
            session.add(member)
            existing[account_id] = member
            changes = audit.created({"email": user.email, "role": role.value, "source": "sso"})
            audit.record(session, "user.added", "user", user.id, account_id, changes)
        elif member.role != role.value or member.source != "sso":
            before = {"role": member.role}
            member.role, member.source = role.value, "sso"
            audit.record(
                session, "user.updated", "user", user.id, account_id, audit.diff(before, {"role": role.value})
            )
    for account_id, member in list(existing.items()):
        if member.source == "sso" and account_id not in accounts:
            audit.record(
                session, "user.removed", "user", user.id, account_id, audit.removed({"role": member.role})
            )
            session.delete(member)
            del existing[account_id]
    session.flush()
    enabled = [a for a, m in existing.items() if m.disabled_at is None and a not in removed]
    return sorted(enabled, key=lambda a: (a not in accounts, a))
