"""JSON values that can be stored and sent back: one parser, one gate, one reader, one encoder.

Why one module: a value that is not finite (NaN, Infinity, `1e400`), not valid Unicode (a lone
surrogate from a `\\ud800` escape) or nested too deep breaks every later reader: JSON replies refuse
NaN, UTF-8 refuses lone surrogates, and Python's json and most clients recurse once per level.
So every surface parses request text with `loads`, every write is checked with `problem`, every
stored JSON column is read with `read_stored` (which never raises), and replies are encoded with
`dumps`, which never fails on depth. The rule lives here once, whatever the surface.

Every surface uses it: `/tasks` and `/system` (agent.surfaces.jsonrpc), `/` and the A2A REST routes
(agent.surfaces.a2a.envelope parses with `loads` and checks with `problem`, so `/` and `/tasks` word each
mistake alike), GraphQL over HTTP and WebSocket, the event WebSocket, MCP, and the writes of
storage.new_tree and the service. Executors' results go through storage.results.storable, which
converts as it checks (dates to text, size, shared structures) but refuses a scalar in the words
of this module (NOT_FINITE, NOT_UNICODE) at the place `path_of` names.

Nothing here recurses: depth is measured on the text before parsing, and values are walked with
an explicit stack (`problem`; `_sanitized` and `_iter_encode` repair and encode without recursion).

Walks of a value outside this module go through `rebuild` (a converted copy, with a stack, held to
STORED_MAX_DEPTH with `problem`'s words: TooDeep), so none of them can end in a RecursionError:
- executors.database.json_safe: a driver's row values (a JSON column's document, arrays);
- executors.a2a_lenient.normalize: a remote agent's answer, parsed with `loads` first;
- executors.struct_values.restore_ints: a protobuf Struct's numbers given back as ints.
One walk outside this module only looks, with a stack of its own, over a value `loads` parsed
(so held to the depth `loads` allowed): agent.surfaces.a2a.params_check.first_outside_content.
Stored JSON columns are read with `read_stored` everywhere, also those SQLAlchemy's JSON type does
not read (storage.wait_store `read`: the `waiting` and `wait_answers` text columns; a claim's checkpoint
read on the driver's cursor, storage.executions).

Three walks share these rules (NOT_FINITE, NOT_UNICODE, `is_valid_text`, `path_of`) but not one
traversal, on purpose: `problem` only checks, and is the fast one every create and update pays;
storage.results' walk converts (dates to text, tuples to lists), counts bytes, pauses for other
coroutines and walks a structure shared many times once (`problem` would expand it: 6 s instead
of 0.1 ms for an aggregate of aggregates 22 deep), which makes it about 4 times slower on plain
values; `_sanitized` builds a repaired copy, only for a reply that still holds NaN or a lone
surrogate. A walker with callbacks for all three would slow `problem` and change which of several
faults each one names first.

The depth limits, and why each exists:
- SERVICE_MAX_JSON_DEPTH (settings.max_json_depth, default DEFAULT_MAX_DEPTH = 100): the deepest
  request body, applied to every HTTP body by agent.surfaces.bodylimit before any surface and to each
  WebSocket message by `loads`. Surfaces that parse a body again after bodylimit pass
  STORED_MAX_DEPTH, so the setting is applied once.
- STORED_MAX_DEPTH = 500: the ceiling. The setting may not exceed it; values written by
  storage.new_tree and the service are checked against it and stored values are read back within
  it, so whatever a request may carry can be stored, read and sent back (Python's json,
  graphql-core and most clients fail near 1000).
- agent.surfaces.a2a.envelope.MAX_DEPTH = 90: an A2A data part becomes a protobuf Struct, which the SDK
  cannot build past 100 levels; A2A requests are held to it in addition to the setting.
- SERVICE_MAX_RESULT_DEPTH (settings.max_result_depth): executors' results (storage.results).
(SERVICE_GRAPHQL_MAX_DEPTH bounds a query's selections, not a JSON value.)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

# Deep enough for any realistic inputs and for nested `children` trees of about 30 levels (trees
# of any depth are written flat with parent_id), far below where Python's recursive json,
# graphql-core and most clients fail (about 1000 levels), so a value that passes can be re-encoded
# by every later reader. SERVICE_MAX_JSON_DEPTH overrides it.
DEFAULT_MAX_DEPTH = 100
# Stored values are read with a laxer bound than requests: they may come from executors.
STORED_MAX_DEPTH = 500

NOT_FINITE = "is not a finite number (NaN, Infinity and numbers beyond about 1.8e308 cannot be stored)"
NOT_UNICODE = "is not valid Unicode text (it holds a lone surrogate such as \\ud800)"


class JsonTextError(ValueError):
    """The JSON text itself is at fault (-32700); the message says what to change."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} is not valid JSON: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Parsed:
    """A parsed document and whether it may hold values `problem` refuses (an overflowing number
    or a surrogate escape was seen), so clean documents are never walked twice."""

    value: Any
    suspect: bool


