"""What a GraphQL request must look like before strawberry sees it, in our words.

Why: strawberry answers a malformed request with plain-text 400s or, for a body like `1`, an
exception (HTTP 500), and parses JSON with Python's json (NaN accepted, recursion on depth). Here
the body is parsed by storage.jsonvalues like every other surface, and the request's shape and
values are checked, so every refusal is a GraphQL-shaped JSON error carrying our JSON-RPC code:
-32700 when the text is not JSON, -32600 for a wrong shape, -32602 for a value the gate refuses.
The same checks serve WebSocket `subscribe` payloads (`payload_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskgrove.agent.foundations.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RpcError
from taskgrove.storage import jsonvalues


def refused(code: int, detail: str) -> RpcError:
    return RpcError(code, detail, detail)


def payload_problem(payload: Any, max_depth: int) -> RpcError | None:
    """The problem of one GraphQL request object (`query`, `variables`, `operationName`,
    `extensions`), or None."""
    if isinstance(payload, list):
        return refused(INVALID_REQUEST, "Batched GraphQL requests are not supported: send one JSON object "
                                        "with a query")
    if not isinstance(payload, Mapping):
        return refused(INVALID_REQUEST, "A GraphQL request must be a JSON object with a 'query' string")
    query = payload.get("query")
    if not isinstance(query, str) or not query.strip():
        return refused(INVALID_REQUEST, "'query' must be a non-empty string holding a GraphQL document")
    for name, kinds, wanted in (("variables", (Mapping,), "an object"), ("extensions", (Mapping,), "an object"),
                                ("operationName", (str,), "a string")):
        value = payload.get(name)
        if value is not None and not isinstance(value, kinds):
            return refused(INVALID_REQUEST, f"'{name}' must be {wanted} or null")
    found = jsonvalues.problem(dict(payload), "request")
    if found is not None:
        return refused(INVALID_PARAMS, found.removeprefix("request."))
    if jsonvalues.too_deep(query.encode("utf-8"), max_depth):
        return refused(INVALID_REQUEST, f"The query nests brackets deeper than {max_depth} levels "
                                        "(the limit is SERVICE_MAX_JSON_DEPTH)")
    return None


def parse_body(body: bytes, max_depth: int) -> Any:
    """The request object of a POST body; RpcError when the body is refused."""
    return _checked(_load(body, max_depth, "body"), max_depth)


def parse_query_params(params: Mapping[str, str], max_depth: int) -> dict[str, Any]:
    """The request object of a GET (`?query=...&variables=<JSON>&operationName=...`)."""
    payload: dict[str, Any] = {"query": params.get("query"), "operationName": params.get("operationName")}
    for name in ("variables", "extensions"):
        if params.get(name):
            payload[name] = _load(params[name], max_depth, f"'{name}'")
    return _checked(payload, max_depth)


def _load(text: str | bytes, max_depth: int, what: str) -> Any:
    try:
        return jsonvalues.loads(text, max_depth, what=what).value
    except jsonvalues.JsonTextError as exc:
        raise refused(PARSE_ERROR, str(exc)) from None


def _checked(payload: Any, max_depth: int) -> Any:
    problem = payload_problem(payload, max_depth)
    if problem is not None:
        raise problem
    return payload
