"""Sign-in sessions: a person signs in through the OpenID provider (`auth.oidc`) and holds a server-side
session by a cookie (docs/access.md, "Single sign-on").

**Sign-in.** `start` keeps what the callback will check (`state`, hashed, as the key: used once; the
`nonce`; the PKCE verifier) and sends the browser to the provider. `finish` takes that row away (a second
callback with the same `state` finds nothing), exchanges the code, checks the ID token, and then:
the person is found by the provider's `sub`, else by a verified email an admin invited (linked then),
else made (just in time); their memberships follow their groups (`auth.oidc.grants_of`): a group's role
is given or updated, a membership that came from a group that is gone is removed, one an admin made by
invitation stays. Someone with no account and not the operator is refused (403).

**Sessions.** The cookie's secret is stored hashed; a session acts in one of the person's accounts (the
console switches) with the role they hold there now, read as keys are (cached `key_cache_seconds`: a
disabled or removed person's session stops within that on every gateway process). It ends after
`session_idle_seconds` without a request, `session_max_seconds` after sign-in, or at sign-out.
State-changing requests carry the session's CSRF token (`x-csrf-token`), checked in `api.deps`."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.auth import roles
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.limits import Limits
from modelhost.auth.oidc import DeviceSignIn, Identity, OidcClient, SignInFailed, grants_of, pkce_pair
from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.auth.roles import Role
from modelhost.errors import NotFound, PermissionDenied
from modelhost.store.db import Database
from modelhost.store.models import Account, Membership, SsoHandoff, SsoLogin, SsoSession, User
from modelhost.store.types import new_id, utcnow

SESSION_PREFIX = "mhs-"
LOGIN_SECONDS = 600  # a sign-in not finished within this is forgotten
SEEN_EVERY_SECONDS = 60  # a session's last use is written at most this often
HANDOFF_SECONDS = 60  # a browser sign-in's code for the CLI's loopback is good this long, once
LOOPBACK = "loopback:"  # a sign-in's `return_to` when the CLI waits on 127.0.0.1 (its port and state)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A finished sign-in: the cookie's secret (shown once; None when the session goes to the CLI's
    loopback instead) and where the browser goes next."""

    secret: str | None
    return_to: str


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
    csrf_token: str
    expires_at: datetime


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
        idle_seconds: int,
        max_seconds: int,
        group_prefix: str,
        operator_group: str,
    ) -> None:
        self._database = database
        self._authenticator = authenticator
        self.oidc = oidc
        self.idle = timedelta(seconds=idle_seconds)
        self.lifetime = timedelta(seconds=max_seconds)
        self._group_prefix, self._operator_group = group_prefix, operator_group

    def _client(self) -> OidcClient:
        if self.oidc is None:
            raise NotFound(
                "Single sign-on is not configured on this server (MODELHOST_OIDC_ISSUER).",
                code="sso_not_configured",
            )
        return self.oidc

    async def start(
        self, return_to: str | None, login_hint: str | None, loopback: tuple[int, str] | None = None
    ) -> str:
        """The provider's authorization URL for a new sign-in. `loopback`: the CLI's (port, state) when
        it signs in through a browser (`modelhost login --browser`): the callback then hands the session
        to `http://127.0.0.1:<port>/callback` instead of setting a cookie."""
        client = self._client()
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier, _ = pkce_pair()
        target = f"{LOOPBACK}{loopback[0]}:{loopback[1]}" if loopback else safe_return_to(return_to)
        login = SsoLogin(
            state_hash=_hash(state),
            nonce=nonce,
            code_verifier=verifier,
            return_to=target,
            created_at=utcnow(),
        )
        await asyncio.to_thread(self._remember, login)
        return await client.authorization_url(state, nonce, verifier, login_hint)

    def _remember(self, login: SsoLogin) -> None:
        """Keep a sign-in under way, forgetting those too old to finish."""
        with self._database.transaction() as session:
            too_old = utcnow() - timedelta(seconds=LOGIN_SECONDS)
            session.execute(delete(SsoLogin).where(SsoLogin.created_at < too_old))
            session.add(login)

    async def finish(self, code: str, state: str) -> SignedIn:
        client = self._client()
        nonce, verifier, return_to = await asyncio.to_thread(self._take, state)
        id_token = await client.exchange(code, verifier)
        identity = await client.verify(id_token, nonce)
        secret, session_id = await asyncio.to_thread(self._open, identity, id_token)
        if not return_to.startswith(LOOPBACK):
            return SignedIn(secret, return_to)
        port, cli_state = return_to.removeprefix(LOOPBACK).split(":", 1)
        handoff = secrets.token_urlsafe(32)
        await asyncio.to_thread(self._hand_off, handoff, session_id)
        query = urlencode({"code": handoff, "state": cli_state})
        return SignedIn(None, f"http://127.0.0.1:{port}/callback?{query}")

    def _take(self, state: str) -> tuple[str, str, str]:
        """The sign-in `state` names, taken away (a second callback finds nothing): its nonce, PKCE
        verifier and where the browser goes next."""
        found = None
        with self._database.transaction() as session:
            login = session.get(SsoLogin, _hash(state), with_for_update=True)
            if login is not None:
                session.delete(login)  # used once, fresh or not
                if login.created_at > utcnow() - timedelta(seconds=LOGIN_SECONDS):
                    found = login.nonce, login.code_verifier, login.return_to
        if found is None:
            raise SignInFailed("This sign-in is unknown, already used or too old (`state`); sign in again.")
        return found

    def _hand_off(self, handoff: str, session_id: str) -> None:
        with self._database.transaction() as session:
            session.add(SsoHandoff(code_hash=_hash(handoff), session_id=session_id, created_at=utcnow()))

    def cli_token(self, handoff: str) -> str:
        """The session a browser sign-in handed to the CLI's loopback (`code`, used once, within a
        minute), under a new secret: the one made at the callback never left the server."""
        with self._database.transaction() as session:
            found = session.get(SsoHandoff, _hash(handoff), with_for_update=True)
            if found is not None:
                session.delete(found)
            fresh = found is not None and found.created_at > utcnow() - timedelta(seconds=HANDOFF_SECONDS)
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
        id_token = await client.device_exchange(device_code)
        identity = await client.verify(id_token, None)
        secret, _ = await asyncio.to_thread(self._open, identity, id_token)
        return secret

    def _open(self, identity: Identity, id_token: str) -> tuple[str, str]:
        """The session of a checked identity, its memberships made to follow its groups: its secret and
        its ID."""
        operator, accounts = grants_of(identity.groups, self._group_prefix, self._operator_group)
        secret = SESSION_PREFIX + secrets.token_urlsafe(32)
        with self._database.transaction() as session:
            user = _person(session, identity)
            audit.acting(audit.Actor("session", None, None, None, user.id, user.email, user.subject))
            member_of = _follow_groups(session, user, accounts)
            if not member_of and not operator:
                raise PermissionDenied(
                    "You are a member of no modelhost account: ask for a group "
                    f"`{self._group_prefix}:<account ID>:<role>` at your identity provider.",
                    code="no_account",
                )
            now, session_id = utcnow(), new_id("ses")
            session.add(
                SsoSession(
                    id=session_id,
                    secret_hash=_hash(secret),
                    user_id=user.id,
                    account_id=member_of[0] if member_of else None,
                    operator=operator,
                    csrf_token=secrets.token_urlsafe(32),
                    id_token=id_token,
                    created_at=now,
                    last_seen_at=now,
                )
            )
        self._authenticator.forget_all()
        return secret, session_id

    def principal(self, secret: str) -> Principal | None:
        """The session's principal now (cached as keys are), or None: unknown, ended, idle or too old."""
        if not secret.startswith(SESSION_PREFIX) or len(secret) > 100:
            return None
        key = "session:" + _hash(secret)
        known, principal = self._authenticator.cache.get(key)
        if known:
            return principal
        principal = self._authenticator.cache.fresh_or_stale(key, lambda: self._read(secret))
        return principal

    def _read(self, secret: str) -> Principal | None:
        now = utcnow()
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            if row is None or row.ended_at is not None:
                return None
            if now - row.last_seen_at > self.idle or now - row.created_at > self.lifetime:
                row.ended_at = now
                return None
            if now - row.last_seen_at > timedelta(seconds=SEEN_EVERY_SECONDS):
                row.last_seen_at = now
            user = session.get(User, row.user_id)
            if user is None:
                return None
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
            if member is None or member.disabled_at is not None:
                return None
            account = session.get(Account, row.account_id)
            role = Role(member.role)
            return Principal(
                kind=PrincipalKind.ACCOUNT,
                account_id=row.account_id,
                key_id=row.id,
                account_limits=None if account is None else Limits.of(account.limits),
                role=role,
                actions=roles.PERMISSIONS[role],
                user_id=user.id,
                email=user.email,
                subject=user.subject,
                csrf=row.csrf_token,
            )

    def view(self, secret: str) -> SessionView:
        with self._database.transaction() as session:
            row = _session_row(session, secret)
            user = session.get(User, row.user_id) if row is not None else None
            if row is None or user is None:
                raise NotFound("No session.", code="no_session")
            members = session.scalars(
                select(Membership).where(Membership.user_id == row.user_id, Membership.disabled_at.is_(None))
            )
            return SessionView(
                id=row.id,
                user_id=user.id,
                email=user.email,
                name=user.name,
                operator=row.operator,
                account_id=row.account_id,
                accounts={m.account_id: Role(m.role) for m in members},
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
                if member is None or member.disabled_at is not None:
                    raise NotFound(
                        "You are not a member of that account.", param="account_id", code="not_a_member"
                    )
            row.account_id = account_id
        self._authenticator.forget_all()

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
            row.ended_at = utcnow()
            id_token = row.id_token
        self._authenticator.forget_all()
        return id_token


def _session_row(session: Session, secret: str) -> SsoSession | None:
    return session.scalars(select(SsoSession).where(SsoSession.secret_hash == _hash(secret))).one_or_none()


def _person(session: Session, identity: Identity) -> User:
    """The person who signed in: by `sub`; else an invited email, verified by the provider (linked now);
    else a new person."""
    user = session.scalars(select(User).where(User.subject == identity.subject)).one_or_none()
    if user is None and identity.email is not None:
        invited = session.scalars(select(User).where(User.email == identity.email)).one_or_none()
        if invited is not None:
            if not identity.email_verified or invited.subject is not None:
                raise SignInFailed(
                    "This email belongs to another person here, and the provider has not verified it."
                )
            invited.subject = identity.subject
            user = invited
    if user is None:
        email = identity.email or f"{identity.subject}@sso.invalid"
        user = User(
            id=new_id("user"), email=email, name=identity.name, subject=identity.subject, created_at=utcnow()
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
    elif identity.name and user.name != identity.name:
        user.name = identity.name
    return user


def _follow_groups(session: Session, user: User, accounts: dict[str, Role]) -> list[str]:
    """The person's memberships made to follow their groups; the accounts they are an enabled member of
    now (those of their groups first)."""
    existing = {
        m.account_id: m for m in session.scalars(select(Membership).where(Membership.user_id == user.id))
    }
    for account_id, role in accounts.items():
        if session.get(Account, account_id) is None:
            continue  # a group for an account that does not exist (yet): ignored
        member = existing.get(account_id)
        if member is None:
            member = Membership(
                user_id=user.id, account_id=account_id, role=role.value, source="sso", created_at=utcnow()
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
    enabled = [a for a, m in existing.items() if m.disabled_at is None]
    return sorted(enabled, key=lambda a: (a not in accounts, a))
