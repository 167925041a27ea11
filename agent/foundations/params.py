"""Reading JSON-RPC params with clear -32602 errors instead of KeyError/TypeError tracebacks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.storage.jsonvalues import NOT_UNICODE, is_valid_text

_MISSING = object()


def _lookup(params: Mapping[str, Any], name: str, aliases: Sequence[str]) -> Any:
    for key in (name, *aliases):
        if key in params and params[key] is not None:
            return params[key]
    return _MISSING


def string(params: Mapping[str, Any], name: str, *, aliases: Sequence[str] = (), required: bool = False,
           max_length: int = 10_000) -> str | None:
    value = _lookup(params, name, aliases)
    if value is _MISSING:
        if required:
            also = f" (or {', '.join(aliases)})" if aliases else ""
            raise invalid_params(f"{name}{also} is required")
        return None
    return text(value, name, max_length)


def text(value: Any, name: str, max_length: int = 10_000) -> str:
    """`value` as a non-empty string that can be stored (checked_text), else -32602 naming `name`:
    what `string` checks once it found the value, for surfaces whose arguments are already typed."""
    if not isinstance(value, str) or not value:
        raise invalid_params(f"{name} must be a non-empty string, got {value!r}"[:300])
    return checked_text(value, name, max_length)


def checked_text(value: str, name: str, max_length: int = 10_000) -> str:
    """`value` when it can be stored as text: within `max_length`, no NUL (PostgreSQL's text has
    none), valid Unicode; else -32602 naming the field."""
    if len(value) > max_length:
        raise invalid_params(f"{name} is longer than {max_length} characters")
    if "\x00" in value:
        raise invalid_params(f"{name} must not contain NUL characters")
    if not is_valid_text(value):  # GraphQL's own escapes reach here without the JSON gate
        raise invalid_params(f"{name} {NOT_UNICODE}")
    return value


def boolean(params: Mapping[str, Any], name: str, default: bool, *, aliases: Sequence[str] = ()) -> bool:
    value = _lookup(params, name, aliases)
    if value is _MISSING:
        return default
    if not isinstance(value, bool):
        raise invalid_params(f"{name} must be true or false, got {value!r}"[:300])
    return value


def integer(params: Mapping[str, Any], name: str, default: int, *, low: int, high: int) -> int:
    value = _lookup(params, name, ())
    if value is _MISSING:
        return default
    return bounded(value, name, low=low, high=high)


def bounded(value: Any, name: str, *, low: int, high: int) -> int:
    """`value` as an integer within [low, high], else -32602 naming `name` (what `integer` checks
    once it found the value)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_params(f"{name} must be an integer, got {value!r}"[:300])
    if not low <= value <= high:
        raise invalid_params(f"{name} must be between {low} and {high}, got {value}")
    return value


def string_list(params: Mapping[str, Any], name: str, *, aliases: Sequence[str] = (),
                required: bool = False) -> list[str] | None:
    value = _lookup(params, name, aliases)
    if value is _MISSING:
        if required:
            also = f" (or {', '.join(aliases)})" if aliases else ""
            raise invalid_params(f"{name}{also} is required: an array of task ids")
        return None
    return texts(value, name)


def texts(value: Any, name: str) -> list[str]:
    """`value` (one string or an array) as a list of non-empty valid strings, else -32602 naming
    `name`: what `string_list` checks once it found the value."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise invalid_params(f"{name} must be an array of non-empty strings")
    for index, item in enumerate(value):
        checked_text(item, f"{name}[{index}]")  # storable: no NUL (PostgreSQL's text has none), valid Unicode
    return value


def obj(params: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = _lookup(params, name, ())
    if value is _MISSING:
        return None
    if not isinstance(value, Mapping):
        raise invalid_params(f"{name} must be an object, got {type(value).__name__}")
    return dict(value)
