"""Real HTTP servers for tests: a callback receiver that records what it is sent."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.deadlines import EVENT_WAIT


# Ports tests listen on. Under pytest-xdist each worker draws from its own block, below Linux's
# ephemeral range (32768 and up, where outgoing connections get their ports), so two workers, or
# a client's connection, never pick the port a server of another test is about to bind.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_BLOCK = range(10_000 + 2_500 * (_WORKER % 8), 12_500 + 2_500 * (_WORKER % 8))


def free_port() -> int:
    """A port nothing listens on now, from this worker's block."""
    for port in random.sample(_BLOCK, 50):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_BLOCK}")


@dataclass
class Receiver:
    """Records every request; answers with the statuses in `script` first, then 200."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    script: list[int] = field(default_factory=list)

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.requests.append({
            "method": request.method,
            "path": request.url.path,
            "headers": dict(request.headers),
            "json": json.loads(body) if body else None,
            "at": time.monotonic(),
        })
        status = self.script.pop(0) if self.script else 200
        return JSONResponse({"ok": status < 400}, status_code=status)

    async def wait_for(self, predicate: Any, timeout: float = EVENT_WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.requests):
            if time.monotonic() > deadline:
                raise AssertionError(f"receiver never saw the expected requests: {self.requests}")
            await asyncio.sleep(0.02)


@asynccontextmanager
async def serve(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Run an ASGI app on 127.0.0.1 inside this event loop; yields its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    job = asyncio.create_task(server.serve())
    while not server.started:
        if job.done():
            job.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await job


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = Starlette(routes=[Route("/{path:path}", rec.handle, methods=["POST", "PUT", "PATCH", "GET"])])
    async with serve(app) as url:
        rec.url = url
        yield rec
