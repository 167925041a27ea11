"""storage.results: the check every task outcome passes before it is stored. The shortcut for
small plain values must agree with the full walk on every value and every limit."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgrove.storage import results
from taskgrove.storage.json_text import json_text
from taskgrove.storage import jsonvalues
from taskgrove.storage.results import Unstorable, storable

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["\ud800", "é", "x" * 40]))
json_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 9)), inner, max_size=6)), max_leaves=40)


def walked(value: Any, max_depth: int, max_bytes: int) -> tuple[str, Any]:
    """What the full walk alone answers: the stored value (and whether it is the same object),
    or the refusal's message."""
    steps = results._steps(value, max_depth, max_bytes, "result")
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return ("same" if done.value is value else "copy", done.value)
    except Unstorable as exc:
        return ("refused", str(exc))


@settings(max_examples=400, deadline=None)
@given(value=json_like, max_depth=st.integers(0, 10), max_bytes=st.integers(0, 400))
def test_the_shortcut_answers_what_the_walk_answers(value: Any, max_depth: int, max_bytes: int) -> None:
    expected = walked(value, max_depth, max_bytes)
    if results._small_and_plain(value, max_depth, max_bytes):
        assert expected[0] == "same", expected  # taken only where the walk keeps the value as it is
    try:
        got: tuple[str, Any] = ("same" if (result := storable(value, max_depth=max_depth,
                                                               max_bytes=max_bytes)) is value else "copy", result)
    except Unstorable as exc:
        got = ("refused", str(exc))
    assert _comparable(got) == _comparable(expected)


def _comparable(answer: tuple[str, Any]) -> Any:
    kind, value = answer
    return kind, repr(value) if kind != "refused" else value


@pytest.mark.parametrize("value", [{"ok": True, "inputs": {}}, [1, 2.5, None, "x"], "text", 3, None])
def test_typical_results_take_the_shortcut_and_come_back_unchanged(value: Any) -> None:
    assert results._small_and_plain(value, 100, 16 * 1024 * 1024)
    assert storable(value, max_depth=100, max_bytes=16 * 1024 * 1024) is value


def test_what_the_shortcut_leaves_to_the_walk() -> None:
    limits = {"max_depth": 100, "max_bytes": 1 << 24}
    assert not results._small_and_plain({"n": math.nan}, 100, 1 << 24)
    with pytest.raises(Unstorable, match="is not a finite number"):
        storable({"n": math.nan}, **limits)
    with pytest.raises(Unstorable, match="lone surrogate"):
        storable({"s": "\ud800"}, **limits)
    assert storable((1, 2), **limits) == [1, 2]
    assert storable({1: "a"}, **limits) == {"1": "a"}


def test_a_refused_scalar_is_named_by_its_place_in_the_gates_words() -> None:
    limits = {"max_depth": 100, "max_bytes": 1 << 24}
    cases = [({"v": [1, math.inf]}, "the result.v[1] " + jsonvalues.NOT_FINITE),
             ({"a": {"b\ud800": 1}}, "the result.a has a key that " + jsonvalues.NOT_UNICODE),
             ([{"s": "\udfff"}] * 3, "the result[0].s " + jsonvalues.NOT_UNICODE),
             (math.nan, "the result " + jsonvalues.NOT_FINITE)]
    for value, said in cases:
        with pytest.raises(Unstorable) as refused:
            storable(value, **limits)
        assert str(refused.value) == said


def test_json_texts_shared_within_an_insert_are_json_dumps_texts() -> None:
    """The tree insert encodes equal values once (storage/json_text.py json_text with a memo): the text
    must still be exactly json.dumps of each value, whatever values came before it (1, 1.0 and
    True are equal in Python and written differently)."""
    flat = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5, -0.0]),
                     st.sampled_from(["", "a", "1", "\u00e9", "true"]))
    keys = st.sampled_from(["a", "b", "id", "required", "\u00e9"])
    objects = st.dictionaries(keys, flat, max_size=3)
    values = st.one_of(flat, objects, st.lists(objects, max_size=3),
                       st.dictionaries(keys, st.lists(flat, max_size=2), max_size=2))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(values, max_size=12))
    def check(sequence: list[Any]) -> None:
        memo: dict[Any, str] = {}
        for value in sequence:
            assert json_text(value, memo) == json.dumps(value)

    check()
    memo: dict[Any, str] = {}  # equal in Python, written differently
    for value in ({"a": 1}, {"a": True}, {"a": 1.0}, [{"required": 1}], [{"required": True}], {"a": 0}, {"a": False},
                  {"a": 0.0}, {"a": -0.0}, [{"x": -0.0}], [{"x": 0.0}]):  # -0.0: found by the check above
        assert json_text(value, memo) == json.dumps(value)


@settings(max_examples=400, deadline=None)
@given(json_like.filter(lambda v: not isinstance(v, tuple)))
def test_stored_text_is_json_dumps_text_for_every_value(value: Any) -> None:
    """json_text.stored_dumps calls json's C encoder directly: the text must be json.dumps'
    own, for any value (NaN and infinities, big integers, lone surrogates, non-ASCII keys)."""
    from taskgrove.storage.json_text import stored_dumps

    assert stored_dumps(value) == json.dumps(value)
