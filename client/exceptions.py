"""The exceptions a call can raise, and the one table that maps a service's answer to them.

Why a class per meaning rather than one error with a code: a caller writes `except NotFound:` or
`except QuotaExceeded as exc: exc.retry_after`, never a comparison with -32602 and a look at the
message. Every exception still carries what the service said (`code`, `message`, `data`, and the
HTTP status), so nothing is lost by the mapping.

The service words several different situations with the same JSON-RPC code (-32602 covers a
missing task, an id that exists already and a wait answered twice): `REFINEMENTS` tells them
apart by the service's own sentences, and `tests/test_client_errors.py` provokes each one on a
real service, so a reworded message fails a test instead of silently changing the class raised.
"""

from __future__ import annotations

import email.utils
import re
import time
from typing import Any

# JSON-RPC codes the service uses (SPEC.md, Errors; the quota's code is the service's own).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000
PERMISSION_DENIED = -32001
QUOTA_EXCEEDED = -32029
# The database could not serve the request; nothing was stored (HTTP 503 with Retry-After, issue 46).
DATABASE_UNAVAILABLE = -32050


class TaskgroveError(Exception):
    """Base of every error this client raises.

    `code` is the JSON-RPC error code (None when no JSON-RPC answer came at all), `message` and
    `data` what the service said (`data` is usually the human-readable detail), `http_status` the
    HTTP status of the answer (None without one)."""

    def __init__(self, message: str, *, code: int | None = None, data: Any = None,
                 http_status: int | None = None, method: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data
        self.http_status = http_status
        self.method = method

    @property
    def detail(self) -> str:
        """The most specific sentence the service gave: `data` when it is a sentence, else `message`."""
        if isinstance(self.data, str) and self.data:
            return self.data
        return self.message

    def __str__(self) -> str:
        said = self.message if self.detail == self.message else f"{self.message}: {self.detail}"
        return f"{self.method}: {said}" if self.method else said


class InvalidParams(TaskgroveError):
    """-32602: the service refused the request's parameters (validation, a bad tree, a blocked delete)."""


class NotFound(InvalidParams):
    """The task (or schedule) named does not exist. A subclass of InvalidParams because the service
    answers it with -32602 (SPEC.md), so `except InvalidParams` written for the code still holds."""


class Conflict(InvalidParams):
    """The request clashes with what is stored now: an id that already exists, a wait already
    answered or not waiting any more, a delete blocked by the tree's state, an Idempotency-Key
    used for another request. Sending the same request again will not change the answer."""


class PermissionDenied(TaskgroveError):
    """-32001, or HTTP 401: the token is missing or refused, or the caller may not touch this."""


class MethodNotFound(TaskgroveError):
    """-32601: the service does not know the method (an older service than this client)."""


class InvalidRequest(TaskgroveError):
    """-32600 / -32700: the service could not read the request as JSON-RPC."""


class ServerError(TaskgroveError):
    """-32603 / -32000: the service failed; its log has the cause. Not retried: it may be a bug."""


class QuotaExceeded(TaskgroveError):
    """-32029 with HTTP 429: a per-user quota refused the request before anything was stored.
    `retry_after` is the number of seconds the service asked the client to wait."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(TaskgroveError):
    """HTTP 503 (or 502, 504, 507): the service, or its database, cannot serve the request now,
    and nothing was stored. `retry_after` is the wait it asked for, if it said one."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unreachable(TaskgroveError):
    """No answer came: nothing listens at the URL, the connection dropped, or it timed out.
    `maybe_sent` is True when the request may have reached the service before the answer was
    lost (a write that is not safe to resend is then not resent; see docs/client.md)."""

    def __init__(self, message: str, *, maybe_sent: bool = False, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.maybe_sent = maybe_sent


class ProtocolError(TaskgroveError):
    """The answer was not JSON-RPC (another program listens at the URL, or a proxy answered)."""


# --- the mapping table: every decision about which class a failure becomes lives below ----------

# JSON-RPC code -> class (the -32602 refinements come after).
CODES: dict[int, type[TaskgroveError]] = {
    PARSE_ERROR: InvalidRequest,
    INVALID_REQUEST: InvalidRequest,
    METHOD_NOT_FOUND: MethodNotFound,
    INVALID_PARAMS: InvalidParams,
    INTERNAL_ERROR: ServerError,
    SERVER_ERROR: ServerError,
    PERMISSION_DENIED: PermissionDenied,
    QUOTA_EXCEEDED: QuotaExceeded,
    DATABASE_UNAVAILABLE: Unavailable,
}

# HTTP status -> class, for answers refused before (or instead of) a JSON-RPC error. 503 is the
# service's "database unavailable, nothing was stored" (issue 46), 507 its full disk; 502 and 504
# come from a proxy in front of it.
HTTP_STATUSES: dict[int, type[TaskgroveError]] = {
    401: PermissionDenied,
    403: PermissionDenied,
    429: QuotaExceeded,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
    507: Unavailable,
}

# -32602 sentences -> the narrower class. The service's own words (agent/foundations/errors.py
# task_not_found, agent/services/wait_service.py, task_service.py, idempotent.py, storage/trees.py,
# agent_service.py, trigger_service.py).
REFINEMENTS: tuple[tuple[re.Pattern[str], type[TaskgroveError]], ...] = (
    (re.compile(r"^Task '.*' not found$|schedule '.*' not found$|^task_id: task '.*' not found$|"
                r"^trigger_id: trigger '.*' not found$|^name: no agent '.*' in the directory$", re.S), NotFound),
    (re.compile(r"already exists|already answered|is not waiting for input|^Cannot delete task|"
                r"Idempotency-Key was already used|^name: an agent named '.*' is in the directory already",
                re.S), Conflict),
)

# The idempotency-key answers that mean "send it again": the first request with this key is still
# being carried out, or it failed and left the key free (agent/services/idempotent.py).
RESEND_LATER = re.compile(r"Idempotency-Key is still being carried out|first request with this "
                          r"Idempotency-Key failed", re.S)


def from_rpc_error(error: Any, *, http_status: int | None = None, retry_after: float | None = None,
                   method: str | None = None) -> TaskgroveError:
    """The exception for a JSON-RPC `error` object (and the HTTP answer that carried it)."""
    if not isinstance(error, dict):
        return ProtocolError(f"the service answered an error that is not a JSON-RPC error object: {error!r}"[:300],
                             http_status=http_status, method=method)
    code = error.get("code") if isinstance(error.get("code"), int) else None
    message = str(error.get("message") or "error")
    data = error.get("data")
    cls: type[TaskgroveError] = CODES.get(code, TaskgroveError) if code is not None else TaskgroveError
    if cls is TaskgroveError and http_status in HTTP_STATUSES:
        cls = HTTP_STATUSES[http_status]
    if http_status in (502, 503, 504, 507) and cls in (ServerError, TaskgroveError):
        cls = Unavailable  # whatever code the service gives its outage, the status says "retry"
    if cls is InvalidParams:
        said = data if isinstance(data, str) and data else message
        for pattern, narrower in REFINEMENTS:
            if pattern.search(said):
                cls = narrower
                break
    if cls in (QuotaExceeded, Unavailable):
        wait = retry_after if retry_after is not None else _retry_after_in(data)
        return cls(message, code=code, data=data, http_status=http_status, method=method,
                   retry_after=wait)
    return cls(message, code=code, data=data, http_status=http_status, method=method)


def from_http_status(status: int, text: str, *, retry_after: float | None = None,
                     method: str | None = None) -> TaskgroveError:
    """The exception for an HTTP answer without a JSON-RPC body (a proxy's 502, a bare 503)."""
    cls = HTTP_STATUSES.get(status, ProtocolError)
    message = (f"HTTP {status}: {text.strip()[:200]}" if text.strip() else f"HTTP {status}")
    if cls is ProtocolError:
        message = f"the service answered HTTP {status} without JSON-RPC: is this a taskgrove service?"
    if cls in (QuotaExceeded, Unavailable):
        return cls(message, http_status=status, method=method, retry_after=retry_after)
    return cls(message, http_status=status, method=method)


def resend_later(error: TaskgroveError) -> bool:
    """True for the service's "this Idempotency-Key's first request is not done / failed: send it again"."""
    return isinstance(error, InvalidParams) and bool(RESEND_LATER.search(error.detail))


def parse_retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: delta-seconds or an HTTP date (RFC 9110); None when absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _retry_after_in(data: Any) -> float | None:
    """`retry_after` of the service's error data (its quota and outage errors carry it there too)."""
    if isinstance(data, dict):
        wait = data.get("retry_after")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait >= 0:
            return float(wait)
    return None
