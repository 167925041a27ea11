"""JSON-RPC rules of POST `/` before the SDK sees a request, and errors in each wire's own form.

The SDK's JSON-RPC app trusts its input more than a public endpoint may: it answers `"id": 1.5`
with `id: null`, lets `1e400` reach protobuf (an internal error), and puts pydantic or protobuf
text into error data. So every request on `/` is parsed and its envelope checked here first:

- the body must be JSON (NaN, Infinity and lone surrogates are not): -32700, in the words of
  storage.jsonvalues (the one gate for JSON values, shared with `/tasks`);
- `id` must be a string, a finite number or null, else -32600 with `id: null`;
- no value anywhere may be a non-finite number (`1e400`): -32602 naming where it is.

Errors are rendered by wire: an A2A 1.0 request (a PascalCase method such as `SendMessage`) gets
the 1.0 error object (`data` is a list of `google.rpc.ErrorInfo` details, as the SDK builds it),
a 0.3 request (`message/send`, ...) and everything else gets `{code, message, data}` with a string
`data`. Messages are ours; library text goes to the log only.
"""

from __future__ import annotations

import math
from typing import Any

from a2a.utils.error_handlers import build_error_details
from a2a.utils import errors as sdk_errors

from taskgrove.agent.foundations.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
)
from taskgrove.storage import jsonvalues

WIRE_1_0 = "1.0"
WIRE_0_3 = "0.3"

# Our codes -> the SDK's error classes, whose 1.0 rendering (ErrorInfo details) we reuse.
SDK_ERROR_CLASSES: dict[int, type[sdk_errors.A2AError]] = {
    cls_code: cls for cls, cls_code in sdk_errors.JSON_RPC_ERROR_CODE_MAP.items()
}


class EnvelopeError(RpcError):
    """A request that fails before any method runs; `id` is what the reply may echo."""

    def __init__(self, code: int, message: str, data: Any = None, id_: Any = None) -> None:
        super().__init__(code, message, data)
        self.id = id_


def wire_of(method: Any, headers: Any = None) -> str:
    """The A2A wire a request speaks: 1.0 for PascalCase methods or an `A2A-Version: 1.x` header."""
    if isinstance(method, str) and method[:1].isupper():
        return WIRE_1_0
    if isinstance(method, str) and "/" in method:
        return WIRE_0_3
    version = headers.get("a2a-version", "") if headers is not None else ""
    return WIRE_1_0 if str(version).strip().startswith("1") else WIRE_0_3


def valid_id(value: Any) -> bool:
    """JSON-RPC 2.0: a string, a number or null; JSON has no infinite numbers, so neither do we."""
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def parse(body: bytes) -> jsonvalues.Parsed:
    """The JSON body, or EnvelopeError -32700 when the text is not JSON: parsed by
    storage.jsonvalues.loads, so `/` words every such mistake as `/tasks` does.

    The depth limit of the request (SERVICE_MAX_JSON_DEPTH) was applied to the body by
    agent.surfaces.bodylimit before any surface; here only the gate's ceiling applies (see jsonvalues).
    """
    try:
        return jsonvalues.loads(body, jsonvalues.STORED_MAX_DEPTH)
    except jsonvalues.JsonTextError as exc:
        raise EnvelopeError(PARSE_ERROR, "Parse error", str(exc)) from None


def calls_of(body: bytes, headers: Any = None) -> tuple[list[tuple[str, Any, Any]], bool]:
    """Each call of a body as (wire, id to echo, method), and whether the body was a batch: what
    an answer refusing every call needs. An id is echoed only when valid; a body that cannot be
    read is one call with neither id nor method."""
    try:
        payload = parse(body).value
    except EnvelopeError:
        payload = None
    batch = isinstance(payload, list) and bool(payload)
    calls = []
    for call in payload if batch else [payload]:
        id_ = call.get("id") if isinstance(call, dict) else None
        method = call.get("method") if isinstance(call, dict) else None
        calls.append((wire_of(method, headers), id_ if valid_id(id_) else None, method))
    return calls, batch


