"""The JSON-RPC 2.0 envelope shared by `/`, `/tasks` and `/system`.

Parses the body, validates the envelope, calls the method's handler and renders the result or
the error. A handler raises `RpcError` for expected failures; anything else is logged with its
traceback and answered -32603 without one. A handler may return a `StreamReply` to answer a
single request with Server-Sent Events instead.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from agent.auth import ANONYMOUS, Caller
from agent.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
)

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class CallContext:
    """What a handler knows about the call besides its params."""

    caller: Caller = ANONYMOUS
    # "jsonrpc" on /tasks and /system, "a2a" on / (the protocol marker of results).
    surface: str = "jsonrpc"
    # From X-LLM-API-KEY: this request only; repr=False keeps it out of any logged repr.
    llm_api_key: str | None = field(default=None, repr=False)
    llm_provider: str | None = None
    request: Request | None = field(default=None, repr=False)


Handler = Callable[[Any, CallContext], Awaitable[Any]]


@dataclass
class StreamReply:
    """A result to send first, then further JSON events, as `text/event-stream`."""

    first: Any
    events: AsyncIterator[Any]
    # Releases what `events` holds when the stream is never sent (a streaming call in a batch).
    close: Callable[[], None] | None = None


def _error(code: int, message: str, data: Any = None, id_: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": RpcError(code, message, data).to_dict()}


def parse_body(body: bytes) -> Any:
    """The decoded body, or a ready error response object."""
    if len(body) > MAX_BODY_BYTES:
        raise RpcError(INVALID_REQUEST, "Invalid Request", f"request body larger than {MAX_BODY_BYTES} bytes")
    try:
        payload = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RpcError(PARSE_ERROR, "Parse error", f"body is not valid JSON: {exc}") from None
    # A lone surrogate escape (`"\ud800"`) parses, but can be neither stored nor sent back as UTF-8.
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(payload):
        raise RpcError(PARSE_ERROR, "Parse error", "body is not valid JSON: a string holds a lone surrogate escape")
    return payload


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259); stored, they would break every later response."""
    raise ValueError(f"{name} is not a valid JSON value")


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


async def call_one(message: Any, methods: Mapping[str, Handler], ctx: CallContext) -> Any:
    """Answer one request object: a response dict, a StreamReply pair, or None for a notification."""
    if not isinstance(message, dict):
        return _error(INVALID_REQUEST, "Invalid Request", "request must be a JSON object")
    id_ = message.get("id")
    if not _valid_id(id_):
        return _error(INVALID_REQUEST, "Invalid Request", "id must be a string, a number or null")
    if message.get("jsonrpc") != "2.0":
        return _error(INVALID_REQUEST, "Invalid Request", "jsonrpc must be exactly \"2.0\"", id_)
    method = message.get("method")
    if not isinstance(method, str) or not method:
        return _error(INVALID_REQUEST, "Invalid Request", "method must be a non-empty string", id_)
    handler = methods.get(method)
    if handler is None:
        return _error(METHOD_NOT_FOUND, "Method not found", f"Method '{method}' not found", id_)
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, (dict, list)):
        return _error(INVALID_REQUEST, "Invalid Request", "params must be an object or an array", id_)
    try:
        result = await handler(params, ctx, message) if getattr(handler, "wants_message", False) \
            else await handler(params, ctx)
    except RpcError as exc:
        return {"jsonrpc": "2.0", "id": id_, "error": exc.to_dict()}
    except Exception:  # the traceback goes to the log, never to the client
        log.exception("method %s failed", method)
        return _error(INTERNAL_ERROR, "Internal error", f"{method} failed on the server; see the service log", id_)
    if isinstance(result, StreamReply):
        return id_, result
    return {"jsonrpc": "2.0", "id": id_, "result": result}


async def dispatch(body: bytes, methods: Mapping[str, Handler], ctx: CallContext) -> Response:
    """One HTTP request: a single call, or a batch answered as an array."""
    try:
        payload = parse_body(body)
    except RpcError as exc:
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": exc.to_dict()})
    if isinstance(payload, list):
        if not payload:
            return JSONResponse(_error(INVALID_REQUEST, "Invalid Request", "empty batch"))
        answers = []
        for message in payload:
            answer = await call_one(message, methods, ctx)
            if isinstance(answer, tuple):  # no streaming inside a batch: answer the first result
                id_, reply = answer
                if reply.close is not None:
                    reply.close()
                answer = {"jsonrpc": "2.0", "id": id_, "result": reply.first}
            answers.append(answer)
        return JSONResponse(answers)
    answer = await call_one(payload, methods, ctx)
    if isinstance(answer, tuple):
        id_, reply = answer
        return sse_response({"jsonrpc": "2.0", "id": id_, "result": reply.first}, reply.events)
    return JSONResponse(answer)


def sse_response(first: Any, events: AsyncIterator[Any]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        yield _sse(first)
        try:
            async for event in events:
                yield _sse(event)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, default=str)}\n\n".encode()
