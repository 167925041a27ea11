"""Who is calling, and what they may touch. Every surface asks this module, nothing else.

With JWT off (no `SERVICE_JWT_SECRET`) every caller is `ANONYMOUS` and may do everything. With JWT
on, a valid token gives a `Caller` with the token's user (`user_id`, else `sub`) and roles; `admin`
grants access to every task. A token that names no user skips permission checks (SPEC.md,
Authentication 4): it is a service token, signed with our own secret, so it is trusted as such,
unless SERVICE_JWT_REQUIRE_SUBJECT is on, which refuses it.

A claim that is present but malformed makes the token invalid (401), never "no user" (issue 18):
`user_id` and `sub` must be non-empty strings without surrounding whitespace, `roles` an array of
strings, each matched exactly (`" admin "` is not `admin`).

Tokens are shared-secret JWTs, so only the HMAC algorithms are accepted (HS256 by default; the list
is `SERVICE_JWT_ALGORITHMS`). `exp` is enforced whenever the token carries it. Error messages say
*why* a token was refused (missing, malformed, bad signature, expired, ...) and never contain the
token: they go back to the client and into logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.foundations.settings import Settings

log = logging.getLogger(__name__)

# A shared secret can only sign with HMAC; RS*/ES* would need key pairs, and `none` signs nothing.
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
ADMIN_ROLE = "admin"
# An `Authorization` cookie may hold the bare token or `Bearer <token>`.
COOKIE_NAME = "Authorization"


@dataclass(frozen=True)
class Caller:
    """The authenticated principal of one request (or connection)."""

    user_id: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)
    # True when a valid token was presented (JWT on); False with JWT off.
    authenticated: bool = False

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles

    @property
    def unrestricted(self) -> bool:
        """JWT off, an admin, or a token with neither user_id nor sub (SPEC: checks skipped)."""
        return not self.authenticated or self.is_admin or self.user_id is None

    def can_access(self, owner: str | None) -> bool:
        """May this caller read or change data owned by `owner` (a task, a user's LLM keys)?"""
        return self.unrestricted or owner == self.user_id


ANONYMOUS = Caller()


class AuthError(Exception):
    """No usable token while JWT is on; the message says why (never the token itself)."""


class AuthConfigError(ValueError):
    """The JWT settings cannot work (raised at start-up, so no request ever meets it)."""


def check_settings(settings: "Settings") -> None:
    """Refuse JWT settings that would make every token fail, with the variable named."""
    algorithms = list(settings.jwt_algorithms)
    bad = [a for a in algorithms if a not in HMAC_ALGORITHMS]
    if not algorithms or bad:
        raise AuthConfigError(
            f"SERVICE_JWT_ALGORITHMS must list only {', '.join(HMAC_ALGORITHMS)} "
            f"(tokens are signed with the shared SERVICE_JWT_SECRET), got {', '.join(algorithms) or 'nothing'}"
        )


def _strip_bearer(value: str) -> str:
    for prefix in ("bearer ", "bearer%20"):
        if value[: len(prefix)].lower() == prefix:
            return value[len(prefix):].strip()
    return value.strip()


def token_from(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    """`Authorization: Bearer <token>`, else a cookie named `Authorization`; None when neither."""
    header = headers.get("authorization")
    if header is not None and header.strip():
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value:
            raise AuthError("Malformed Authorization header: expected 'Bearer <token>'")
        if " " in value:
            raise AuthError("Malformed Authorization header: the token must not contain spaces")
        return value
    cookie = cookies.get(COOKIE_NAME)
    if cookie:
        token = _strip_bearer(unquote(cookie))
        if token:
            return token
    return None


def authenticate(headers: Mapping[str, str], cookies: Mapping[str, str], settings: "Settings") -> Caller:
    """The caller of one request; raises AuthError when JWT is on and the token is unusable."""
    if not settings.jwt_enabled:
        return ANONYMOUS
    token = token_from(headers, cookies)
    if token is None:
        raise AuthError(
            "Missing token: send 'Authorization: Bearer <token>' (or an 'Authorization' cookie)"
        )
    return caller_from_token(token, settings)


def caller_from_token(token: str, settings: "Settings") -> Caller:
    """Verify `token` with the configured secret and algorithms and read its claims."""
    import jwt

    try:
        claims = jwt.decode(
            token,
            cast(str, settings.jwt_secret),  # set: tokens are verified only when JWT is on
            algorithms=[a for a in settings.jwt_algorithms if a in HMAC_ALGORITHMS],
            # exp/nbf/iat are verified whenever present; none of them is required.
            options={"require": [], "verify_exp": True, "verify_nbf": True, "verify_iat": True},
        )
    except jwt.ExpiredSignatureError:
        raise AuthError("Token expired") from None
    except jwt.InvalidSignatureError:
        raise AuthError("Invalid token signature") from None
    except jwt.InvalidAlgorithmError:
        allowed = ", ".join(settings.jwt_algorithms)
        raise AuthError(f"Invalid token signature: signing algorithm not allowed (allowed: {allowed})") from None
    except jwt.ImmatureSignatureError:
        raise AuthError("Token not yet valid (nbf or iat is in the future)") from None
    except jwt.DecodeError:
        raise AuthError("Malformed token: not a valid JWT") from None
    except jwt.InvalidTokenError as exc:
        if type(exc).__name__ == "InvalidSubjectError":  # PyJWT checks `sub` itself (2.10+)
            raise AuthError("invalid token: the sub claim must be a non-empty string without surrounding "
                            "whitespace") from None
        log.info("token refused: %s: %s", type(exc).__name__, exc)  # the detail goes to the log
        raise AuthError("invalid token: a registered claim (iat, iss, aud, jti, ...) is malformed") from None
    if not isinstance(claims, dict):  # pragma: no cover - PyJWT always returns a dict
        raise AuthError("Malformed token: the payload is not a JSON object")
    user = _user_of(claims)
    if user is None and settings.jwt_require_subject:
        raise AuthError("invalid token: it names no user (neither user_id nor sub), and this service "
                        "requires one (SERVICE_JWT_REQUIRE_SUBJECT)")
    return Caller(user_id=user, roles=_roles_of(claims), authenticated=True)


def _user_of(claims: Mapping[str, Any]) -> str | None:
    """`user_id`, else `sub`; None only when both are absent. A present claim that is not a
    usable name is an AuthError: read as "no user", it would skip every permission check."""
    for name in ("user_id", "sub"):
        if name not in claims:
            continue
        value = claims[name]
        if not isinstance(value, str) or not value or value != value.strip():
            raise AuthError(f"invalid token: the {name} claim must be a non-empty string without "
                            "surrounding whitespace")
        if len(value) > 255 or "\x00" in value:
            raise AuthError(f"invalid token: the {name} claim must be at most 255 characters, without NUL")
    for name in ("user_id", "sub"):
        if name in claims:
            return claims[name]
    return None


def _roles_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """`roles` as a set of names, matched exactly; absent means none, anything but an array of
    strings is an AuthError."""
    if "roles" not in claims:
        return frozenset()
    raw = claims["roles"]
    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        raise AuthError("invalid token: the roles claim must be an array of strings")
    return frozenset(raw)


def mint_token(settings: "Settings", user_id: str, roles: Sequence[str] | Iterable[str] | None = None,
               expires_in: float | None = 3600.0) -> str:
    """A token for `user_id` signed with the configured secret (the `taskgrove token` command).

    `expires_in=None` mints a token without `exp`, which never expires: for service accounts only.
    """
    import jwt

    if not settings.jwt_secret:
        raise ValueError("SERVICE_JWT_SECRET is not set: there is no secret to sign tokens with")
    check_settings(settings)
    if not user_id or not user_id.strip():
        raise ValueError("user_id must be a non-empty string")
    now = int(time.time())
    claims: dict[str, object] = {"user_id": user_id, "sub": user_id, "iat": now}
    role_list = sorted({r for r in (roles or ()) if r})
    if role_list:
        claims["roles"] = role_list
    if expires_in is not None:
        claims["exp"] = now + int(expires_in)
    return jwt.encode(claims, settings.jwt_secret, algorithm=settings.jwt_algorithms[0])
