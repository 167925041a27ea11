"""The service as a remote client sees it: JSON-RPC calls on /tasks and /system, live events on
/ws, with the URL and token every remote command (and `taskgrove mcp`) takes from --url/--token or
TASKGROVE_URL/TASKGROVE_TOKEN.

Failures a person can act on (nothing listening, a refused token, a JSON-RPC error) are raised as
RemoteError with a message and an exit status, so the command line prints one line, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
# One /ws connection watches at most this many tasks (agent/surfaces/ws.py MAX_SUBSCRIPTIONS).
WS_SUBSCRIPTIONS = 1000
# Put by a connection the service closed.
_CLOSED = object()


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


class Remote:
    """One running service: `call` a JSON-RPC method, `events` of tasks over /ws."""

    def __init__(self, url: str, token: str | None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token or None
        self._ids = itertools.count(1)
        # Lazy: every `taskgrove` command builds this parser, `serve` included, and importing httpx
        # loads rich, click and pygments through httpx._main (~4 MB): only a client needs it.
        import httpx

        self._http = httpx.AsyncClient(timeout=timeout, headers=self._headers())

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "Remote":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def call(self, method: str, params: Any = None) -> Any:
        """The method's result; RemoteError for an unreachable service, a refused token or an error."""
        path = "/system" if method.startswith(("system.", "examples.", "config.")) else "/tasks"
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        import httpx  # loaded by __init__ already

        try:
            response = await self._http.post(f"{self.url}{path}", json=body)
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from None
        if response.status_code == 401:
            raise refused(self.token, _message(response))
        try:
            answer = response.json()
        except ValueError:
            raise RemoteError(f"{self.url}{path} answered HTTP {response.status_code} without JSON: is this a "
                              "taskgrove service?", 2) from None
        if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
            raise RemoteError(f"{self.url}{path} did not answer JSON-RPC (HTTP {response.status_code})", 2)
        error = answer.get("error")
        if error:
            data = error.get("data")
            detail = data if isinstance(data, str) and data and data != error.get("message") else None
            raise RemoteError(f"{method}: {error.get('message')}" + (f": {detail}" if detail else ""), 1)
        return answer["result"]

    async def events(self, task_ids: Sequence[str]) -> AsyncIterator[dict[str, Any]]:
        """Messages of /ws for `task_ids`: first each task's snapshot, then its changes as they
        happen. The token goes in the handshake's Authorization header (never in the URL). One
        connection watches at most WS_SUBSCRIPTIONS tasks, so a larger tree uses several."""
        ids = list(task_ids)
        chunks = [ids[i:i + WS_SUBSCRIPTIONS] for i in range(0, len(ids), WS_SUBSCRIPTIONS)] or [[]]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(chunk: list[str]) -> None:
            try:
                async for message in self._connection(chunk):
                    queue.put_nowait(message)
                queue.put_nowait(_CLOSED)
            except BaseException as exc:  # handed to the reader, which raises it
                queue.put_nowait(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

        pumps = [asyncio.create_task(pump(chunk)) for chunk in chunks]
        try:
            while True:
                item = await queue.get()
                if item is _CLOSED:  # one connection ended: the stream is incomplete from here on
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _connection(self, task_ids: list[str]) -> AsyncIterator[dict[str, Any]]:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        ws_url = "ws" + self.url[len("http"):] + "/ws" if self.url.startswith("http") else self.url + "/ws"
        try:
            async with connect(ws_url, additional_headers=self._headers(), max_size=None,
                               open_timeout=30) as socket:
                for task_id in task_ids:
                    await socket.send(json.dumps({"action": "subscribe", "task_id": task_id}))
                async for raw in socket:
                    yield json.loads(raw)
        except InvalidStatus as exc:
            if exc.response.status_code == 401:
                raise refused(self.token, _message_bytes(exc.response.body)) from None
            raise RemoteError(f"{ws_url} refused the connection (HTTP {exc.response.status_code})", 2) from None
        except (OSError, WebSocketException) as exc:
            raise unreachable(self.url, exc) from None


def json_argument(option: str, text: str) -> Any:
    """A command-line option given as JSON; bad JSON is bad input (exit status 2), said with where."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RemoteError(f"{option} is not valid JSON ({exc}); e.g. {option} '{{\"approved\": true}}', "
                          f"{option} '\"text\"', {option} 42", 2) from None


def unreachable(url: str, exc: Exception) -> RemoteError:
    reason = str(exc) or type(exc).__name__
    return RemoteError(f"cannot reach the service at {url} ({reason}); is `taskgrove serve` running there? "
                       "Set --url or TASKGROVE_URL", 2)


def refused(token: str | None, detail: str) -> RemoteError:
    said = f" (the service said: {detail})" if detail else ""
    if token:
        return RemoteError(f"the service refused the token{said}; pass a valid one with --token or "
                           "TASKGROVE_TOKEN", 3)
    return RemoteError(f"the service has JWT on and needs a token{said}; pass --token or set TASKGROVE_TOKEN "
                       "(`taskgrove token USER` mints one where SERVICE_JWT_SECRET is known)", 3)


def _message(response: httpx.Response) -> str:
    return _message_bytes(response.content)


def _message_bytes(body: bytes | bytearray | None) -> str:
    try:
        return str(json.loads(body or b"")["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return ""
