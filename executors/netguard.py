"""One SSRF guard for every outgoing request the service makes on a user's behalf.

rest_executor, webhooks and A2A push notifications all send requests to URLs that task authors
choose. Without a check, a task could reach the cloud metadata service (169.254.169.254), the
database on localhost or anything on the internal network. Keeping the rule in one function
means the three callers cannot drift apart.

The check resolves the host name and looks at *every* address it resolves to, because a name
with one public and one private record would otherwise let the HTTP client pick the private one.
A host resolved here could in theory resolve differently a moment later (DNS rebinding); callers
that follow redirects should run the check on each hop (see `request_guard`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ALLOWED_SCHEMES = ("http", "https")
_OVERRIDE_HINT = "set SERVICE_ALLOW_PRIVATE_URLS=true to allow private addresses"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeURLError(ValueError):
    """The URL may not be requested: wrong scheme, or the host is not a public address."""


def _unwrap(ip: IPAddress) -> IPAddress:
    """See through IPv6 forms that embed an IPv4 address (::ffff:127.0.0.1, 6to4, Teredo)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def non_public_reason(ip: IPAddress) -> str | None:
    """Why `ip` is not a public address, or None when it is.

    Besides the named categories, anything the IANA registries do not mark global (carrier-grade
    NAT 100.64.0.0/10, benchmarking ranges, ...) is refused too: it is never a legitimate target.
    """
    ip = _unwrap(ip)
    for attribute, label in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, attribute):
            return label
    if not ip.is_global:
        return "non-global"
    return None


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeURLError(f"cannot resolve host {host!r}: {exc}") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        # IPv6 sockaddr may carry a scope id ("fe80::1%eth0"); strip it before parsing.
        addresses.append(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
    if not addresses:
        raise UnsafeURLError(f"cannot resolve host {host!r}: no addresses")
    return addresses


async def ensure_public_url(url: str, allow_private: bool) -> None:
    """Raise UnsafeURLError unless `url` is http(s) and its host is a public address.

    With `allow_private` only the scheme is checked (no DNS lookup): the operator has said
    internal targets are fine, so a name that does not resolve is the HTTP client's problem.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURLError(f"invalid URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise UnsafeURLError(
            f"URL scheme {parts.scheme or '(none)'!r} is not allowed; use http or https"
        )
    host = parts.hostname
    if not host:
        raise UnsafeURLError(f"URL {url!r} has no host")
    if allow_private:
        return
    if port is None:
        port = 443 if scheme == "https" else 80
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(host.split("%", 1)[0])]
    except ValueError:
        addresses = await _resolve(host, port)
    for ip in addresses:
        reason = non_public_reason(ip)
        if reason is not None:
            shown = host if str(ip) == host else f"{host} ({ip})"
            raise UnsafeURLError(
                f"refusing to connect to {shown}: {reason} address; {_OVERRIDE_HINT}"
            )


def request_guard(allow_private: bool) -> Callable[[Any], Awaitable[None]]:
    """An httpx `event_hooks["request"]` hook that checks every request, redirects included.

    httpx runs request hooks before each hop of a redirect chain, so a public URL answering
    `302 Location: http://169.254.169.254/` is stopped before the second request is sent.
    """

    async def guard(request: Any) -> None:
        await ensure_public_url(str(request.url), allow_private)

    return guard


def log_url(url: str) -> str:
    """The URL as a log line may show it: no user:password, no query, no fragment (tokens)."""
    try:
        parts = urlsplit(redact_url(url))
    except ValueError:
        return "(unparsable URL)"
    return urlunsplit(parts._replace(query="", fragment=""))


def redact_url(url: str) -> str:
    """The URL without user:password, for error messages and results."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
