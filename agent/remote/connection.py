"""What every remote command (and `taskgrove mcp`) shares: --url/--token (or TASKGROVE_URL,
TASKGROVE_TOKEN), the project's one HTTP client (taskgrove.client.AsyncClient) built from them,
and the one line a person reads when a call fails.

Failures a person can act on (nothing listening, a refused token, a refused call) become
RemoteError with a message and an exit status, so the command line prints one line, never a
traceback: 1 a refused call, 2 an unreachable service or bad input, 3 a missing or refused token.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.client import AsyncClient, TaskgroveError

DEFAULT_URL = "http://127.0.0.1:8000"


class RemoteError(Exception):
    """A failure reported to the person as one line; `status` is the process's exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """--url and --token, defaulting to TASKGROVE_URL and TASKGROVE_TOKEN (one place for every client)."""
    parser.add_argument("--url", default=os.environ.get("TASKGROVE_URL", DEFAULT_URL),
                        help=f"the running service (default {DEFAULT_URL}, or TASKGROVE_URL)")
    parser.add_argument("--token", default=os.environ.get("TASKGROVE_TOKEN"),
                        help="Bearer token when the service has JWT on (or TASKGROVE_TOKEN)")


def connect(url: str, token: str | None) -> AsyncClient:
    """The client every remote command uses. A person waits at the terminal: a service that does
    not answer is said after three quick tries, not after the library's default patience; a 429 or
    503 is still waited out as the service asks (up to a minute)."""
    # Lazy: every `taskgrove` command builds the parser, `serve` included; only a client needs httpx.
    from taskgrove.client import AsyncClient, Retry

    return AsyncClient(url, token or None, retry=Retry(attempts=3, backoff=0.25, max_backoff=2.0,
                                                       max_retry_after=60.0))


def explain(error: TaskgroveError, url: str, token: str | None) -> RemoteError:
    """The one line (and exit status) for a call the client could not carry out."""
    from taskgrove.client import PermissionDenied, ProtocolError, Unreachable

    if isinstance(error, Unreachable):
        reason = error.message.removeprefix(f"cannot reach the service at {url} ")
        return RemoteError(f"cannot reach the service at {url} {reason}; is `taskgrove serve` running there? "
                           "Set --url or TASKGROVE_URL", 2)
    if isinstance(error, PermissionDenied) and error.http_status in (401, 403):
        return refused(token, error.message)
    if isinstance(error, ProtocolError):
        return RemoteError(f"{url}: {error.message}", 2)
    return RemoteError(str(error), 1)


def json_argument(option: str, text: str) -> Any:
    """A command-line option given as JSON; bad JSON is bad input (exit status 2), said with where."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RemoteError(f"{option} is not valid JSON ({exc}); e.g. {option} '{{\"approved\": true}}', "
                          f"{option} '\"text\"', {option} 42", 2) from None


def refused(token: str | None, detail: str) -> RemoteError:
    said = f" (the service said: {detail[:300]})" if detail else ""
    if token:
        return RemoteError(f"the service refused the token{said}; pass a valid one with --token or "
                           "TASKGROVE_TOKEN", 3)
    return RemoteError(f"the service has JWT on and needs a token{said}; pass --token or set TASKGROVE_TOKEN "
                       "(`taskgrove token USER` mints one where SERVICE_JWT_SECRET is known)", 3)