# --- depth of a text, measured before parsing --------------------------------------------------

# A JSON (or GraphQL) string literal, unrolled so the regex engine never backtracks per character.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STEP = [0] * 256
for _byte in b"[{(":
    _STEP[_byte] = 1
for _byte in b"]})":
    _STEP[_byte] = -1
_KEEP = bytes(b for b in range(256) if _STEP[b] == 0)
_AS_PARENS = bytes.maketrans(b"[{]}", b"(())")
_KEEP_QUOTED = bytes(b for b in range(256) if _STEP[b] == 0 and b != ord('"'))


def too_deep(text: bytes, limit: int) -> bool:
    """True when brackets nest more than `limit` levels in `text` outside string literals.

    C-speed: when the text has no more than `limit` openers it cannot be too deep; otherwise the
    strings are cut out, everything but brackets with one translate, and the running depth is one
    accumulate.
    """
    if text.count(b"[") + text.count(b"{") + text.count(b"(") <= limit:
        return False
    brackets = _outside_strings(text).translate(None, _KEEP)
    if not _nested_more_than(brackets.translate(_AS_PARENS), limit):
        return False
    return max(accumulate(map(_STEP.__getitem__, brackets))) > limit


def _nested_more_than(parens: bytes, limit: int) -> bool:
    """False when `parens` (brackets as `(` and `)`) is balanced and nests at most `limit` deep;
    True when it may nest deeper (then too_deep counts exactly).

    Each round removes every innermost pair (one replace at C speed), so a balanced text is gone
    after as many rounds as it nests: a few for a real request, against a Python step per bracket
    to count the running depth (about a millisecond for a 1000-task tree).
    """
    for _ in range(limit):
        shorter = parens.replace(b"()", b"")
        if not shorter:
            return False
        if len(shorter) == len(parens):  # unbalanced: counted exactly
            return True
        parens = shorter
    return bool(parens)


def _outside_strings(text: bytes) -> bytes:
    """`text` with its string literals cut out, as _STRING.sub(b"", text) makes it.

    Without a backslash no quote is escaped, so the literals are the spans between one quote and
    the next: translate keeps only quotes and brackets (a large tree's body shrinks tenfold) and
    split drops every other piece, at C speed, where the regex steps through every byte
    (about 5 % of a 1000-task create, twice: bodylimit and the parse).
    """
    if b"\\" in text or text.count(b'"') % 2:  # an escape, or a literal left open: the regex
        return _STRING.sub(b"", text)
    # Two quotes in a row (a literal without brackets, or the end of one and the start of the
    # next) hide nothing outside literals: one replace drops them, so the split makes few pieces.
    return b"".join(text.translate(None, _KEEP_QUOTED).replace(b'""', b"").split(b'"')[::2])


# --- parsing request text ----------------------------------------------------------------------

