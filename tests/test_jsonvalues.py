"""storage.jsonvalues, property by property: the gate agrees with what JSON and UTF-8 can carry,
the reader never raises, the encoder never fails on depth, and nothing recurses."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from taskgrove.storage import jsonvalues
from taskgrove.storage.jsonvalues import JsonTextError, Unreadable

any_text = st.text(alphabet=st.characters(categories=["L", "N", "P", "S", "Z", "Cs", "Cc"]), max_size=10)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), any_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)),
    max_leaves=20,
)
FAST = settings(max_examples=300, deadline=None)


def strictly_encodable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        return False
    return True


@FAST
@given(values)
def test_the_gate_refuses_exactly_what_cannot_be_sent_as_json(value: Any) -> None:
    assert (jsonvalues.problem(value, "v") is None) == strictly_encodable(value)


@FAST
@given(values)
def test_a_refusal_names_the_place(value: Any) -> None:
    found = jsonvalues.problem({"inputs": value}, "params")
    if found is not None:
        assert found.startswith("params.inputs")
        found.encode("utf-8")  # the message itself can always be sent


@FAST
@given(values)
def test_text_the_gate_accepts_parses_back_to_the_same_value(value: Any) -> None:
    if jsonvalues.problem(value, "v") is not None:
        return
    parsed = jsonvalues.loads(jsonvalues.dumps_bytes(value), max_depth=1000)
    assert parsed.value == value or (isinstance(value, float) and math.isnan(value))


@FAST
@given(values)
def test_hostile_text_is_parsed_or_refused_in_our_words(value: Any) -> None:
    text = json.dumps(value, allow_nan=True, ensure_ascii=True).encode()
    try:
        parsed = jsonvalues.loads(text)
    except JsonTextError as exc:
        assert str(exc).startswith("body is not valid JSON: ") and "Expecting" not in str(exc)
        return
    if jsonvalues.problem(parsed.value, "v") is not None:
        assert parsed.suspect  # only suspect documents need the walk


@FAST
@given(st.one_of(any_text, st.binary(max_size=40), values.map(lambda v: json.dumps(v, allow_nan=True))))
def test_reading_a_stored_value_never_raises(text: Any) -> None:
    value = jsonvalues.read_stored(text)
    if isinstance(value, Unreadable):
        assert value == {} and value.reason.startswith("cannot be read back")
    else:
        assert strictly_encodable(value)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=50_000))
def test_depth_is_measured_without_recursion(depth: int) -> None:
    text = b"[" * depth + b"]" * depth
    assert jsonvalues.too_deep(text, 100) == (depth > 100)
    assert jsonvalues.too_deep(b'["' + b"[" * depth + b'"]', 100) is False  # brackets inside a string
    if depth > 100:
        try:
            jsonvalues.loads(text)
        except JsonTextError as exc:
            assert "nested deeper than 100 levels" in str(exc)
        else:
            raise AssertionError("a too deep body parsed")
    stored = jsonvalues.read_stored(text.decode())
    assert isinstance(stored, Unreadable) == (depth > jsonvalues.STORED_MAX_DEPTH)


def _nesting(value: Any) -> int:
    """How deep a parsed document nests (an object or array is one level)."""
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    return 0


@FAST
@given(st.recursive(st.none() | st.integers() | st.text(alphabet='ab[]{}()"\\', max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.text(alphabet='k[{"\\', max_size=3), inner, max_size=3), max_leaves=40),
       st.integers(min_value=0, max_value=8))
def test_depth_of_a_document_is_its_nesting(value: Any, limit: int) -> None:
    """Brackets and quotes inside strings (escaped or not) never count; every level outside does."""
    text = json.dumps(value).encode()
    assert jsonvalues.too_deep(text, limit) == (_nesting(value) > limit)


@FAST
@given(st.binary(max_size=60).map(lambda raw: bytes(b'[]{}()\\"a,'[b % 10] for b in raw)),
       st.integers(min_value=0, max_value=8))
def test_depth_of_any_text_follows_the_string_grammar(text: bytes, limit: int) -> None:
    """Malformed texts too (unbalanced brackets, a literal left open, a stray escape): the rule
    that cuts literals out is the JSON string grammar, whichever way it is computed."""
    assert jsonvalues.too_deep(text, limit) == (_depth_by_grammar(text) > limit)


def _depth_by_grammar(text: bytes) -> int:
    """The deepest running bracket count outside string literals, found one byte at a time by
    the JSON string grammar (an escape hides the byte after it); a quote whose literal never
    closes opens none (the bytes after it count)."""
    depth = deepest = 0
    i = 0
    while i < len(text):
        byte = text[i]
        if byte == ord('"'):
            end = i + 1
            while end < len(text) and text[end] != ord('"'):
                end += 2 if text[end] == ord("\\") else 1
            if end < len(text):  # a complete literal: skipped
                i = end + 1
                continue
        elif byte in b"[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]})":
            depth -= 1
        i += 1
    return deepest


def test_deep_values_are_encoded_and_walked_without_recursion() -> None:
    deep: Any = "leaf"
    for _ in range(50_000):
        deep = {"children": [deep]}
    text = jsonvalues.dumps(deep)
    assert text.startswith('{"children":[{"children":[') and text.count("leaf") == 1
    assert jsonvalues.problem(deep, "v") is None
    assert jsonvalues.problem(deep, "v", max_depth=100) == "v" + ".children[0]" * 50 + " is nested deeper than 100 levels"


def test_replies_never_carry_nan_or_invalid_text() -> None:
    assert jsonvalues.dumps_bytes({"a": math.inf, "b": [math.nan], "c": "\ud800", "\udc00": 1}) == \
        b'{"a":null,"b":[null],"c":null,"?":1}'
    assert jsonvalues.dumps_bytes({"ok": [1.5, "\U0001F600"]}) == '{"ok":[1.5,"\U0001F600"]}'.encode("utf-8")


# --- orjson where it reads and writes as json does (issue 13) ----------------------------------

def same(a: Any, b: Any) -> bool:
    """Equal values of the same types (a float's sign and an Unreadable's reason included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Unreadable):
        return a.reason == b.reason
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