# A request is at most this deep. An A2A data part becomes a protobuf Struct, which the SDK cannot
# build or render past 100 levels (an internal error deep inside it); the envelope and the message
# around a data part take about 8 of them.
MAX_DEPTH = 90


def check_request(message: Any, suspect: bool = True) -> None:
    """Envelope rules of one request object (also each member of a batch). `suspect`: the
    document may hold a number that overflowed (jsonvalues.Parsed.suspect); only then are the
    params walked."""
    if not isinstance(message, dict):
        raise EnvelopeError(INVALID_REQUEST, "Invalid Request", "a request must be a JSON object")
    id_ = message.get("id")
    if not valid_id(id_):
        raise EnvelopeError(INVALID_REQUEST, "Invalid Request", "id must be a string, a finite number or null")
    if message.get("jsonrpc") != "2.0":
        raise EnvelopeError(INVALID_REQUEST, "Invalid Request", 'jsonrpc must be exactly "2.0"', id_)
    method = message.get("method")
    if not isinstance(method, str) or not method:
        raise EnvelopeError(INVALID_REQUEST, "Invalid Request", "method must be a non-empty string", id_)
    params = message.get("params")
    if params is not None and not isinstance(params, (dict, list)):
        raise EnvelopeError(INVALID_REQUEST, "Invalid Request", "params must be an object or an array", id_)
    found = jsonvalues.problem(params, "params") if suspect else None
    if found is not None:
        raise EnvelopeError(INVALID_PARAMS, "Invalid params", found, id_)


def error_body(wire: str, id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """One JSON-RPC error response in the wire's form.

    Invalid params (and A2A's own codes) carry the detail as the message, as everywhere in the
    service; the generic JSON-RPC errors keep their standard message and put the detail in data.
    """
    if isinstance(data, str) and data and code not in (PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND):
        message = data
    if wire == WIRE_1_0:
        cls = SDK_ERROR_CLASSES.get(code)
        if cls is not None:  # the SDK's 1.0 form: data = google.rpc.ErrorInfo details
            detail = data if isinstance(data, str) and data else None
            text = f"{message}: {detail}" if detail and detail != message else message
            error_1_0 = {"code": code, "message": text, "data": build_error_details(cls(message=text))}
            return {"jsonrpc": "2.0", "id": id_, "error": error_1_0}
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def envelope_error_body(wire: str, exc: EnvelopeError) -> dict[str, Any]:
    return error_body(wire, exc.id, exc.code, exc.message, exc.data)


INTERNAL_MESSAGE = "The service failed to answer this request; the service log has the details"


def clean_error(error: dict[str, Any], wire: str) -> dict[str, Any]:
    """An SDK error object without library text: internal errors get our message, dumps go."""
    code = error.get("code")
    if code == INTERNAL_ERROR:
        return {"code": INTERNAL_ERROR, "message": INTERNAL_MESSAGE} if wire == WIRE_0_3 else \
            error_body(WIRE_1_0, None, INTERNAL_ERROR, INTERNAL_MESSAGE)["error"]
    data = error.get("data")
    if isinstance(data, str) and _looks_like_dump(data):
        error = {k: v for k, v in error.items() if k != "data"}
    elif isinstance(data, dict) and "parseError" in data:
        error = {k: v for k, v in error.items() if k != "data"}
    elif isinstance(data, list):
        error = dict(error, data=[_clean_detail(d) for d in data])
    return error


def _clean_detail(detail: Any) -> Any:
    if isinstance(detail, dict) and isinstance(detail.get("metadata"), dict) and "parseError" in detail["metadata"]:
        return dict(detail, metadata={})
    return detail


def _looks_like_dump(text: str) -> bool:
    markers = ("errors.pydantic.dev", "validation error", "Traceback", "Failed to parse", "object is not")
    return any(m in text for m in markers)
