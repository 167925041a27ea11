"""Fetching and reading an agent's card for the directory (agents.add, agents.refresh, the refresher).

Every request passes the SSRF guard (executors/netguard.py) before it is sent, redirects included,
as a2a_agent_executor's do; the card is parsed by the a2a-sdk (`parse_agent_card`, which reads a
1.0 card and maps a 0.3 one: `url`, `preferredTransport`, `additionalInterfaces`), so what the
directory stores is what the SDK's client will later see. A refresh sends `If-None-Match` and
`If-Modified-Since` when the last answer gave an ETag or a Last-Modified: a 304 costs the agent
nothing and changes nothing here.

Errors are `CardError` with a message fit for the caller: the URL without user:password, never a
header's value (headers carry credentials).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from taskgrove.executors.card_trust import UntrustedCard, verify_card
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url, redact_url, request_guard
from taskgrove.executors import tls
from taskgrove.storage import jsonvalues

MAX_CARD_BYTES = 1024 * 1024
FETCH_TIMEOUT = 15.0
WELL_KNOWN = "/.well-known/agent-card.json"


class CardError(Exception):
    """The card could not be fetched or is not an agent card; the message says which, safely."""


@dataclass(frozen=True, slots=True)
class FetchedCard:
    """One fetch: the card's stored fields (None when the agent answered 304 Not Modified) and the
    validators to send next time."""

    fields: dict[str, Any] | None
    etag: str | None
    last_modified: str | None


def card_address(url: str) -> str:
    """Where the card of `url` is: the URL itself when its path is a card (`/.well-known/...` or
    `*.json`), else `<url>/.well-known/agent-card.json` (the rule a2a_agent_executor follows)."""
    parts = urlsplit(url)
    if "/.well-known/" in parts.path or parts.path.endswith(".json"):
        return url
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + WELL_KNOWN))


def card_fields(card: Any) -> dict[str, Any]:
    """What the directory keeps of a parsed card (an a2a-sdk AgentCard): name, description,
    version, the protocol version, skills and interfaces."""
    interfaces = [{"url": i.url, "protocol_binding": i.protocol_binding, "protocol_version": i.protocol_version or None}
                  for i in card.supported_interfaces]
    skills = [{"id": s.id, "name": s.name, "description": s.description, "tags": list(s.tags),
               "examples": list(s.examples), "input_modes": list(s.input_modes) or list(card.default_input_modes),
               "output_modes": list(s.output_modes) or list(card.default_output_modes)} for s in card.skills]
    versions = sorted({i["protocol_version"] for i in interfaces if i["protocol_version"]})
    return {"card_name": card.name, "description": card.description or None, "version": card.version or None,
            "protocol_version": versions[-1] if versions else None, "skills": skills, "interfaces": interfaces}


def parse_card(data: Any) -> dict[str, Any]:
    """The stored fields of a card given as JSON, or CardError naming what is wrong."""
    from a2a.client.card_resolver import parse_agent_card
    from google.protobuf.json_format import ParseError

    if not isinstance(data, dict):
        raise CardError("the answer is not an agent card (a JSON object)")
    try:
        card = parse_agent_card(json.loads(json.dumps(data)))  # the parser edits its argument
    except (ParseError, ValueError, TypeError) as exc:
        raise CardError(f"the agent card is not valid: {str(exc).splitlines()[0][:300]}") from None
    if not card.name:
        raise CardError("the agent card has no name")
    if not card.supported_interfaces:
        raise CardError("the agent card names no interface (url / supportedInterfaces) to send messages to")
    return card_fields(card)


async def fetch_card(url: str, headers: Mapping[str, str], allow_private: bool, *, etag: str | None = None,
                     last_modified: str | None = None, trusted_keys: Mapping[str, bytes] | None = None) -> FetchedCard:
    """GET the card of `url` through the SSRF guard, conditionally when validators are given; with
    `trusted_keys` (SERVICE_AGENT_TRUSTED_KEYS) an unsigned or tampered card is refused
    (executors/card_trust.py `verify_card`, the check a2a_agent_executor makes too)."""
    address = card_address(url)
    shown = redact_url(address)
    try:
        await ensure_public_url(address, allow_private)
    except UnsafeURLError as exc:
        raise CardError(str(exc)) from None
    sent = dict(headers)
    if etag:
        sent["If-None-Match"] = etag
    if last_modified:
        sent["If-Modified-Since"] = last_modified
    import httpx  # here, not at the top: a service at idle has not loaded httpx (tests/test_a2a_card.py)

    try:
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=True, trust_env=False,
                                     event_hooks={"request": [request_guard(allow_private)]},
                                     verify=tls.shared_context(trust_env=False)) as client:
            async with client.stream("GET", address, headers=sent) as answer:
                if answer.status_code == 304:
                    return FetchedCard(None, etag, last_modified)
                if answer.status_code != 200:
                    raise CardError(f"fetching the agent card at {shown} answered HTTP {answer.status_code}")
                body = b""
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_CARD_BYTES:
                        raise CardError(f"the agent card at {shown} is larger than {MAX_CARD_BYTES} bytes")
                validators = answer.headers.get("etag"), answer.headers.get("last-modified")
    except UnsafeURLError as exc:  # a redirect to a private address
        raise CardError(str(exc)) from None
    except httpx.HTTPError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CardError(f"fetching the agent card at {shown} failed: {reason[:200]}") from None
    try:
        data = jsonvalues.loads(body, what="the agent card").value  # the gate: depth, NaN, surrogates
    except jsonvalues.JsonTextError:
        raise CardError(f"the answer at {shown} is not JSON, so not an agent card") from None
    if trusted_keys and isinstance(data, dict):
        try:
            verify_card(data, trusted_keys, f"the agent card of {shown}")
        except UntrustedCard as exc:
            raise CardError(str(exc)) from None
    return FetchedCard(parse_card(data), validators[0], validators[1])