json_alphabet = st.sampled_from(list('{}[]",:0123456789-+.eE \\ntrufalsNIy') + ["\\u", "d8", "00", "é", "\ud800"])
numbers = st.one_of(st.integers(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.floats(),
                    st.decimals(allow_nan=False, allow_infinity=False).map(str))


@settings(max_examples=600, deadline=None)
@given(st.one_of(
    values.map(lambda v: json.dumps(v, allow_nan=True)),
    values.map(lambda v: json.dumps(v, allow_nan=True, ensure_ascii=False)),
    st.lists(numbers, max_size=5).map(lambda v: "[" + ", ".join(map(str, v)) + "]"),
    st.lists(json_alphabet, max_size=30).map("".join),
))
def test_stored_text_reads_the_same_through_orjson_as_through_json(text: str) -> None:
    assert same(jsonvalues.read_stored(text), jsonvalues._read_with_json(text)), text


@settings(max_examples=600, deadline=None)
@given(st.one_of(values, st.lists(numbers, max_size=5), st.dictionaries(st.integers(), values, max_size=3)))
def test_replies_encode_to_the_same_value_through_orjson_as_through_json(value: Any) -> None:
    fast = jsonvalues.dumps_bytes(value)
    usual = jsonvalues._dumps_bytes_with_json(value)
    assert same(json.loads(fast), json.loads(usual))
    # byte for byte, but for floats below 1e-4 written positionally (0.00001 for 1e-05)
    assert fast == usual or b"e-" in usual


def parsed_or_error(parse: Any, text: bytes) -> Any:
    try:
        parsed = parse()
    except JsonTextError as exc:
        return ("error", str(exc))
    return parsed


@settings(max_examples=600, deadline=None)
@given(st.one_of(
    values.map(lambda v: json.dumps(v, allow_nan=True).encode("utf-8", "surrogatepass")),
    values.map(lambda v: json.dumps(v, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.lists(numbers, max_size=5).map(lambda v: ("[" + ", ".join(map(str, v)) + "]").encode()),
    st.lists(json_alphabet, max_size=30).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass")),
    st.binary(max_size=30),
))
def test_request_text_parses_the_same_through_orjson_as_through_json(text: bytes) -> None:
    fast = parsed_or_error(lambda: jsonvalues.loads(text), text)
    usual = parsed_or_error(lambda: jsonvalues._loads_with_json(text, jsonvalues.DEFAULT_MAX_DEPTH, "body"), text)
    if isinstance(usual, tuple):
        assert fast == usual
        return
    assert same(fast.value, usual.value), text
    if fast.suspect != usual.suspect:  # orjson's: the walk of a suspect document would find nothing
        assert not fast.suspect and jsonvalues.problem(usual.value, "v") is None


@settings(max_examples=600, deadline=None)
@given(st.one_of(
    st.text(alphabet=st.sampled_from(list("0123456789a-.é٣") + ["\ud800", "𝟗"]), max_size=60),
    st.lists(st.integers(min_value=0, max_value=10 ** 25), max_size=4).map(lambda v: json.dumps(v)),
    st.tuples(st.text(max_size=5), st.integers(min_value=15, max_value=22), st.text(max_size=5)).map(
        lambda parts: parts[0] + "7" * parts[1] + parts[2]),  # runs around the length that counts
))
def test_a_long_number_is_found_exactly_where_a_run_of_ascii_digits_is(text: str) -> None:
    """has_long_number (a byte map and one substring search) against the plain definition:
    LONG_DIGITS ASCII digits in a row; other scripts' digits (Arabic-Indic, mathematical) never count."""
    run = 0
    longest = 0
    for char in text:
        run = run + 1 if "0" <= char <= "9" else 0
        longest = max(longest, run)
    assert jsonvalues.has_long_number(text.encode("utf-8", "surrogatepass")) == (longest >= jsonvalues.LONG_DIGITS)
