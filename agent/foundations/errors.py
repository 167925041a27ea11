"""JSON-RPC error codes (SPEC.md, Errors) and the one exception every surface turns into an error."""

from __future__ import annotations

from typing import Any

from taskgrove.storage.outage import MESSAGES, DatabaseOutage, recognise

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000
PERMISSION_DENIED = -32001
# Over a per-user quota (agent/services/admission.py): answered with HTTP 429 and Retry-After.
QUOTA_EXCEEDED = -32029
# The database is unreachable, full or read-only (storage/outage.py): HTTP 503 and Retry-After.
DATABASE_UNAVAILABLE = -32050


class RpcError(Exception):
    """Raised anywhere below a surface; the surface renders code, message and data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(detail: str) -> RpcError:
    return RpcError(INVALID_PARAMS, detail, detail)


def task_not_found(task_id: str) -> RpcError:
    return invalid_params(f"Task '{task_id}' not found")


def permission_denied(detail: str = "Permission denied") -> RpcError:
    return RpcError(PERMISSION_DENIED, "Permission denied", detail)


class QuotaExceeded(RpcError):
    """A per-user quota refused the request before anything was stored (agent/services/admission.py).

    Every surface answers it in its own protocol with HTTP 429 and `Retry-After: retry_after`
    (whole seconds, at least 1); `data` carries the same for clients that read only the body."""

    def __init__(self, reason: str, setting: str, retry_after: int, message: str) -> None:
        super().__init__(QUOTA_EXCEEDED, message, {"reason": reason, "setting": setting, "retry_after": retry_after})
        self.reason = reason
        self.setting = setting
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class DatabaseUnavailable(RpcError):
    """The database could not serve the call: unreachable, full or read-only (storage/outage.py
    recognises it from the drivers' errors). Retryable: every surface answers it in its own
    protocol with HTTP 503 and `Retry-After`; `data` says `reason` (unavailable, full, read_only)
    and `retry_after`. A write refused so was not stored, or (a connection lost at its commit)
    stored whole: resending it with the same ids or Idempotency-Key stores it once."""

    def __init__(self, outage: DatabaseOutage) -> None:
        message = f"{MESSAGES[outage.reason]}; retry after {outage.retry_after} s"
        super().__init__(DATABASE_UNAVAILABLE, message,
                         {"reason": outage.reason, "retry_after": outage.retry_after})
        self.reason = outage.reason
        self.retry_after = outage.retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def database_unavailable(exc: BaseException) -> DatabaseUnavailable | None:
    """The one question every surface asks of an unexpected exception before it answers -32603:
    is it the database going away? (storage/outage.py reads the drivers' words.)"""
    if isinstance(exc, DatabaseUnavailable):
        return exc
    outage = recognise(exc)
    return DatabaseUnavailable(outage) if outage is not None else None


def quota_retry_after(answer: Any) -> int | None:
    """The Retry-After of a JSON-RPC answer made only of quota refusals (one, or a batch whose
    every answer is one); None for anything else. A batch in which some call was carried out is
    not refused as a whole: its refused calls say so in their own errors."""
    return refusal_retry_after(answer, QUOTA_EXCEEDED)


def outage_retry_after(answer: Any) -> int | None:
    """As quota_retry_after, for an answer made only of DatabaseUnavailable errors (HTTP 503)."""
    return refusal_retry_after(answer, DATABASE_UNAVAILABLE)


def refusal_retry_after(answer: Any, code: int) -> int | None:
    """The largest Retry-After of an answer whose every error has `code`; None otherwise."""
    answers = answer if isinstance(answer, list) else [answer]
    waits = []
    for one in answers:
        error = one.get("error") if isinstance(one, dict) else None
        if not isinstance(error, dict) or error.get("code") != code:
            return None
        wait = _retry_after_in(error.get("data"))
        waits.append(wait if isinstance(wait, int) and not isinstance(wait, bool) and wait >= 1 else 1)
    return max(waits) if waits else None


def _retry_after_in(data: Any) -> Any:
    """`retry_after` of our error data, or the delay of a google.rpc RetryInfo among details (A2A 1.0)."""
    if isinstance(data, dict):
        return data.get("retry_after")
    for detail in data if isinstance(data, list) else ():
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and delay.endswith("s") and delay[:-1].isdigit():
            return int(delay[:-1])
    return None
