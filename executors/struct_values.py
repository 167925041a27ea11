"""Values that crossed the A2A SDK as a protobuf `Struct`, given back the JSON they were.

`Struct` stores every number as a double, so `task_count: 3` arrives as `3.0`. Both the agent
surface (what clients send us) and the A2A executor (what a remote agent answers) read data
parts this way; the keys whose values are fractions by nature differ between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskgrove.storage import jsonvalues


def restore_ints(value: Any, fractions: frozenset[str], key: str | None = None) -> Any:
    """Whole floats back to ints, except under the keys in `fractions` (where 1.0 is a fraction).

    A copy made by the JSON gate's walker (storage.jsonvalues.rebuild): no recursion, and
    jsonvalues.TooDeep past its STORED_MAX_DEPTH (protobuf refuses a Struct past 100 levels first)."""
    if isinstance(value, float):
        return _whole(value, key, fractions)
    if not isinstance(value, (Mapping, list)):
        return value

    def leaf(item: Any, near: str | None) -> Any:  # `near` is None only above the first object
        return _whole(item, key if near is None else near, fractions) if isinstance(item, float) else item

    return jsonvalues.rebuild(value, leaf, where="the A2A data")


def _whole(value: float, key: str | None, fractions: frozenset[str]) -> float | int:
    if key not in fractions and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
