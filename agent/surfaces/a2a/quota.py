"""Quota refusals (agent/services/admission.py) on the agent surface: HTTP 429, `Retry-After`, and the error
of each A2A wire.

- JSON-RPC 0.3: `{"code": -32029, "message": ..., "data": {"reason", "setting", "retry_after"}}`,
  as on /tasks;
- JSON-RPC 1.0: the same code and message, `data` the google.rpc details the 1.0 SDK writes
  (an ErrorInfo naming the setting, and a RetryInfo with the delay);
- HTTP+JSON (`/a2a`): google.rpc.Status, `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
  "message", "details"}}`.

A refusal met inside the SDK (a message whose tree is over the pending-task quota) cannot leave
it as itself: the request context builder (message_tree.py) notes it on our CallContext, and the answer the
SDK made of it is replaced here (`instead_of_sdk`, `instead_of_rest`).
"""

from __future__ import annotations

from typing import Any, cast

from a2a.utils.error_handlers import A2A_DOMAIN, ERROR_INFO_TYPE
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from taskgrove.agent.surfaces.a2a.envelope import WIRE_1_0, calls_of
from taskgrove.agent.foundations.errors import QuotaExceeded
from taskgrove.agent.foundations.calls import CallContext

RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"
REASON = "QUOTA_EXCEEDED"


def details(exc: QuotaExceeded) -> list[dict[str, Any]]:
    """google.rpc details of a refusal: what refused it (ErrorInfo; metadata values are strings)
    and when to try again (RetryInfo)."""
    metadata = {"reason": exc.reason, "setting": exc.setting, "retry_after": str(exc.retry_after)}
    return [{"@type": ERROR_INFO_TYPE, "reason": REASON, "domain": A2A_DOMAIN, "metadata": metadata},
            {"@type": RETRY_INFO_TYPE, "retryDelay": f"{exc.retry_after}s"}]


def error_answer(wire: str, id_: Any, exc: QuotaExceeded) -> dict[str, Any]:
    data = details(exc) if wire == WIRE_1_0 else exc.data
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": exc.code, "message": exc.message, "data": data}}


def refuse_all(body: bytes, exc: QuotaExceeded, request: Request) -> JSONResponse:
    """Every call of a POST `/` body refused (the request rate): 429, each call in its wire's form."""
    calls, batch = calls_of(body, request.headers)
    answers = [error_answer(wire, id_, exc) for wire, id_, _ in calls]
    return JSONResponse(answers if batch else answers[0], status_code=429, headers=exc.headers)


def rest_refusal(exc: QuotaExceeded) -> JSONResponse:
    """A refusal on the HTTP+JSON routes: google.rpc.Status with RESOURCE_EXHAUSTED."""
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": exc.message, "details": details(exc)}}
    return JSONResponse(body, status_code=429, headers=exc.headers)


def _taken(ctx: CallContext) -> QuotaExceeded | None:
    """The refusal noted during the SDK call, cleared (a later member of a batch is its own call)."""
    refusal, ctx.refusal = ctx.refusal, None
    return refusal


async def instead_of_sdk(ctx: CallContext, response: Response, wire: str, id_: Any, method: str) -> Response:
    """The SDK's JSON-RPC answer, or the quota's 429 when the call was refused inside the SDK."""
    if method in LAZY_STREAMS:
        await _first_event(response)
    refusal = _taken(ctx)
    if refusal is None:
        return response
    close = getattr(getattr(response, "body_iterator", None), "aclose", None)
    if close is not None:  # the SDK's stream, already holding the refusal as an event
        await close()
    return JSONResponse(error_answer(wire, id_, refusal), status_code=429, headers=refusal.headers)


# Streaming sends whose SDK stream builds the task only when its first event is asked for (the 0.3
# adapter; the 1.0 dispatcher fetches the first event itself before answering).
LAZY_STREAMS = frozenset({"message/stream"})


async def _first_event(response: Response) -> None:
    """Produce a stream's first event now, before the answer starts: a refusal is an answer of its
    own (429), not an event of a stream already sent with 200. The event is sent first, as before."""
    iterator = getattr(response, "body_iterator", None)
    if iterator is None:
        return
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        return

    async def replay() -> Any:
        yield first
        async for item in iterator:
            yield item

    cast(StreamingResponse, response).body_iterator = replay()


def instead_of_rest(ctx: CallContext, response: Response) -> Response:
    """The SDK's HTTP+JSON answer, or the quota's 429 when the call was refused inside the SDK."""
    refusal = _taken(ctx)
    return response if refusal is None else rest_refusal(refusal)
