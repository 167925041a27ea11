"""The JSON-RPC 2.0 envelope shared by `/`, `/tasks` and `/system`.

Parses the body, validates the envelope, calls the method's handler and renders the result or
the error. A handler raises `RpcError` for expected failures; anything else is logged with its
traceback and answered -32603 without one. A handler may return a `StreamReply` to answer a
single request with Server-Sent Events instead.

JSON-RPC 2.0 to the letter (issue 18): the body is parsed by storage.jsonvalues (depth limit,
NaN/Infinity refused, in our words); `id` must be a string, a finite number or null, else -32600
with `id: null`; a request without `id` is a notification: executed, never answered (HTTP 204
when nothing is left to answer); a batch holds at most SERVICE_MAX_BATCH calls; replies are
encoded so that they never fail (JsonReply).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from taskgrove.agent.foundations.calls import CallContext, Handler, Limits, StreamReply
from taskgrove.agent.foundations.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
    database_unavailable,
    outage_retry_after,
    quota_retry_after,
)
from taskgrove.storage import jsonvalues

log = logging.getLogger(__name__)


def _error(code: int, message: str, data: Any = None, id_: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": RpcError(code, message, data).to_dict()}


class JsonReply(Response):
    """A JSON response encoded by storage.jsonvalues.dumps_bytes: never fails on depth (a tree
    read of a long chain), never sends NaN or invalid Unicode (it would not be JSON)."""

    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> None:
        # An answer that is nothing but quota refusals is the HTTP 429 of the quota (docs/sharing.md,
        # "Quotas and 429"): one check here for every JSON-RPC surface. A single answer without an
        # error (most of them) is none: it needs no look.
        retry_after = quota_retry_after(content) \
            if status_code == 200 and (type(content) is not dict or "error" in content) else None
        if retry_after is not None:
            status_code, headers = 429, {**(headers or {}), "Retry-After": str(retry_after)}
        elif status_code == 200 and (type(content) is not dict or "error" in content):
            # Nothing but "the database is unavailable" (DatabaseUnavailable): HTTP 503, so that
            # proxies and clients that read only the status wait and retry too.
            retry_after = outage_retry_after(content)
            if retry_after is not None:
                status_code, headers = 503, {**(headers or {}), "Retry-After": str(retry_after)}
        super().__init__(content, status_code, headers)

    def render(self, content: Any) -> bytes:
        return jsonvalues.dumps_bytes(content)


def parse_body(body: bytes, max_depth: int = jsonvalues.DEFAULT_MAX_DEPTH) -> jsonvalues.Parsed:
    """The decoded body; RpcError -32700 (in our words) when the text itself is not JSON."""
    try:
        return jsonvalues.loads(body, max_depth)
    except jsonvalues.JsonTextError as exc:
        raise RpcError(PARSE_ERROR, "Parse error", str(exc)) from None


def valid_id(value: Any) -> bool:
    """JSON-RPC 2.0: a string, a number or null; we add finite (NaN and 1e400 are no JSON) and
    valid Unicode (an id is echoed back, so it must be sendable)."""
    if value is None or type(value) is int:  # most ids, at once (a bool's type is bool)
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        return jsonvalues.is_valid_text(value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int)


def reply_id(message: Any) -> Any:
    """The id to answer `message` with: its own when valid, else null."""
    id_ = message.get("id") if isinstance(message, dict) else None
    return id_ if valid_id(id_) else None


def _envelope_problem(message: dict[str, Any], suspect: bool) -> tuple[int, str] | None:
    """(code, detail) when the envelope of one request is unusable."""
    if message.get("jsonrpc") != "2.0":
        return INVALID_REQUEST, 'jsonrpc must be exactly "2.0"'
    method = message.get("method")
    if not isinstance(method, str) or not method:
        return INVALID_REQUEST, "method must be a non-empty string"
    if not jsonvalues.is_valid_text(method):
        return INVALID_REQUEST, f"method {jsonvalues.NOT_UNICODE}"
    params = message.get("params", {})
    if params is not None and not isinstance(params, (dict, list)):
        return INVALID_REQUEST, "params must be an object or an array"
    if suspect:  # only documents that may hold NaN/1e400/lone surrogates are walked
        found = jsonvalues.problem(params, "params")
        if found is not None:
            return INVALID_PARAMS, found
        others = {k: v for k, v in message.items() if k not in ("params", "id", "method", "jsonrpc")}
        found = jsonvalues.problem(others, "request")
        if found is not None:
            return INVALID_REQUEST, found
    return None


async def call_one(message: Any, methods: Mapping[str, Handler], ctx: CallContext, suspect: bool = True) -> Any:
    """Answer one request object: a response dict, an (id, StreamReply) pair, or None when there
    is nothing to answer (a notification: a valid request without an `id` member). The call is
    timed for `ctx.observe`, its method named only if `methods` holds it (else `other`)."""
    observe = ctx.observe
    if observe is None:
        return await _answer(message, methods, ctx, suspect)
    began = time.perf_counter()
    answer = await _answer(message, methods, ctx, suspect)
    method = message.get("method") if type(message) is dict else None
    label = method if type(method) is str and method in methods else "other"
    observe(label, "error" if type(answer) is dict and "error" in answer else "ok", time.perf_counter() - began)
    return answer


async def _answer(message: Any, methods: Mapping[str, Handler], ctx: CallContext, suspect: bool) -> Any:
    if not isinstance(message, dict):
        return _error(INVALID_REQUEST, "Invalid Request", "request must be a JSON object")
    id_ = message.get("id")
    if not valid_id(id_):
        return _error(INVALID_REQUEST, "Invalid Request", "id must be a string, a finite number or null")
    notification = "id" not in message
    refused = _envelope_problem(message, suspect)
    if refused is not None:  # an invalid request is answered even without an id (JSON-RPC 2.0, 5)
        code, detail = refused
        if code == INVALID_PARAMS:
            return None if notification else _error(code, detail, detail, id_)
        return _error(code, "Invalid Request", detail, id_)
    method = message["method"]
    handler = methods.get(method)
    if handler is None:
        shown = method if len(method) <= 200 else method[:197] + "..."
        return None if notification else _error(METHOD_NOT_FOUND, "Method not found",
                                                 f"Method '{shown}' not found", id_)
    params = message.get("params", {})
    if params is None:
        params = {}
    try:
        if getattr(handler, "wants_message", False):  # such a handler takes the whole message too
            result = await handler(params, ctx, message)  # type: ignore[call-arg]
        else:
            result = await handler(params, ctx)
    except RpcError as exc:
        return None if notification else {"jsonrpc": "2.0", "id": id_, "error": exc.to_dict()}
    except Exception as exc:  # the traceback goes to the log, never to the client
        outage = database_unavailable(exc)
        if outage is not None:  # retryable, not a bug: no traceback (storage/outage.py logs the outage once)
            return None if notification else {"jsonrpc": "2.0", "id": id_, "error": outage.to_dict()}
        log.exception("method %s failed", method)
        return None if notification else \
            _error(INTERNAL_ERROR, "Internal error", f"{method} failed on the server; see the service log", id_)
    if isinstance(result, StreamReply):
        if notification:
            if result.close is not None:
                result.close()
            return None
        return id_, result
    if notification:
        return None
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def batch_too_long(limits: Limits, count: int) -> str:
    """The -32600 detail for a batch over SERVICE_MAX_BATCH (every JSON-RPC surface says it so)."""
    return f"a batch may hold at most {limits.max_batch} calls, this one has {count}; split it " \
           "(the limit is SERVICE_MAX_BATCH)"


async def dispatch(body: bytes, methods: Mapping[str, Handler], ctx: CallContext) -> Response:
    """One HTTP request: a single call, or a batch answered as an array; HTTP 204 when only
    notifications were sent (nothing to answer)."""
    limits = ctx.limits
    try:
        parsed = parse_body(body, limits.max_json_depth)
    except RpcError as exc:
        return JsonReply({"jsonrpc": "2.0", "id": None, "error": exc.to_dict()})
    payload = parsed.value
    # ctx is this request's own (agent.surfaces.edge.call_context): no copy needed
    ctx.values_checked = not parsed.suspect and limits.max_json_depth <= jsonvalues.STORED_MAX_DEPTH
    if isinstance(payload, list):
        if not payload:
            return JsonReply(_error(INVALID_REQUEST, "Invalid Request", "empty batch"))
        if len(payload) > limits.max_batch:
            return JsonReply(_error(INVALID_REQUEST, "Invalid Request", batch_too_long(limits, len(payload))))
        answers = []
        for message in payload:
            answer = await call_one(message, methods, ctx, parsed.suspect)
            if isinstance(answer, tuple):  # no streaming inside a batch: answer the first result
                id_, reply = answer
                if reply.close is not None:
                    reply.close()
                answer = {"jsonrpc": "2.0", "id": id_, "result": reply.first}
            if answer is not None:
                answers.append(answer)
        return JsonReply(answers) if answers else Response(status_code=204)
    answer = await call_one(payload, methods, ctx, parsed.suspect)
    if isinstance(answer, tuple):
        id_, reply = answer
        return sse_response({"jsonrpc": "2.0", "id": id_, "result": reply.first}, reply.events)
    return JsonReply(answer) if answer is not None else Response(status_code=204)


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
    return b"data: " + jsonvalues.dumps_bytes(data) + b"\n\n"
