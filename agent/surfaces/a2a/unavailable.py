"""The database going away on the agent surface (issue 46): HTTP 503, `Retry-After`, and the
error of each A2A wire, as quota.py does for a quota's 429.

- JSON-RPC 0.3 on POST `/`: `{"code": -32050, "message": ..., "data": {"reason", "retry_after"}}`,
  as on /tasks;
- JSON-RPC 1.0: the same code and message, `data` the google.rpc details the 1.0 SDK writes (an
  ErrorInfo `DATABASE_UNAVAILABLE` with the reason, and a RetryInfo with the delay);
- HTTP+JSON (`/a2a`): google.rpc.Status, `{"error": {"code": 503, "status": "UNAVAILABLE",
  "message", "details"}}`;
- gRPC: `UNAVAILABLE` with the same details (grpc_server.py).

The SDK answers any exception of ours as its own internal error (-32603, logged with a
traceback), so the driver's error never reaches us as itself. Each A2A call therefore runs inside
storage/outage.py `watching()`: when the SDK's answer is its internal error and the call met an
outage meanwhile, the outage is answered instead (`instead_of_sdk`, `instead_of_rest`). The SDK's
tracebacks of an outage are kept out of the log (`quiet_sdk_logs`): storage/outage.py logs the
outage once.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from a2a.utils.error_handlers import A2A_DOMAIN, ERROR_INFO_TYPE
from starlette.responses import JSONResponse, Response

from taskgrove.agent.surfaces.a2a.envelope import WIRE_1_0
from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE, INTERNAL_ERROR, DatabaseUnavailable
from taskgrove.storage.outage import DatabaseOutage, recognise

RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"
REASON = "DATABASE_UNAVAILABLE"


def met(outages: list[DatabaseOutage]) -> DatabaseUnavailable | None:
    """The refusal to answer for the outages a call met (the last one: the database's latest word)."""
    return DatabaseUnavailable(outages[-1]) if outages else None


def details(exc: DatabaseUnavailable) -> list[dict[str, Any]]:
    """google.rpc details: why (ErrorInfo; metadata values are strings) and when to try again."""
    metadata = {"reason": exc.reason, "retry_after": str(exc.retry_after)}
    return [{"@type": ERROR_INFO_TYPE, "reason": REASON, "domain": A2A_DOMAIN, "metadata": metadata},
            {"@type": RETRY_INFO_TYPE, "retryDelay": f"{exc.retry_after}s"}]


def error_answer(wire: str, id_: Any, exc: DatabaseUnavailable) -> dict[str, Any]:
    data = details(exc) if wire == WIRE_1_0 else exc.data
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": exc.code, "message": exc.message, "data": data}}


def json_rpc_refusal(wire: str, id_: Any, exc: DatabaseUnavailable) -> JSONResponse:
    return JSONResponse(error_answer(wire, id_, exc), status_code=503, headers=exc.headers)


def rest_refusal(exc: DatabaseUnavailable) -> JSONResponse:
    """The refusal on the HTTP+JSON routes: google.rpc.Status with UNAVAILABLE."""
    body = {"error": {"code": 503, "status": "UNAVAILABLE", "message": exc.message, "details": details(exc)}}
    return JSONResponse(body, status_code=503, headers=exc.headers)


def _error_code(response: Response) -> int | None:
    """The JSON-RPC error code of a one-object JSON answer, or None."""
    if not isinstance(response, JSONResponse):
        return None
    try:
        answer = json.loads(bytes(response.body))
    except ValueError:
        return None
    error = answer.get("error") if isinstance(answer, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def instead_of_sdk(outages: list[DatabaseOutage], response: Response, wire: str, id_: Any) -> Response:
    """The SDK's JSON-RPC answer, or the outage's 503 when the SDK answered its internal error
    (or ours) for a call that met the database going away."""
    code = _error_code(response)
    refusal = met(outages)
    if code == DATABASE_UNAVAILABLE and refusal is None:  # answered by us already (relay.py)
        return response
    if refusal is None or code not in (INTERNAL_ERROR, DATABASE_UNAVAILABLE):
        return response
    return json_rpc_refusal(wire, id_, refusal)


def instead_of_rest(outages: list[DatabaseOutage], response: Response) -> Response:
    """The SDK's HTTP+JSON answer, or the outage's 503 when the SDK answered a 500 for a call
    that met the database going away."""
    refusal = met(outages)
    if refusal is None or response.status_code != 500:
        return response
    return rest_refusal(refusal)


def relayed(wire: str, id_: Any, exc: BaseException) -> dict[str, Any] | None:
    """The answer to an exception that escaped the SDK when it is the database going away."""
    outage = recognise(exc)
    return None if outage is None else error_answer(wire, id_, DatabaseUnavailable(outage))


class _OutageTracebacks(logging.Filter):
    """Drops the SDK's tracebacks of an outage (its 'Unhandled exception' and the like)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or recognise(exc) is None


_QUIET = _OutageTracebacks()


def quiet_sdk_logs() -> None:
    """Put the filter on every a2a-sdk logger loaded so far (a logger's filters see only its own
    records, not its children's, so each one gets it)."""
    for name in list(logging.root.manager.loggerDict):
        if name == "a2a" or name.startswith("a2a."):
            logger = logging.getLogger(name)
            if _QUIET not in logger.filters:
                logger.addFilter(_QUIET)
