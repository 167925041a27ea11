"""Values that crossed the A2A SDK as a protobuf `Struct`, given back the JSON they were.

`Struct` stores every number as a double, so `task_count: 3` arrives as `3.0`. Both the agent
surface (what clients send us) and the A2A executor (what a remote agent answers) read data
parts this way; the keys whose values are fractions by nature differ between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def restore_ints(value: Any, fractions: frozenset[str], key: str | None = None) -> Any:
    """Whole floats back to ints, except under the keys in `fractions` (where 1.0 is a fraction)."""
    if isinstance(value, float):
        if key not in fractions and value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, Mapping):
        return {k: restore_ints(v, fractions, k) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_ints(v, fractions, key) for v in value]
    return value
