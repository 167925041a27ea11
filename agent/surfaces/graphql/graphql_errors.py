"""GraphQL errors carrying our JSON-RPC codes, so both surfaces fail the same way.

Every resolver reaches the service through `service_call`, which turns an `RpcError` into a
`GraphQLError` whose message is the detail (`RpcError.data`, e.g. "Task 'x' not found") and whose
`extensions` hold `code` (the JSON-RPC code) and `codeName`. `classify_errors` gives the errors
graphql-core makes itself (syntax, validation, variable coercion) the code -32600 and masks
anything unexpected as -32603, after logging it with its traceback: a traceback never reaches a
client. The database going away (agent/foundations/errors.py `database_unavailable`) is asked
first, everywhere: it is -32050 DATABASE_UNAVAILABLE with `reason` and `retryAfter`, no
traceback, and an operation that did nothing else is answered HTTP 503 with Retry-After.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from graphql import GraphQLError
from starlette.responses import JSONResponse

from taskgrove.agent.foundations.errors import (
    DATABASE_UNAVAILABLE,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PERMISSION_DENIED,
    QUOTA_EXCEEDED,
    SERVER_ERROR,
    DatabaseUnavailable,
    QuotaExceeded,
    RpcError,
    database_unavailable,
)

log = logging.getLogger(__name__)

CODE_NAMES = {
    PARSE_ERROR: "PARSE_ERROR",
    INVALID_REQUEST: "INVALID_REQUEST",
    METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    INVALID_PARAMS: "INVALID_PARAMS",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    SERVER_ERROR: "SERVER_ERROR",
    PERMISSION_DENIED: "PERMISSION_DENIED",
    QUOTA_EXCEEDED: "QUOTA_EXCEEDED",
    DATABASE_UNAVAILABLE: "DATABASE_UNAVAILABLE",
}
INTERNAL_MESSAGE = "Internal error: the operation failed on the server; see the service log"

T = TypeVar("T")


def extensions(code: int) -> dict[str, Any]:
    return {"code": code, "codeName": CODE_NAMES.get(code, "ERROR")}


def from_rpc(exc: RpcError) -> GraphQLError:
    detail = exc.data if isinstance(exc.data, str) and exc.data else exc.message
    found = extensions(exc.code)
    if isinstance(exc, QuotaExceeded):  # what to wait for, and how long (also the HTTP Retry-After)
        found.update(setting=exc.setting, retryAfter=exc.retry_after)
    elif isinstance(exc, DatabaseUnavailable):  # why, and how long to wait (also the HTTP Retry-After)
        detail = exc.message
        found.update(reason=exc.reason, retryAfter=exc.retry_after)
    return GraphQLError(detail, extensions=found)


def refusal(result: Any) -> tuple[int, int] | None:
    """(HTTP status, Retry-After) of an execution result that did nothing because it was refused
    (every top-level field null): 429 when a quota refused it, else 503 when the database was
    unavailable; None for anything else."""
    if isinstance(result.data, dict) and any(value is not None for value in result.data.values()):
        return None
    for status, code in ((429, QUOTA_EXCEEDED), (503, DATABASE_UNAVAILABLE)):
        waits = [error.extensions["retryAfter"] for error in result.errors or ()
                 if isinstance(error.extensions, dict) and error.extensions.get("code") == code]
        if waits:
            return status, max(waits)
    return None


def internal() -> GraphQLError:
    return GraphQLError(INTERNAL_MESSAGE, extensions=extensions(INTERNAL_ERROR))


async def service_call(method: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await one service operation; failures come out as GraphQL errors with our codes."""
    try:
        return await method(*args)
    except RpcError as exc:
        raise from_rpc(exc) from None
    except GraphQLError:
        raise
    except Exception as exc:
        outage = database_unavailable(exc)
        if outage is not None:  # retryable, not a bug: no traceback (storage/outage.py logs it once)
            raise from_rpc(outage) from None
        log.exception("GraphQL operation %s failed", getattr(method, "__qualname__", method))
        raise internal() from None


def checked(build: Callable[..., T], *args: Any) -> T:
    """A typed request built from GraphQL arguments (agent/foundations/requests.py); an argument its rules
    refuse comes out as service_call's errors do."""
    try:
        return build(*args)
    except RpcError as exc:
        raise from_rpc(exc) from None


# The cost-limit extensions' messages, said in our words with the setting that sets the limit.
_COST_LIMITS = (
    (re.compile(r"^'.*' exceeds maximum operation depth of (\d+)$", re.S),
     "The query nests fields deeper than {0} levels (the limit is SERVICE_GRAPHQL_MAX_DEPTH); ask for fewer levels"),
    (re.compile(r"^(\d+) aliases found\. Allowed: (\d+)$"),
     "The query uses {0} aliases; at most {1} are allowed (SERVICE_GRAPHQL_MAX_ALIASES)"),
    (re.compile(r"^Syntax Error: Document contains more than (\d+) tokens"),
     "The query is longer than {0} tokens (the limit is SERVICE_GRAPHQL_MAX_TOKENS); shorten it"),
)


def _cost_message(message: str) -> str | None:
    for pattern, ours in _COST_LIMITS:
        match = pattern.match(message)
        if match:
            return ours.format(*match.groups())
    return None


def classify_errors(errors: Iterable[GraphQLError]) -> None:
    """Give every error a code (in place: called from Schema.process_errors, before the response
    is rendered). Errors of our own already have one."""
    for error in errors:
        if isinstance(error.extensions, dict) and "code" in error.extensions:
            continue
        original = error.original_error
        if original is None or isinstance(original, GraphQLError):
            ours = _cost_message(error.message)
            if ours is not None:
                error.message = ours
            error.extensions = {**(error.extensions or {}), **extensions(INVALID_REQUEST)}
            continue
        if type(original).__name__ == "InvalidOperationTypeError":  # e.g. a query over legacy graphql-ws
            error.message = ("This operation type is not allowed on this transport: queries and mutations "
                             "over HTTP or graphql-transport-ws, subscriptions over WebSocket")
            error.extensions = extensions(INVALID_REQUEST)
            continue
        outage = database_unavailable(original)
        if outage is not None:  # the database went away below a resolver without service_call
            original = outage
        if isinstance(original, RpcError):  # raised below a resolver without service_call
            converted = from_rpc(original)
            error.message, error.extensions = converted.message, converted.extensions
            continue
        log.error("GraphQL resolver failed", exc_info=(type(original), original, original.__traceback__))
        error.message = INTERNAL_MESSAGE
        error.extensions = extensions(INTERNAL_ERROR)


def error_response(exc: RpcError, status_code: int) -> JSONResponse:
    """A request refused before GraphQL execution, with a GraphQL-shaped body."""
    error = from_rpc(exc)
    body = {"data": None, "errors": [{"message": error.message, "extensions": error.extensions}]}
    return JSONResponse(body, status_code=status_code)  # our own messages: always encodable


def quota_response(exc: QuotaExceeded) -> JSONResponse:
    """HTTP 429 with Retry-After and a GraphQL-shaped body: over the request rate."""
    response = error_response(exc, 429)
    response.headers.update(exc.headers)
    return response


def outage_response(exc: DatabaseUnavailable) -> JSONResponse:
    """HTTP 503 with Retry-After and a GraphQL-shaped body: the database is unavailable."""
    response = error_response(exc, 503)
    response.headers.update(exc.headers)
    return response


def unauthorized_response(message: str) -> JSONResponse:
    """HTTP 401 with a GraphQL-shaped body: a missing or invalid token while JWT is on."""
    response = error_response(RpcError(PERMISSION_DENIED, "Permission denied", message), 401)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
