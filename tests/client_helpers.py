"""What the client's tests (tests/test_client_*.py) share: an app served over real HTTP and
WebSocket in this event loop, httpx transports that lose or refuse what a network or a service in
trouble would, and a TCP proxy whose connections a test cuts.

The faults are made where they happen in production, between the client and the service: a
request that reached the service and whose answer was lost, a 503 in front of it, a connection
cut. The service itself is the real one, untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.settings import Settings
from tests.servers import free_port, serve


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[str, Any]]:
    """The app of `settings` on 127.0.0.1 (uvicorn, its lifespan run): (base URL, app)."""
    app = build_app(settings.with_(shutdown_grace_seconds=0.0))
    async with serve(app) as url:
        yield url, app


class LosingTransport(httpx.AsyncBaseTransport):
    """Sends every request to the service; for the first `times` requests `matching`, the answer
    is then lost on the way back, as when a connection drops after the service has acted."""

    def __init__(self, matching: Callable[[httpx.Request], bool], times: int = 1) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.matching = matching
        self.left = times
        self.sent: list[httpx.Request] = []
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = await self.inner.handle_async_request(request)
        if self.left > 0 and self.matching(request):
            self.left -= 1
            self.lost += 1
            await response.aread()  # the service answered in full ...
            await response.aclose()
            raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class RefusingTransport(httpx.AsyncBaseTransport):
    """Answers the first `times` requests `matching` itself with `status` (a proxy or a service
    that cannot serve now), without passing them on; the rest go to the service."""

    def __init__(self, matching: Callable[[httpx.Request], bool], *, status: int = 503, times: int = 1,
                 retry_after: str | None = "1", body: bytes | None = None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.matching = matching
        self.status = status
        self.left = times
        self.retry_after = retry_after
        self.body = body
        self.refused = 0
        self.passed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.left > 0 and self.matching(request):
            self.left -= 1
            self.refused += 1
            headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
            return httpx.Response(self.status, headers=headers, content=self.body or b"service unavailable",
                                  request=request)
        self.passed += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def method_is(*names: str) -> Callable[[httpx.Request], bool]:
    """A matcher for requests whose JSON-RPC method is one of `names`."""
    wanted = [f'"method": "{name}"'.encode() for name in names]

    def matching(request: httpx.Request) -> bool:
        return any(w in request.content for w in wanted)

    return matching


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of `target` (host, port). `cut()` closes every
    connection it carries, as a network fault or a restarted load balancer would; while
    `blocked`, new connections are closed at once."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.blocked = False
        self.accepted = 0
        self.refused = asyncio.Event()  # set once a connection was refused while blocked
        self._accepting = asyncio.Condition()
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def until_accepted(self, count: int) -> None:
        """Until the proxy has let `count` connections through since it started."""
        async with self._accepting:
            await self._accepting.wait_for(lambda: self.accepted >= count)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.transport.abort()
            self.refused.set()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        async with self._accepting:
            self._accepting.notify_all()
        self._writers.update((writer, up_writer))
        pipes = {asyncio.create_task(_pipe(reader, up_writer)), asyncio.create_task(_pipe(up_reader, writer))}
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        for task in pipes:
            task.cancel()
        for side in (writer, up_writer):
            side.transport.abort()
            self._writers.discard(side)
        self._pipes.difference_update(pipes)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        return
