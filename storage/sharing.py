"""The `concurrency` and `rate_limit` fields of a task: read once at creation, stored normalised.

    "concurrency": {"key": "openai", "limit": 4}
    "rate_limit":  {"key": "openai", "per_minute": 60}     (or "per_second": 2.5)

A key may name the task's owner or one of its inputs: `{user_id}` and `{inputs.<name>}` are
replaced when the task is created (`"customer-{inputs.customer}"`), so every later read and
every claim sees the same, resolved key. `limit` may be left out when the deployment sets one
for the key (SERVICE_CONCURRENCY_LIMITS); the engine takes the smaller of the two. The engine's
side of both rules is agent/engine/limits.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

MAX_KEY = 255
MAX_LIMIT = 100_000
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class SharingError(ValueError):
    """A `concurrency` or `rate_limit` object is malformed; the message names the field."""


def resolve_key(template: Any, field: str, user_id: str | None, inputs: Mapping[str, Any]) -> str:
    """The key with `{user_id}` and `{inputs.<name>}` replaced by the task's own values."""
    if not isinstance(template, str) or not template.strip():
        raise SharingError(f"{field}.key must be a non-empty string such as \"openai\" or \"{{user_id}}\"")

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "user_id":
            return user_id or ""
        if name.startswith("inputs.") and name[7:] in inputs:
            found = inputs[name[7:]]
            if isinstance(found, (str, int)) and not isinstance(found, bool):
                return str(found)
            raise SharingError(f"{field}.key: inputs.{name[7:]} must be a string or an integer to be part of a key")
        raise SharingError(f"{field}.key: unknown placeholder {{{name}}} (use {{user_id}} or {{inputs.<name>}})")

    key = _PLACEHOLDER.sub(value, template)
    if len(key) > MAX_KEY:
        raise SharingError(f"{field}.key is longer than {MAX_KEY} characters once resolved")
    return key


def concurrency(raw: Any, user_id: str | None, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored form of `concurrency`: {"key": resolved key, "limit": n or None}."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SharingError('concurrency must be an object such as {"key": "openai", "limit": 4}')
    unknown = sorted(set(raw) - {"key", "limit"})
    if unknown:
        raise SharingError(f"concurrency: unknown field(s) {', '.join(map(repr, unknown))}; known: key, limit")
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT):
        raise SharingError(f"concurrency.limit must be an integer from 1 to {MAX_LIMIT}")
    return {"key": resolve_key(raw.get("key"), "concurrency", user_id, inputs), "limit": limit}


def rate_limit(raw: Any, user_id: str | None, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored form of `rate_limit`: the key resolved, and exactly one of per_second/per_minute."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SharingError('rate_limit must be an object such as {"key": "openai", "per_minute": 60}')
    unknown = sorted(set(raw) - {"key", "per_second", "per_minute"})
    if unknown:
        raise SharingError(f"rate_limit: unknown field(s) {', '.join(map(repr, unknown))}; "
                           "known: key, per_second, per_minute")
    rates = [name for name in ("per_second", "per_minute") if raw.get(name) is not None]
    key = resolve_key(raw.get("key"), "rate_limit", user_id, inputs)
    if len(rates) > 1:
        raise SharingError("rate_limit: give per_second or per_minute, not both")
    if not rates:  # the deployment's rate for the key (SERVICE_RATE_LIMITS) applies
        return {"key": key}
    value = raw[rates[0]]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 1_000_000:
        raise SharingError(f"rate_limit.{rates[0]} must be a number above 0 and at most 1000000")
    return {"key": key, rates[0]: value}


def per_second(stored: Mapping[str, Any] | None) -> float | None:
    """The rate a stored `rate_limit` object gives, in attempts per second (None: none given)."""
    if not stored:
        return None
    if stored.get("per_second") is not None:
        return float(stored["per_second"])
    if stored.get("per_minute") is not None:
        return float(stored["per_minute"]) / 60.0
    return None
