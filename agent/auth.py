"""Who is calling, and what they may touch. Every surface asks this module, nothing else.

With JWT off every caller is `ANONYMOUS` and may do everything. With JWT on a valid token gives
a `Caller` with the token's user and roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from agent.settings import Settings


@dataclass(frozen=True)
class Caller:
    user_id: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)
    # True when a valid token was presented (JWT on); False with JWT off.
    authenticated: bool = False

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def unrestricted(self) -> bool:
        """JWT off, an admin, or a token with neither user_id nor sub (SPEC: checks skipped)."""
        return not self.authenticated or self.is_admin or self.user_id is None

    def can_access(self, owner: str | None) -> bool:
        return self.unrestricted or owner == self.user_id


ANONYMOUS = Caller()


class AuthError(Exception):
    """No usable token while JWT is on; the message says why (never the token itself)."""


def token_from(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    """`Authorization: Bearer <token>`, else a cookie named `Authorization`."""
    header = headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise AuthError("Malformed Authorization header: expected 'Bearer <token>'")
    cookie = cookies.get("Authorization")
    if cookie:
        return cookie[7:].strip() if cookie.lower().startswith("bearer ") else cookie.strip()
    return None


def authenticate(headers: Mapping[str, str], cookies: Mapping[str, str], settings: "Settings") -> Caller:
    """The caller of one request; raises AuthError when JWT is on and the token is unusable."""
    if not settings.jwt_enabled:
        return ANONYMOUS
    token = token_from(headers, cookies)
    if token is None:
        raise AuthError("Missing token: send 'Authorization: Bearer <token>'")
    return caller_from_token(token, settings)


def caller_from_token(token: str, settings: "Settings") -> Caller:
    import jwt

    try:
        claims = jwt.decode(
            token,
            settings.jwt_secret,
            algorithms=list(settings.jwt_algorithms),
            options={"require": []},
        )
    except jwt.ExpiredSignatureError:
        raise AuthError("Token expired") from None
    except jwt.InvalidSignatureError:
        raise AuthError("Invalid token signature") from None
    except jwt.DecodeError:
        raise AuthError("Malformed token") from None
    except jwt.InvalidTokenError as exc:
        raise AuthError(f"Invalid token: {type(exc).__name__}") from None
    user = claims.get("user_id") or claims.get("sub")
    roles = claims.get("roles") or []
    if isinstance(roles, str):
        roles = [roles]
    return Caller(
        user_id=str(user) if user is not None else None,
        roles=frozenset(str(r) for r in roles if isinstance(r, (str, int))),
        authenticated=True,
    )


def mint_token(settings: "Settings", user_id: str, roles: "list[str] | None" = None,
               expires_in: float | None = 3600.0) -> str:
    """A token for `user_id` signed with the configured secret (the `taskgrove token` command)."""
    import time

    import jwt

    if not settings.jwt_secret:
        raise ValueError("SERVICE_JWT_SECRET is not set: there is no secret to sign tokens with")
    claims: dict[str, object] = {"user_id": user_id, "sub": user_id, "iat": int(time.time())}
    if roles:
        claims["roles"] = list(roles)
    if expires_in is not None:
        claims["exp"] = int(time.time() + expires_in)
    return jwt.encode(claims, settings.jwt_secret, algorithm=settings.jwt_algorithms[0])
