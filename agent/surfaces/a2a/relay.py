"""One checked A2A request handed to the SDK's JSON-RPC app, and its answer brought to our rules.

The SDK endpoint reads the request body itself, so it gets a request of its own (same scope and
state, body given here): that is how a batch member reaches it, and how an id the SDK cannot echo
(`1.5`: it keeps only strings and integers), a null or missing one (the SDK's 0.3 models refuse
both), travels as a placeholder and is put back afterwards.

Every answer, plain JSON or each Server-Sent Event, passes `finish`: the original id, error objects
without library text (see envelope.clean_error), `"result": null` where the 0.3 adapter leaves the
member out (pushNotificationConfig/delete: JSON-RPC requires one of result or error), SPEC.md's
snake_case keys beside 0.3 task objects, and whole numbers as integers in every result (protobuf's
Struct made them doubles; JSON and ProtoJSON readers both take `3` for a number).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from taskgrove.agent.surfaces.a2a.envelope import INTERNAL_MESSAGE, clean_error, error_body, wire_of
from taskgrove.agent.surfaces.a2a.unavailable import relayed
from taskgrove.agent.surfaces.a2a.wire import restore_ints, spec_json
from taskgrove.agent.foundations.errors import INTERNAL_ERROR

log = logging.getLogger(__name__)
SdkEndpoint = Callable[[Request], Awaitable[Response]]
PLACEHOLDER_ID = "taskgrove-placeholder-id"
# 0.3 methods whose result is a task object: SPEC.md's `context_id` spelling is added to it.
TASK_RESULT_METHODS = frozenset({"message/send", "tasks/get", "tasks/cancel"})
NULL_RESULT_METHODS = frozenset({"tasks/pushNotificationConfig/delete", "DeleteTaskPushNotificationConfig"})


def sub_request(request: Request, body: bytes) -> Request:
    """A request sharing `request`'s scope (headers, state) whose body is `body`."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


class Relay:
    """Calls the SDK for one request object and rewrites what comes back."""

    def __init__(self, sdk_endpoint: SdkEndpoint) -> None:
        self._sdk = sdk_endpoint

    async def call(self, request: Request, message: dict[str, Any]) -> Response:
        method = message["method"]
        original_id = message.get("id")
        sent = dict(message)
        if original_id is None or isinstance(original_id, float):  # the SDK's models need an int or str
            sent["id"] = PLACEHOLDER_ID
        if sent.get("params") is None:  # `"params": null` means no params (the SDK would fail on it)
            sent["params"] = {}
        wire = wire_of(method, request.headers)
        try:
            response = await self._sdk(sub_request(request, json.dumps(sent).encode()))
        except Exception as exc:  # the SDK answers its own errors; anything else is ours to log
            outage = relayed(wire, original_id, exc)
            if outage is not None:  # the database going away: unavailable.py answers it 503
                return JSONResponse(outage)
            log.exception("A2A method %s failed", method)
            return JSONResponse(error_body(wire, original_id, INTERNAL_ERROR, INTERNAL_MESSAGE))

        def finish(answer: Any) -> Any:
            return _finish(answer, method, original_id, wire)

        if isinstance(response, JSONResponse):
            answer = finish(json.loads(bytes(response.body)))
            return JSONResponse(answer, status_code=response.status_code)
        iterator = getattr(response, "body_iterator", None)
        if iterator is not None:
            cast(StreamingResponse, response).body_iterator = _rewrite_events(iterator, finish)
        return response


async def as_json(response: Response, method: str, id_: Any, wire: str) -> dict[str, Any]:
    """An answer as one JSON object (a batch member): a stream contributes its first event only."""
    if isinstance(response, JSONResponse):
        return json.loads(bytes(response.body))
    iterator = getattr(response, "body_iterator", None)
    first: Any = None
    if iterator is not None:
        try:
            async for item in iterator:
                first = _event_data(item)
                if first is not None:
                    break
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()
    if isinstance(first, dict):
        return first
    log.error("A2A method %s answered a batch member with neither JSON nor an event", method)
    return error_body(wire, id_, INTERNAL_ERROR, INTERNAL_MESSAGE)


def _event_data(item: Any) -> Any:
    data = item.get("data") if isinstance(item, dict) else getattr(item, "data", None)
    if isinstance(data, str):
        try:
            return json.loads(data)
        except ValueError:
            return None
    return None


async def _rewrite_events(iterator: AsyncIterator[Any], finish: Callable[[Any], Any]) -> AsyncIterator[Any]:
    try:
        async for item in iterator:
            data = _event_data(item)
            if data is not None and isinstance(item, dict):
                item = dict(item, data=json.dumps(finish(data)))
            yield item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


def _finish(answer: Any, method: str, original_id: Any, wire: str) -> Any:
    if not isinstance(answer, dict):
        return answer
    answer = dict(answer)
    answer["id"] = original_id
    if isinstance(answer.get("error"), dict):
        answer["error"] = clean_error(answer["error"], wire)
        answer.pop("result", None)
        return answer
    if "result" not in answer and method in NULL_RESULT_METHODS:
        answer["result"] = None
    result = answer.get("result")
    if method in TASK_RESULT_METHODS and isinstance(result, dict) and result.get("kind") == "task":
        answer["result"] = spec_json(result)
    elif isinstance(result, dict):  # streamed events, 1.0 results: JSON numbers may be integers there too
        answer["result"] = restore_ints(result)
    return answer
