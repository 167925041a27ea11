"""What remote agents send a2a_agent_executor, made readable before the SDK's strict parsers see it.

Agents in the wild bend the A2A wire in small ways, and the official client refuses the whole
answer for any of them, losing the remote work: pydantic-ai's fasta2a stamps statuses without a
UTC offset (`2026-11-24T18:35:08.229795`), which protobuf's ProtoJSON parser (1.0 wire) rejects;
a newer agent may report a state or role this SDK does not know, which the 0.3 wire's pydantic
models reject. So every response of a remote agent passes this httpx transport, which rewrites
each JSON body and each Server-Sent Event's `data:` line with `normalize`:

- a `timestamp` without an offset is read as UTC (`...229795Z`);
- an unknown 0.3 task `state` becomes `unknown` and an unknown 0.3 `role` becomes `agent`
  (on the 1.0 wire protobuf already reads an unknown enum name as unspecified);
- everything else is left as it came: extra fields are ignored by the SDK's lenient parse.

Anything still malformed after that fails the task with a message naming what was wrong
(executors/a2a_remote.py), never with the parser's traceback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import httpx

from taskgrove.storage import jsonvalues

# The A2A 0.3 task states and roles (lowercase on that wire); 1.0 names are upper case.
STATES_0_3 = frozenset({"submitted", "working", "input-required", "completed", "canceled", "failed",
                        "rejected", "auth-required", "unknown"})
ROLES_0_3 = frozenset({"user", "agent"})
OPAQUE_KEYS = frozenset({"data", "metadata"})  # the agent's own content, never rewritten
MAX_JSON_BODY = 64 * 1024 * 1024  # a JSON answer larger than this is passed on untouched


def utc_timestamp(value: str) -> str:
    """An ISO 8601 timestamp with an offset: one without is read as UTC; one that is not a
    timestamp at all is returned as it is (the parser then names it)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    if parsed.tzinfo is not None:
        return value
    return parsed.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")


def normalize(value: Any) -> Any:
    """A remote agent's JSON with the tolerated deviations put right (see the module docstring).

    Only protocol objects are touched: the content of data parts and metadata (`data`,
    `metadata`) is the agent's own and passes as it is, even where it has a `state` key.
    A copy made by the JSON gate's walker (storage.jsonvalues.rebuild): no recursion, and
    jsonvalues.TooDeep past its STORED_MAX_DEPTH."""
    return jsonvalues.rebuild(value, _as_it_is, keep=OPAQUE_KEYS, where="the A2A agent's answer",
                              each_dict=_put_right)


def _as_it_is(item: Any, _key: str | None) -> Any:
    return item


def _put_right(out: dict[str, Any]) -> None:
    """One protocol object's tolerated deviations put right, in place (its members are copies)."""
    status = out.get("status")
    if isinstance(status, dict):
        if isinstance(status.get("timestamp"), str):
            status["timestamp"] = utc_timestamp(status["timestamp"])
        state = status.get("state")
        if isinstance(state, str) and state.islower() and state not in STATES_0_3:
            status["state"] = "unknown"
    role = out.get("role")
    if isinstance(role, str) and role.islower() and role not in ROLES_0_3 and "parts" in out:
        out["role"] = "agent"


def _rewrite_json(raw: bytes) -> bytes:
    """`raw` normalized; parsed by the JSON gate (storage.jsonvalues.loads). A text the gate
    refuses is passed on as it is (the SDK reports it), except one nested deeper than the gate's
    STORED_MAX_DEPTH: that raises the gate's JsonTextError, which fails the task with its words."""
    try:
        parsed = jsonvalues.loads(raw, jsonvalues.STORED_MAX_DEPTH, what="the A2A agent's answer")
    except jsonvalues.JsonTextError:
        if jsonvalues.too_deep(raw, jsonvalues.STORED_MAX_DEPTH):
            raise
        return raw  # not JSON (or not UTF-8): the SDK reports it as it is
    return json.dumps(normalize(parsed.value)).encode()


class _JsonBody(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in self._inner:
            chunks.append(chunk)
            size += len(chunk)
        body = b"".join(chunks)
        yield _rewrite_json(body) if size <= MAX_JSON_BODY else body

    async def aclose(self) -> None:
        await self._inner.aclose()


class _EventStream(httpx.AsyncByteStream):
    """Server-Sent Events, line by line: each `data:` line holding JSON is normalized."""

    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        async for chunk in self._inner:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                yield b"".join(_rewrite_line(line) + b"\n" for line in lines)
        if pending:
            yield _rewrite_line(pending)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _rewrite_line(line: bytes) -> bytes:
    if not line.startswith(b"data:"):
        return line
    body = line[len(b"data:"):]
    ending = b"\r" if body.endswith(b"\r") else b""
    payload = body.removesuffix(b"\r").removeprefix(b" ")
    return b"data: " + _rewrite_json(payload) + ending


class LenientTransport(httpx.AsyncBaseTransport):
    """Wraps the real transport; answers come back through `normalize`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # Plain bodies: a compressed one could not be rewritten on the way.
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        media_type = response.headers.get("content-type", "")
        if response.headers.get("content-encoding", "identity") != "identity":
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        if "event-stream" in media_type:
            stream: httpx.AsyncByteStream = _EventStream(response.stream)
        elif "json" in media_type:
            stream = _JsonBody(response.stream)
        else:
            return response
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        return httpx.Response(response.status_code, headers=headers, stream=stream,
                              extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()
