"""The JSON gate has no side doors (issue 44): every walk of a received or stored value outside
storage/jsonvalues.py goes through its walker (`rebuild`) or its reader (`read_stored`), so a value
nested too deep gets the gate's error, never a RecursionError, and one bad stored row never fails
a read.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
from taskgrove.executors.a2a_lenient import _rewrite_json, normalize
from taskgrove.executors.database import json_safe
from taskgrove.executors.struct_values import restore_ints
from taskgrove.storage import jsonvalues, wait_store
from taskgrove.storage.jsonvalues import (
    STORED_MAX_DEPTH,
    JsonTextError,
    TooDeep,
    Unreadable,
    rebuild,
)

# Deeper than Python's recursion limit: a recursive walker fails here with a RecursionError.
ABYSS = 5000


def nested(depth: int, leaf: Any = 1.0) -> Any:
    value: Any = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_rebuild_copies_as_the_walkers_did() -> None:
    value = {"a": [1, (2, 3)], 4: {"b": {"c"}}, "keep": {"x": [1]}}
    copy = rebuild(value, lambda item, key: (item, key), keep={"keep"})
    assert copy == {"a": [(1, "a"), [(2, "a"), (3, "a")]], "4": {"b": [("c", "b")]}, "keep": {"x": [1]}}
    assert copy["keep"] is value["keep"]
    assert rebuild(7, lambda item, key: (item, key)) == (7, None)


def test_rebuild_is_held_to_the_limit_in_the_gates_words() -> None:
    assert rebuild(nested(STORED_MAX_DEPTH), lambda item, _: item) == nested(STORED_MAX_DEPTH)
    with pytest.raises(TooDeep) as caught:
        rebuild(nested(STORED_MAX_DEPTH + 1), lambda item, _: item, where="rows")
    assert str(caught.value).endswith(f"is nested deeper than {STORED_MAX_DEPTH} levels")
    assert str(caught.value).startswith("rows.k[0].k")
    # the same words as the gate's check
    found = jsonvalues.problem(nested(STORED_MAX_DEPTH + 1), "rows", STORED_MAX_DEPTH)
    assert found is not None and found.endswith(f"is nested deeper than {STORED_MAX_DEPTH} levels")


@pytest.mark.parametrize("walk", [
    lambda value: json_safe(value),
    lambda value: normalize(value),
    lambda value: restore_ints(value, frozenset()),
], ids=["database.json_safe", "a2a_lenient.normalize", "struct_values.restore_ints"])
def test_a_too_deep_value_gets_the_gates_error(walk: Any) -> None:
    with pytest.raises(TooDeep, match="nested deeper than"):
        walk(nested(ABYSS))
    walk(nested(STORED_MAX_DEPTH))  # as deep as the gate allows: fine


def test_json_safe_converts_as_before() -> None:
    value = {"when": dt.date(2026, 1, 2), 3: [Decimal("1.5"), b"\x00", float("nan"), (1, {"x": None})]}
    assert json_safe(value) == {"when": "2026-01-02", "3": [1.5, "AA==", "nan", [1, {"x": None}]]}
    assert json_safe(Decimal(12345678901234567890)) == "12345678901234567890"


def test_restore_ints_keeps_fractions_under_their_keys() -> None:
    value = {"count": 3.0, "ratio": 1.0, "items": [2.0, {"ratio": 4.0}], "half": 0.5}
    assert restore_ints(value, frozenset({"ratio"})) == {"count": 3, "ratio": 1.0, "items": [2, {"ratio": 4.0}],
                                                         "half": 0.5}
    assert restore_ints([1.0, 2.0], frozenset({"ratio"}), "ratio") == [1.0, 2.0]
    assert restore_ints(5.0, frozenset()) == 5


def test_normalize_puts_deviations_right_and_leaves_data_alone() -> None:
    answer = {"result": {"status": {"state": "thinking", "timestamp": "2026-11-24T18:35:08.229795"},
                         "history": [{"role": "robot", "parts": [], "data": {"status": {"state": "odd"}}}]}}
    fixed = normalize(answer)
    assert fixed["result"]["status"] == {"state": "unknown", "timestamp": "2026-11-24T18:35:08.229795Z"}
    assert fixed["result"]["history"][0]["role"] == "agent"
    assert fixed["result"]["history"][0]["data"] == {"status": {"state": "odd"}}
    assert answer["result"]["status"]["state"] == "thinking"  # the answer itself is not changed


def test_a_remote_agents_answer_is_parsed_by_the_gate() -> None:
    assert json.loads(_rewrite_json(b'{"status": {"state": "new"}}')) == {"status": {"state": "unknown"}}
    assert _rewrite_json(b"not json") == b"not json"  # passed on: the SDK reports it
    with pytest.raises(JsonTextError, match=f"nested deeper than {STORED_MAX_DEPTH} levels"):
        _rewrite_json(jsonvalues.dumps(nested(ABYSS)).encode())


def test_stored_waits_are_read_by_the_gates_reader() -> None:
    assert wait_store.read(None) is None
    assert wait_store.read('{"kind": "input", "prompt": "?"}') == {"kind": "input", "prompt": "?"}
    broken = wait_store.read('{"kind": "inp')
    assert isinstance(broken, Unreadable)
    assert wait_store.public_wait('{"kind": "inp') is None
    deep = wait_store.read(jsonvalues.dumps(nested(ABYSS)))
    assert isinstance(deep, Unreadable) and "nested deeper" in deep.reason
