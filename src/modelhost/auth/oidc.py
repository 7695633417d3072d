"""Single sign-on with an OpenID Connect provider: the relying party's half of the authorization-code flow
with PKCE, and the checks of the ID token it returns (docs/access.md, "Single sign-on").

The provider's endpoints come from its discovery document; the OAuth exchange itself is Authlib's client,
made once with the client (as its HTTP client and TLS context: a new one per request cost ~0.2 s of the
event loop's CPU, and anonymous sign-ins could stall every tenant that way); an authorization URL is
built without any. The ID token is checked with joserfc here, always, even though it came straight from
the token endpoint over TLS: its signature against the provider's JWKS (read again once when a token
names a key it does not know: the provider rotated its keys), its `alg` from an allow-list (never `none`,
never HMAC), then `iss`, `aud` (and `azp` where several audiences), `exp`, `iat` (a minute of clock
skew), `sub` and the `nonce` the sign-in sent. Nothing of a token is believed before these pass."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import httpx2
from authlib.integrations.base_client import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from modelhost.auth.roles import Role
from modelhost.errors import InvalidAPIKey

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
SKEW_SECONDS = 60  # the clocks of the provider and this server may differ by this much
DISCOVERY_SECONDS = 3600  # the discovery document and the JWKS are read again after this long


class SignInFailed(InvalidAPIKey):
    """The sign-in could not be completed: an unknown or used `state`, the provider's refusal, an ID token
    that fails a check. 401, the same body as a wrong key."""

    code = "sign_in_failed"


class ProviderUnreachable(SignInFailed):
    """The provider did not answer (its discovery document, keys or token endpoint): not a refusal."""


@dataclass(frozen=True, slots=True)
class Tokens:
    """What the token endpoint gave: the ID token, and a refresh token where the provider gives one
    (`offline_access`, or always: Keycloak) to renew the session with."""

    id_token: str
    refresh_token: str | None


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None
    device_authorization_endpoint: str | None


class DeviceNotYet(SignInFailed):
    """The device sign-in is not finished: RFC 8628's `authorization_pending` or `slow_down` (the CLI
    keeps polling), `expired_token` or `access_denied` (it stops)."""

    status_code = 400
    error_type = "invalid_request_error"


@dataclass(frozen=True, slots=True)
class DeviceSignIn:
    """A device sign-in started at the provider (RFC 8628): what the person opens and confirms, and what
    the CLI polls with."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: int
    interval: int


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the provider says signed in: its `sub`, and the claims we use."""

    subject: str
    email: str | None
    email_verified: bool
    name: str | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str
    scopes: str
    groups_claim: str
    algorithms: frozenset[str]


def pkce_pair() -> tuple[str, str]:
    """A PKCE code verifier and its S256 challenge (RFC 7636)."""
    verifier = secrets.token_urlsafe(64)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def grants_of(groups: tuple[str, ...], prefix: str, operator_group: str) -> tuple[bool, dict[str, Role]]:
    """What a person's groups make them: the operator (a member of `operator_group`), and their role in
    each account named by a group `<prefix>:<account ID>:<role>` (of several roles in one account, the
    first in `Role`'s order: owner, admin, developer, viewer, billing). Other groups are ignored."""
    roles: dict[str, Role] = {}
    order = list(Role)
    for group in groups:
        parts = group.split(":")
        if len(parts) != 3 or parts[0] != prefix or parts[2] not in Role.__members__.values():
            continue
        account, role = parts[1], Role(parts[2])
        if account not in roles or order.index(role) < order.index(roles[account]):
            roles[account] = role
    return operator_group in groups, roles


class OidcClient:
    """The provider as this server sees it: discovery and keys cached, read again when stale."""

    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        tls = httpx.create_ssl_context()  # one TLS context, one connection pool each, for the process
        self._http = httpx.AsyncClient(timeout=10, verify=tls)
        # Keeps no sign-in's state: each call passes its own code, verifier, device code or refresh token
        # (Authlib keeps the last token answered in `.token`; nothing reads it)
        self._oauth = AsyncOAuth2Client(
            client_id=config.client_id,
            client_secret=config.client_secret,
            scope=config.scopes,
            redirect_uri=config.redirect_uri,
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_basic",
            timeout=10,
            verify=tls,
        )
        self._metadata: ProviderMetadata | None = None
        self._metadata_read = 0.0
        self._keys: KeySet | None = None
        self._keys_read = 0.0
        self._lock = asyncio.Lock()

    async def metadata(self) -> ProviderMetadata:
        if self._metadata is None or time.monotonic() - self._metadata_read > DISCOVERY_SECONDS:
            url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            try:
                answer = await self._http.get(url)
                answer.raise_for_status()
                found = answer.json()
            except httpx.TransportError as exc:
                raise ProviderUnreachable(f"The OpenID provider did not answer: {exc!r}") from exc
            except (httpx.HTTPError, ValueError) as exc:
                raise SignInFailed(
                    f"The OpenID provider's discovery document could not be read: {exc}"
                ) from exc
            if found.get("issuer") != self.config.issuer:
                raise SignInFailed("The OpenID provider's discovery document names another issuer.")
            self._metadata = ProviderMetadata(
                issuer=found["issuer"],
                authorization_endpoint=found["authorization_endpoint"],
                token_endpoint=found["token_endpoint"],
                jwks_uri=found["jwks_uri"],
                end_session_endpoint=found.get("end_session_endpoint"),
                device_authorization_endpoint=found.get("device_authorization_endpoint"),
            )
            self._metadata_read = time.monotonic()
        return self._metadata

    async def authorization_url(self, state: str, nonce: str, verifier: str, login_hint: str | None) -> str:
        """Where the browser signs in: built here, no request made (the discovery document is cached)."""
        metadata = await self.metadata()
        extra = {"login_hint": login_hint} if login_hint else {}
        url, _ = self._oauth.create_authorization_url(
            metadata.authorization_endpoint, state=state, nonce=nonce, code_verifier=verifier, **extra
        )
        return str(url)

    async def exchange(self, code: str, verifier: str) -> Tokens:
        """The tokens the token endpoint gives for `code` (and the PKCE verifier)."""
        return await self._tokens(grant_type="authorization_code", code=code, code_verifier=verifier)

    async def refresh(self, refresh_token: str) -> Tokens:
        """New tokens for a session's refresh token: the provider says again who the person is and what
        their groups are now (`SignInFailed` when it refuses: the person was deleted or the grant revoked;
        `ProviderUnreachable` when it did not answer)."""
        return await self._tokens(grant_type="refresh_token", refresh_token=refresh_token)

    async def device_authorization(self, login_hint: str | None) -> DeviceSignIn:
        """Start a device sign-in (the CLI's `modelhost login`), where the provider offers the grant."""
        metadata = await self.metadata()
        if metadata.device_authorization_endpoint is None:
            raise DeviceNotYet(
                "The OpenID provider offers no device sign-in (RFC 8628); sign in in the console.",
                code="device_flow_unsupported",
            )
        form = {"client_id": self.config.client_id, "scope": self.config.scopes}
        if login_hint:
            form["login_hint"] = login_hint
        try:
            answer = await self._http.post(
                metadata.device_authorization_endpoint,
                data=form,
                auth=(self.config.client_id, self.config.client_secret),
            )
            answer.raise_for_status()
            found = answer.json()
            return DeviceSignIn(
                device_code=str(found["device_code"]),
                user_code=str(found["user_code"]),
                verification_uri=str(found["verification_uri"]),
                verification_uri_complete=found.get("verification_uri_complete"),
                expires_in=int(found.get("expires_in", 600)),
                interval=int(found.get("interval", 5)),
            )
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise SignInFailed(f"The OpenID provider refused the device sign-in: {exc}") from exc

    async def device_exchange(self, device_code: str) -> Tokens:
        """The tokens once the person has confirmed the device sign-in; `DeviceNotYet` before."""
        return await self._tokens(grant_type=DEVICE_GRANT, device_code=device_code)

    async def _tokens(self, **form: str) -> Tokens:
        """The token endpoint's answer to `form`, through the one OAuth client."""
        metadata = await self.metadata()
        try:
            token = await self._oauth.fetch_token(metadata.token_endpoint, **form)
        except OAuthError as exc:
            device = form["grant_type"] == DEVICE_GRANT
            if device and exc.error in (
                "authorization_pending",
                "slow_down",
                "expired_token",
                "access_denied",
            ):
                raise DeviceNotYet(exc.description or exc.error, code=exc.error) from exc
            raise SignInFailed(f"The OpenID provider refused the sign-in: {exc}") from exc
        except (httpx.TransportError, httpx2.TransportError) as exc:  # Authlib's client is httpx2's
            raise ProviderUnreachable(f"The OpenID provider did not answer: {exc!r}") from exc
        except Exception as exc:  # an answer that is not a token response
            raise SignInFailed(f"The OpenID provider refused the sign-in: {exc}") from exc
        id_token, refresh_token = token.get("id_token"), token.get("refresh_token")
        if not isinstance(id_token, str):
            raise SignInFailed("The OpenID provider returned no ID token (is `openid` among the scopes?).")
        return Tokens(id_token, refresh_token if isinstance(refresh_token, str) else None)

    async def verify(self, id_token: str, nonce: str | None, now: float | None = None) -> Identity:
        """The identity in `id_token`, once every check of the module docstring has passed. `nonce`:
        the sign-in's; None for a device sign-in (RFC 8628 has none: its token came from the token
        endpoint in exchange for a device code only this server's client can redeem)."""
        header = _header(id_token)
        algorithm = header.get("alg")
        if algorithm not in self.config.algorithms:
            raise SignInFailed(f"The ID token's algorithm {algorithm!r} is not accepted.")
        keys = await self._key_set(header.get("kid"))
        try:
            token = jwt.decode(id_token, keys, algorithms=[str(algorithm)])
        except (JoseError, ValueError) as exc:
            raise SignInFailed(f"The ID token's signature does not verify: {exc}") from exc
        claims = token.claims
        _check_claims(claims, self.config, nonce, time.time() if now is None else now)
        groups = claims.get(self.config.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return Identity(
            subject=str(claims["sub"]),
            email=str(claims["email"]).lower() if claims.get("email") else None,
            email_verified=claims.get("email_verified") is True,
            name=str(claims["name"]) if claims.get("name") else None,
            groups=tuple(str(g) for g in groups if isinstance(g, str)),
        )

    async def logout_url(self, id_token: str, after: str) -> str | None:
        """The provider's RP-initiated logout for this session, where it offers one."""
        metadata = await self.metadata()
        if metadata.end_session_endpoint is None:
            return None
        query = urlencode(
            {"id_token_hint": id_token, "post_logout_redirect_uri": after, "client_id": self.config.client_id}
        )
        return f"{metadata.end_session_endpoint}?{query}"

    async def _key_set(self, kid: object) -> KeySet:
        async with self._lock:
            stale = self._keys is None or time.monotonic() - self._keys_read > DISCOVERY_SECONDS
            unknown = self._keys is not None and kid is not None and not _has_kid(self._keys, kid)
            # an unknown `kid`: the provider rotated its keys. Only the provider can cause this read: ID
            # tokens reach us from its token endpoint alone, never from a client
            if stale or unknown:
                metadata = await self.metadata()
                try:
                    answer = await self._http.get(metadata.jwks_uri)
                    answer.raise_for_status()
                    self._keys = KeySet.import_key_set(answer.json())
                except httpx.TransportError as exc:
                    raise ProviderUnreachable(f"The OpenID provider did not answer: {exc!r}") from exc
                except (httpx.HTTPError, ValueError, JoseError) as exc:
                    raise SignInFailed(f"The OpenID provider's keys could not be read: {exc}") from exc
                self._keys_read = time.monotonic()
            assert self._keys is not None
            return self._keys


def _header(id_token: str) -> dict[str, Any]:
    try:
        encoded = id_token.split(".", 1)[0]
        header = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SignInFailed("The ID token is not a JWT.") from exc
    if not isinstance(header, dict):
        raise SignInFailed("The ID token is not a JWT.")
    return header


def _has_kid(keys: KeySet, kid: object) -> bool:
    return any(key.kid == kid for key in keys.keys)


def _check_claims(claims: dict[str, Any], config: OidcConfig, nonce: str | None, now: float) -> None:
    if claims.get("iss") != config.issuer:
        raise SignInFailed("The ID token was issued by another issuer.")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if config.client_id not in audiences:
        raise SignInFailed("The ID token is meant for another client (`aud`).")
    if len(audiences) > 1 and claims.get("azp") != config.client_id:
        raise SignInFailed("The ID token has several audiences and `azp` is not this client.")
    expires, issued = claims.get("exp"), claims.get("iat")
    if not isinstance(expires, int | float) or expires + SKEW_SECONDS < now:
        raise SignInFailed("The ID token has expired.")
    if not isinstance(issued, int | float) or issued - SKEW_SECONDS > now:
        raise SignInFailed("The ID token was issued in the future (`iat`).")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SignInFailed("The ID token names no subject.")
    if nonce is not None and (
        not isinstance(claims.get("nonce"), str) or not secrets.compare_digest(claims["nonce"], nonce)
    ):
        raise SignInFailed("The ID token's nonce is not this sign-in's.")
