"""API keys, scopes and the principal a request acts as."""

from modelhost.auth.principal import Principal, PrincipalKind

__all__ = ["Principal", "PrincipalKind"]
