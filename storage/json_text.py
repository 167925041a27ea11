"""The text a JSON column stores, written as SQLAlchemy's JSON type writes it (json.dumps), fast.

The engine's pass and a tree's insert send JSON columns to the database as text they wrote
themselves (the driver's own statements skip SQLAlchemy's type layer): this is the one writer of
that text, so every path stores the same bytes (`dependents()` matches them with LIKE), and the
tree insert encodes values its tasks share (schemas, retry policy, dependency lists) once.
tests/test_results.py compares it with json.dumps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_EMPTY_JSON = {type(None): "null", dict: "{}", list: "[]"}  # most stored JSON values: json.dumps skipped


def _stored_dumps() -> Callable[[Any], str]:
    """json.dumps with its default settings, text for text, without the Python it runs around
    the C encoder on every call (dumps, encode, iterencode, and a new C encoder each time: about
    two thirds of the 2 us a small value costs). No circular-reference check: what is stored here
    is parsed JSON or storable()'s output (storage/results.py), never cyclic. Plain json.dumps
    where the C encoder is missing. tests/test_results.py compares the two."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]  # CPython's, may be None
    if make is None:
        return json.dumps
    encode = make(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                  False, False, True)
    return lambda value: "".join(encode(value, 0))


stored_dumps = _stored_dumps()


def json_text(value: Any, memo: dict[Any, str] | None = None) -> str:
    """The text SQLAlchemy's JSON type stores for `value` (json.dumps; None is 'null').

    `memo`: texts already written in this statement, by _same_text key. The tasks of one tree
    mostly share their schemas, retry policy and (in layers) dependency lists: each is encoded
    once, not once a row (json.dumps costs about four times building the key)."""
    if not value and type(value) in _EMPTY_JSON:
        return _EMPTY_JSON[type(value)]
    if memo is None:
        return stored_dumps(value)
    key = same_text(value)
    if key is None:
        return stored_dumps(value)
    text = memo.get(key)
    if text is None:
        text = memo[key] = stored_dumps(value)
    return text


_FLAT = frozenset({str, int, float, bool, type(None)})


def same_text(value: Any) -> tuple[Any, ...] | None:
    """A key equal only for values json.dumps writes identically (each item's type is part of
    it: 1, 1.0 and True compare equal but are written differently; a float is keyed by its
    text: 0.0 and -0.0 compare equal too), for an object of plain values or a list of such
    objects; None for anything else."""
    if value.__class__ is dict:
        items = []
        for key, item in value.items():
            kind = item.__class__
            if kind not in _FLAT:
                return None
            items.append((key, kind, repr(item) if kind is float else item))
        return (dict, *items)
    if value.__class__ is list:
        parts = []
        for item in value:
            part = same_text(item) if item.__class__ is dict else None
            if part is None:
                return None
            parts.append(part)
        return (list, *parts)
    return None
