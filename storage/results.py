"""Executors' results (and checkpoints) made storable: bounded checks and conversion to plain JSON.

Executors may return anything: deep nesting, huge or exponentially shared structures (an
aggregate of aggregates), NaN, objects that are not JSON at all. `storable` turns such a value
into plain JSON or says why it cannot be stored, doing work proportional to the limit, never to
the size the value would have once expanded: the walk stops as soon as a limit is passed.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from typing import Any

from taskgrove.storage import jsonvalues

_SCALAR_BYTES = 8  # what a number, true, false or null costs in the estimate


class Unstorable(ValueError):
    """The value breaks a limit or is not JSON; the message says which and how to fix it."""


STEPS_PER_SLICE = 20_000  # values visited between two chances for other coroutines to run


def storable(value: Any, *, max_depth: int, max_bytes: int, what: str = "result") -> Any:
    """`value` as plain JSON (lists, dicts with string keys, finite numbers, valid strings).

    Raises Unstorable when the value is nested deeper than `max_depth`, would encode to more
    than about `max_bytes`, or holds a non-finite number or an invalid string. Values of other
    types (dates, decimals, sets...) are stored as their text, as before.
    """
    steps = _checked(value, max_depth, max_bytes, what)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


async def storable_async(value: Any, *, max_depth: int, max_bytes: int, what: str = "result") -> Any:
    """`storable` that lets the event loop serve others every STEPS_PER_SLICE values, so that
    checking a result near the size limit never holds up other requests and trees."""
    import asyncio

    steps = _checked(value, max_depth, max_bytes, what)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


def _checked(value: Any, max_depth: int, max_bytes: int, what: str) -> Generator[None, None, Any]:
    """The walk below, skipped for a small value that is plain JSON already (it comes back as is)."""
    if _small_and_plain(value, max_depth, max_bytes):
        return value
    return (yield from _steps(value, max_depth, max_bytes, what))


_SMALL_NODES = 64  # values visited at most by the shortcut below
_SMALL_DEPTH = 8
_PLAIN_SCALARS = (str, int, bool, type(None))


def _small_and_plain(value: Any, max_depth: int, max_bytes: int) -> bool:
    """True when `value` is small and already plain JSON within the limits (what most executors
    return): the walk below would return it unchanged, so it is skipped. Anything else (large,
    deep, shared, non-ASCII text, other types) gets the walk, which decides and explains."""
    budget = [_SMALL_NODES]

    def size(item: Any, level: int) -> int | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        kind = type(item)
        if kind is str:
            return len(item) + 2 if item.isascii() else None
        if kind in _PLAIN_SCALARS or (kind is float and math.isfinite(item)):
            return _SCALAR_BYTES
        if kind is not dict and kind is not list:
            return None
        if level > min(max_depth, _SMALL_DEPTH):
            return None
        total = 2
        if kind is list:
            total += len(item)
            parts: Any = ((None, v) for v in item)
        else:
            parts = item.items()
        for key, child in parts:
            if kind is dict:
                if type(key) is not str or not key.isascii():
                    return None
                total += len(key) + 4
            child_size = size(child, level + 1)
            if child_size is None:
                return None
            total += child_size
        return total

    found = size(value, 1)
    return found is not None and found <= max_bytes


class _Frame:
    """A container being checked: what had to change in it so far, its size and height so far."""

    __slots__ = ("source", "items", "changes", "size", "height", "key", "is_map")

    def __init__(self, source: Any, key: Any) -> None:
        self.source = source
        self.key = key  # where the finished value goes in the parent frame
        self.height = 1
        self.changes: dict[Any, Any] = {}  # item key -> its JSON form, where it differs
        self.is_map = isinstance(source, Mapping)
        if self.is_map:
            self.items = iter(source.items())
            self.size = 2
        else:
            self.items = enumerate(source)
            self.size = 2 + len(source)

    def finished(self) -> Any:
        """The container itself when it already is plain JSON (sharing kept), else a JSON copy."""
        source, changes = self.source, self.changes
        if self.is_map:
            if not changes and type(source) is dict and all(type(k) is str for k in source):
                return source
            return {k if isinstance(k, str) else str(k): changes.get(k, v) for k, v in source.items()}
        if not changes and type(source) is list:
            return source
        return [changes.get(i, v) for i, v in enumerate(source)]


def _steps(value: Any, max_depth: int, max_bytes: int, what: str) -> Generator[None, None, Any]:
    """The walk, pausing (yield) every STEPS_PER_SLICE values; its return value is the JSON form.

    Post-order and iterative: a container's size and height are known once its last item is
    done, and remembered by identity, so a structure referenced many times (an aggregate of
    aggregates) is walked once and its repetitions are counted by arithmetic, never expanded.
    Containers that already are plain JSON are returned as they are, so that sharing survives
    into the next task's result and the next check. A scalar the gate refuses is named by its
    place (`result.v[2]`), in the gate's words (storage.jsonvalues).
    """
    if not isinstance(value, (Mapping, list, tuple)):
        try:
            plain, size = _leaf(value)
        except _Refused as exc:
            raise Unstorable(f"the {what} {exc.reason}") from None
        _check_size(size, max_bytes, what)
        return plain
    done: dict[int, tuple[Any, int, int]] = {}  # id(container) -> (JSON form, size, height)
    stack = [_Frame(value, None)]
    steps = 0
    key: Any = None
    try:
        while True:
            steps += 1
            if steps % STEPS_PER_SLICE == 0:
                yield
            frame = stack[-1]
            entry = next(frame.items, None)
            if entry is None:  # this container is complete
                stack.pop()
                plain = frame.finished()
                done[id(frame.source)] = (plain, frame.size, frame.height)
                if not stack:
                    return plain
                _add(stack[-1], frame.key, frame.source, plain, frame.size, frame.height, max_bytes, what)
                continue
            key, item = entry
            if frame.is_map:
                frame.size += _key_bytes(key) + 4
            if isinstance(item, (Mapping, list, tuple)):
                seen = done.get(id(item))
                if seen is not None:
                    _add(frame, key, item, seen[0], seen[1], seen[2], max_bytes, what)
                elif len(stack) >= max_depth:
                    raise Unstorable(_too_deep(what, max_depth))
                else:
                    stack.append(_Frame(item, key))
                continue
            plain, size = _leaf(item)
            _add(frame, key, item, plain, size, 0, max_bytes, what)
    except _Refused as exc:
        keys = [f.key for f in stack[1:]] + ([key] if exc.inside else [])
        raise Unstorable(f"the {jsonvalues.path_of(what, keys)} {exc.reason}") from None


def _add(frame: _Frame, key: Any, item: Any, plain: Any, size: int, height: int, max_bytes: int,
         what: str) -> None:
    if plain is not item:
        frame.changes[key] = plain
    frame.size += size
    frame.height = max(frame.height, height + 1)
    _check_size(frame.size, max_bytes, what)


class _Refused(Exception):
    """A scalar (inside=True) or a key of the current container the gate refuses; `reason` in
    the gate's words, the place is added by the walk."""

    def __init__(self, reason: str, inside: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.inside = inside


def _leaf(item: Any) -> tuple[Any, int]:
    """A scalar as stored, and what it costs."""
    if isinstance(item, str):
        return item, _text_bytes(item) + 2
    if item is None or isinstance(item, (bool, int)):
        return item, _SCALAR_BYTES
    if isinstance(item, float):
        if not math.isfinite(item):
            raise _Refused(jsonvalues.NOT_FINITE)
        return item, _SCALAR_BYTES
    text = str(item)  # dates, decimals, sets...: stored as their text
    return text, _text_bytes(text) + 2


def _key_bytes(key: Any) -> int:
    try:
        return _text_bytes(key if isinstance(key, str) else str(key))
    except _Refused:
        raise _Refused(f"has a key that {jsonvalues.NOT_UNICODE}", inside=False) from None


def _check_size(size: int, max_bytes: int, what: str) -> None:
    if size > max_bytes:
        raise Unstorable(f"the {what} is larger than {max_bytes} bytes (SERVICE_MAX_RESULT_BYTES); "
                         f"store large data elsewhere and return a reference to it")


def _text_bytes(text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise _Refused(jsonvalues.NOT_UNICODE) from None


def _too_deep(what: str, limit: int) -> str:
    return f"the {what} is nested deeper than {limit} levels (SERVICE_MAX_RESULT_DEPTH)"
