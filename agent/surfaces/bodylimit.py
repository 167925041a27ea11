"""Bounded request bodies on every HTTP surface (`/`, `/tasks`, `/system`, `/graphql`, ...).

Why a middleware: it sits in front of every route, ours and the A2A SDK's, so no surface can
forget the limit. A body over SERVICE_MAX_REQUEST_BYTES is answered HTTP 413 with a JSON-RPC
error body (-32600), whether Content-Length announces it or a chunked body passes the limit:
nothing more is kept once over. The rest of the body is still read and thrown away, up to
DRAIN_FACTOR times the limit, so that the client, which usually sends its whole body before it
reads, gets the answer instead of a reset connection; a body beyond that is cut off. A body whose brackets nest deeper than
SERVICE_MAX_JSON_DEPTH is answered -32700 (HTTP 200, as every JSON-RPC error) before any surface
parses it, so no parser anywhere recurses on it. Bodies within the limits are read here once and
handed on unchanged. Under `/graphql` the refusals have the GraphQL shape (`errors`), with the
same codes.

WebSocket messages are bounded elsewhere: uvicorn's `ws_max_size` (set from the same setting by
`taskgrove serve`), the per-message limit of `/ws` (agent/surfaces/ws.py) and of GraphQL subscriptions.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskgrove.agent.foundations.errors import INVALID_REQUEST, PARSE_ERROR
from taskgrove.storage import jsonvalues

GRAPHQL_PREFIX = "/graphql"
# How much of an oversized body is read (and discarded) so that the 413 reaches the client.
DRAIN_FACTOR = 4


def refusal(path: str, code: int, message: str, detail: str) -> bytes:
    """A refusal in the shape of the surface at `path`."""
    if path.startswith(GRAPHQL_PREFIX):
        name = "PARSE_ERROR" if code == PARSE_ERROR else "INVALID_REQUEST"
        return jsonvalues.dumps_bytes({"data": None, "errors": [
            {"message": detail, "extensions": {"code": code, "codeName": name}}]})
    return jsonvalues.dumps_bytes({"jsonrpc": "2.0", "id": None,
                                   "error": {"code": code, "message": message, "data": detail}})


class BodyLimit:
    """ASGI middleware: HTTP 413 for bodies over `max_bytes`, -32700 for JSON nested deeper than
    `max_depth`."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int = jsonvalues.DEFAULT_MAX_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self.take_body(scope, receive, send)
        if type(body) is bytes:
            await self.app(scope, replaying(body, receive), send)

    async def take_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | int | None:
        """The whole body of an HTTP request within the limits (what this middleware hands on),
        for a caller in front of it that answers the request itself (agent/surfaces/rpc_front.py);
        else the HTTP status of the refusal answered here (413, or -32700's 200 or 400), or None
        when the client left before sending its body (nobody to answer)."""
        announced = _content_length(scope)
        if announced is not None and announced > self.max_bytes * DRAIN_FACTOR:
            return await self._too_large(scope, send)  # not worth reading: the connection is cut
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before sending its body: nobody to answer
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > self.max_bytes:
                await self._drain(receive, size, more)
                return await self._too_large(scope, send)
            chunks.append(chunk)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if jsonvalues.too_deep(body, self.max_depth):
            detail = (f"body is not valid JSON: it is nested deeper than {self.max_depth} levels "
                      "(the limit is SERVICE_MAX_JSON_DEPTH)")
            status = 400 if scope["path"].startswith(GRAPHQL_PREFIX) else 200
            await _answer(send, status, refusal(scope["path"], PARSE_ERROR, "Parse error", detail))
            return status
        return body

    async def _drain(self, receive: Receive, size: int, more: bool) -> None:
        """Read and discard the rest of an oversized body, up to DRAIN_FACTOR times the limit."""
        while more and size <= self.max_bytes * DRAIN_FACTOR:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)

    async def _too_large(self, scope: Scope, send: Send) -> int:
        detail = (f"request body larger than {self.max_bytes} bytes (the limit is SERVICE_MAX_REQUEST_BYTES); "
                  "send less, e.g. split a large tree")
        await _answer(send, 413, refusal(scope["path"], INVALID_REQUEST, "Invalid Request", detail), close=True)
        return 413


async def _answer(send: Send, status: int, payload: bytes, close: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:  # the rest of the body is never read: the connection cannot be reused
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands on `body`, already read, as one message, then the server's own
    receive (which waits for the disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