# A lone surrogate escape (`"\\ud800"`) is JSON text that names no character: -32700, like a
# byte that is not UTF-8, with the place named.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# What can make a parsed request one that `problem` refuses: a number that may overflow to
# infinity (an exponent of three digits or more, or 300 digits in a row). Only texts that match
# are walked after parsing, so clean documents cost one regex search. Stored text is also
# searched for surrogate escapes (written by hand or by an older version).
_SUSPECT = re.compile(rb"[eE][+]?[0-9]{3}|[0-9]{300}")
_SUSPECT_TEXT = re.compile(r"\\u[dD][89a-fA-F]|[eE][+]?[0-9]{3}|[0-9]{300}")


class _BadConstant(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _BadConstant(name)


# Built once: json.loads with hooks would build a decoder (and its scanner) on every call.
_DECODER = json.JSONDecoder(parse_constant=_constant)


def loads(text: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH, *, what: str = "body") -> Parsed:
    """Parse request text. JsonTextError (our words, never the decoder's) when the text is not
    UTF-8, not JSON, holds NaN/Infinity tokens or lone surrogate escapes (the field named), or
    nests deeper than `max_depth`. Numbers that overflow are valid JSON text: they parse,
    `suspect` is set, and `problem` then names the field that holds them (-32602)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if too_deep(raw, max_depth):
        raise JsonTextError(what, _deeper(max_depth))
    if (b"\\u" not in raw or _SURROGATE_ESCAPE.search(raw) is None) and not has_long_number(raw):
        # orjson where it parses as json does (see read_stored): its value is json's, and it holds
        # no number that overflowed (orjson refuses them) and no invalid text, so there is
        # nothing for `problem` to find (not suspect). Anything it refuses is parsed by json below,
        # which words the error.
        try:
            return Parsed(orjson.loads(raw), False)
        except orjson.JSONDecodeError:
            pass
    return _loads_with_json(raw, max_depth, what)


def _loads_with_json(raw: bytes, max_depth: int, what: str) -> Parsed:
    """loads of a text not too deep, with json alone."""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonTextError(what, f"it is not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        value = _DECODER.decode(decoded)
    except _BadConstant as exc:
        raise JsonTextError(what, f"{exc.args[0]} is not a JSON value (write numbers as finite decimals, "
                                  "or send a string)") from None
    except json.JSONDecodeError as exc:
        raise JsonTextError(what, f"{_syntax(exc)} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise JsonTextError(what, _deeper(max_depth)) from None
    except ValueError:  # e.g. an integer of more than 4300 digits
        raise JsonTextError(what, "a number has too many digits") from None
    if _SURROGATE_ESCAPE.search(raw):  # the text escapes a character that does not exist
        found = problem(value, "", numbers=False)
        if found is not None:
            raise JsonTextError(what, _placed(found))
    return Parsed(value, _SUSPECT.search(raw) is not None)


def _placed(found: str) -> str:
    """A `problem` found from the document root ("" path) as the message shows it."""
    if found.startswith("."):
        return found[1:]
    return found if found.startswith("[") else "the document" + found


def _deeper(max_depth: int) -> str:
    return f"it is nested deeper than {max_depth} levels (the limit is SERVICE_MAX_JSON_DEPTH)"


def _syntax(exc: json.JSONDecodeError) -> str:
    """The decoder's reason in our words (its own are fine, but never promised)."""
    reasons = {
        "Expecting value": "a value is missing or not JSON",
        "Extra data": "there is text after the JSON value",
        "Unterminated string starting at": "a string is not closed",
        "Invalid control character at": "a string holds a raw control character (escape it)",
        "Invalid \\escape": "a string holds an invalid escape",
        "Invalid \\uXXXX escape": "a string holds an invalid \\u escape",
        "Expecting property name enclosed in double quotes": "an object key must be a double-quoted string",
        "Expecting ':' delimiter": "a ':' is missing after an object key",
        "Expecting ',' delimiter": "a ',' is missing between items",
        "Unexpected UTF-8 BOM (decode using utf-8-sig)": "it starts with a byte order mark",
    }
    return reasons.get(exc.msg, "syntax error")


# --- the gate for values -----------------------------------------------------------------------


def problem(value: Any, where: str, max_depth: int | None = None, *, numbers: bool = True) -> str | None:
    """What makes `value` unfit to store or send, naming the place (`inputs.v[2]`), or None.

    Refused: non-finite numbers (unless `numbers` is False), strings (and keys) that are not valid
    Unicode, values that are not JSON, and (with `max_depth`) nesting deeper than that. Walked
    with a stack, never recursion.
    """
    if isinstance(value, str):  # fast path: most task fields are short strings
        return None if value.isascii() or _is_unicode(value) else f"{where} {NOT_UNICODE}"
    if value is None or isinstance(value, int):
        return None
    # Each entry carries its place as a link to its parent's ((parent, key) or None for the
    # value itself): the text of a path is made only for the one place that is reported.
    stack: list[tuple[Any, Any, int]] = [(value, None, 1)]
    while stack:
        item, place, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _is_unicode(item):
                return f"{_path(where, place)} {NOT_UNICODE}"
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if numbers and not math.isfinite(item):
                return f"{_path(where, place)} {NOT_FINITE}"
        elif isinstance(item, Mapping):
            if max_depth is not None and depth > max_depth:
                return f"{_path(where, place)} is nested deeper than {max_depth} levels"
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{_path(where, place)} has a key that is not a string"
                if not key.isascii() and not _is_unicode(key):
                    return f"{_path(where, place)} has a key that {NOT_UNICODE}"
                stack.append((child, (place, key), depth + 1))
        elif isinstance(item, (list, tuple)):
            if max_depth is not None and depth > max_depth:
                return f"{_path(where, place)} is nested deeper than {max_depth} levels"
            stack.extend((child, (place, index), depth + 1) for index, child in enumerate(item))
        else:
            return f"{_path(where, place)} is not a JSON value ({type(item).__name__})"
    return None


class TooDeep(ValueError):
    """A value nested deeper than `rebuild` may walk; the message names the place as `problem` does."""


def rebuild(value: Any, leaf: Callable[[Any, str | None], Any], *, keep: Collection[str] = (),
            where: str = "value", max_depth: int = STORED_MAX_DEPTH,
            each_dict: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """A converted copy of `value`, for walks that change a value as they go (see the module
    docstring): mappings become dicts with text keys, lists, tuples and sets become lists, and
    every other item becomes `leaf(item, key)`, `key` being the nearest mapping key above it
    (None at the top). Values under a key in `keep` are taken as they are, unwalked.
    `each_dict` is called on every dict made, once the copy is whole.

    Walked with a stack, never recursion: TooDeep, worded as `problem` words it, when containers
    nest deeper than `max_depth` (counted as `problem` counts: the outermost is level 1)."""
    root: list[Any] = [None]
    made: list[dict[str, Any]] = []
    # item, the container its copy goes into and its slot there, nearest key, depth, place link
    stack: list[tuple[Any, Any, Any, str | None, int, Any]] = [(value, root, 0, None, 1, None)]
    while stack:
        item, holder, slot, key, depth, place = stack.pop()
        if isinstance(item, Mapping):
            if depth > max_depth:
                raise TooDeep(f"{_path(where, place)} is nested deeper than {max_depth} levels")
            copy: dict[str, Any] = {}
            holder[slot] = copy
            if each_dict is not None:
                made.append(copy)
            for name, child in item.items():
                name = name if name.__class__ is str else str(name)
                if name in keep:
                    copy[name] = child
                    continue
                copy[name] = None  # the key's place in the order; its value comes off the stack
                stack.append((child, copy, name, name, depth + 1, (place, name)))
        elif isinstance(item, (list, tuple, set, frozenset)):
            if depth > max_depth:
                raise TooDeep(f"{_path(where, place)} is nested deeper than {max_depth} levels")
            items: list[Any] = [None] * len(item)
            holder[slot] = items
            stack.extend((child, items, index, key, depth + 1, (place, index))
                         for index, child in enumerate(item))
        else:
            holder[slot] = leaf(item, key)
    if each_dict is not None:
        for copy in made:
            each_dict(copy)
    return root[0]


def _path(where: str, place: Any) -> str:
    """The text of a place given as links to its parent's ((parent, key) or None)."""
    keys: list[Any] = []
    while place is not None:
        place, key = place
        keys.append(key)
    return path_of(where, reversed(keys))


def path_of(where: str, keys: Iterable[Any]) -> str:
    """The text of a place: `where` then `.key` for object members and `[i]` for list items."""
    return where + "".join(f"[{key}]" if isinstance(key, int) else f".{_key(str(key))}" for key in keys)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _key(key: str) -> str:
    """A key as a path shows it: plain keys bare, others quoted and ASCII-escaped (never echoing
    a lone surrogate or a megabyte of text into an error message)."""
    if _PLAIN_KEY.fullmatch(key):
        return key
    shown = key if len(key) <= 40 else key[:37] + "..."
    return json.dumps(shown, ensure_ascii=True)


def is_valid_text(text: str) -> bool:
    """True when `text` can be encoded as UTF-8 (holds no lone surrogate)."""
    return text.isascii() or _is_unicode(text)


# --- reading stored values ---------------------------------------------------------------------


class Unreadable(dict[str, Any]):
    """Stands in for a stored JSON value that cannot be read back (not JSON, not finite, not
    Unicode, too deep). An empty dict, so every consumer keeps working; `reason` says why and
    `storage.task_view.public` reports it instead of the value."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


# Where orjson's reading could differ from json's, the text is read by json (as before orjson):
# surrogate escapes (orjson refuses lone ones, json reads them and `problem` names them) and runs
# of 19 digits or more (orjson reads integers beyond 64 bits as floats). Elsewhere both give the
# same value or orjson refuses the text (invalid JSON, NaN, a number that overflows to infinity,
# text that is not Unicode) and json reads it: tests/test_jsonvalues.py compares the two.
LONG_DIGITS = 19
# Every ASCII digit byte as b"1", every other byte as b"0": a run of LONG_DIGITS digits is then
# one substring search, several times faster than a regex, which tries a match at every digit
# (a stored dependency list of ten ids: 1 us against 5.6 us; a 1000-task request body: 0.4 ms
# against 3 ms). UTF-8 never puts an ASCII byte inside another character, so the bytes of a
# text have exactly its runs of ASCII digits ([0-9], as the regex this replaced).
_DIGIT_MARKS = bytes(0x31 if 0x30 <= byte <= 0x39 else 0x30 for byte in range(256))
_DIGIT_RUN = b"1" * LONG_DIGITS


def has_long_number(raw: bytes) -> bool:
    """Whether `raw` holds LONG_DIGITS ASCII digits in a row (a number orjson may read differently)."""
    return _DIGIT_RUN in raw.translate(_DIGIT_MARKS)


_SURROGATE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")


def read_stored(text: str | bytes | None) -> Any:
    """The JSON deserializer of the storage engines: never raises, so one bad row (written by a
    bug or by hand) cannot fail a read of many rows."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        # SQLite gives a JSON column numeric affinity: the stored text of a plain number (a
        # result or an answer that is just 3) comes back as that number.
        return text
    if text.__class__ is str and len(text) < LONG_DIGITS and "\\u" not in text:
        # Short texts ("{}", "[]", "null", small values: most stored columns) cannot be too deep
        # or hold a long number: orjson at once.
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return _read_with_json(text)
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return Unreadable("cannot be read back: the stored text is not UTF-8")
    if text.count("[") + text.count("{") > STORED_MAX_DEPTH \
            and too_deep(text.encode("utf-8", "surrogatepass"), STORED_MAX_DEPTH):
        return Unreadable(f"cannot be read back: it is nested deeper than {STORED_MAX_DEPTH} levels")
    if ("\\u" not in text or _SURROGATE_TEXT.search(text) is None) \
            and (len(text) < LONG_DIGITS or not has_long_number(text.encode("utf-8", "surrogatepass"))):
        try:  # the common case, several times faster; anything orjson refuses is read by json
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return _read_with_json(text)


def _read_with_json(text: str) -> Any:
    """read_stored's reading of a text not too deep, with json alone."""
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError):
        return Unreadable("cannot be read back: the stored text is not valid JSON")
    if _SUSPECT_TEXT.search(text) or not is_valid_text(text):
        found = problem(value, "value")
        if found is not None:
            return Unreadable(f"cannot be read back: {found}")
    return value


# --- encoding replies ---------------------------------------------------------------------------


def dumps(value: Any) -> str:
    """Compact JSON for a reply. Deep values (a tree read of a long parent_id chain) are encoded
    without recursion; a value that still holds NaN or a lone surrogate (which the gate keeps out
    of storage) is sent with null in its place rather than failing the whole reply."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        pass
    except ValueError:  # NaN or Infinity
        value = _sanitized(value)
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except RecursionError:
            pass
    return "".join(_iter_encode(value))


# orjson writes what json.dumps writes for every value it accepts (compact, UTF-8, the same
# string escapes), except that a float below 1e-4 is written positionally (0.00001 for 1e-05):
# the same number. What it refuses (NaN is written as null by both; integers beyond 64 bits, keys
# that are not strings, nesting deeper than 254, lone surrogates, types json does not know) is
# written by json as before. Datetimes and dataclasses are passed on to json, which refuses them.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def dumps_bytes(value: Any) -> bytes:
    """`dumps` as UTF-8; text that is not Unicode is replaced, never an exception."""
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: json decides, as before orjson
        return _dumps_bytes_with_json(value)


def _dumps_bytes_with_json(value: Any) -> bytes:
    text = dumps(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_iter_encode(_sanitized(value))).encode("utf-8")


def _sanitized(value: Any) -> Any:
    """A copy of `value` with non-finite numbers and invalid strings replaced by null."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, holder, slot = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            holder[slot] = None
        elif isinstance(item, str):
            holder[slot] = item if is_valid_text(item) else None
        elif isinstance(item, Mapping):
            copy: dict[str, Any] = {}
            holder[slot] = copy
            for key, child in item.items():
                key = str(key)
                if not is_valid_text(key):
                    key = key.encode("utf-8", "replace").decode("utf-8")
                copy[key] = None
                stack.append((child, copy, key))
        elif isinstance(item, (list, tuple)):
            items: list[Any] = [None] * len(item)
            holder[slot] = items
            stack.extend((child, items, index) for index, child in enumerate(item))
        elif item is None or isinstance(item, (bool, int, float)):
            holder[slot] = item
        else:
            holder[slot] = str(item)
    return root[0]


_encode_string = json.encoder.encode_basestring


def _iter_encode(value: Any) -> Iterator[str]:
    """Iterative JSON encoder for values too deep for json.dumps (pieces joined by the caller)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Literal):
            yield item.text
        elif isinstance(item, str):
            yield _encode_string(item)
        elif item is None:
            yield "null"
        elif item is True:
            yield "true"
        elif item is False:
            yield "false"
        elif isinstance(item, int):
            yield int.__repr__(item)
        elif isinstance(item, float):
            yield float.__repr__(item) if math.isfinite(item) else "null"
        elif isinstance(item, Mapping):
            if not item:
                yield "{}"
                continue
            yield "{"
            parts: list[Any] = []
            for index, (key, child) in enumerate(item.items()):
                prefix = ("," if index else "") + _encode_string(str(key)) + ":"
                parts.extend((_Literal(prefix), child))
            parts.append(_Literal("}"))
            stack.extend(reversed(parts))
        elif isinstance(item, (list, tuple)):
            if not item:
                yield "[]"
                continue
            yield "["
            parts = []
            for index, child in enumerate(item):
                if index:
                    parts.append(_Literal(","))
                parts.append(child)
            parts.append(_Literal("]"))
            stack.extend(reversed(parts))
        else:
            yield _encode_string(str(item))


class _Literal:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
