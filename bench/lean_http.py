"""A lean HTTP/1.1 keep-alive client on asyncio streams: what a request costs without a Python client library.

httpx costs about 0.5 ms of the client's CPU a request on this machine (a bare Starlette endpoint
answers in 0.64 ms p50 to httpx and in 0.16 ms to this client), which is larger than the
server's own work for a one-task create. DBOS, the peer, is called in process with no client at
all, so bench/peers.py reports the one-task time with both clients, each beside the bare
Starlette endpoint measured with the same client: the httpx figure is what a Python user of
httpx meets, this one is what the service costs (and what a Go, Rust or aiohttp client meets).

Only what the benchmarks need: POST a JSON body, read a `content-length` answer (uvicorn sends
one for every non-streaming response), one connection, one request at a time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class LeanHttp:
    """One keep-alive connection to `url` (http://host:port); `post` sends JSON and returns the parsed answer."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> LeanHttp:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def post(self, path: str, body: Any) -> Any:
        assert self._reader is not None and self._writer is not None, "use `async with LeanHttp(url)`"
        data = json.dumps(body).encode()
        self._writer.write(f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                           f"content-length: {len(data)}\r\n\r\n".encode() + data)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(":", 1) for line in header_lines if ":" in line)
        length = {key.strip().lower(): value.strip() for key, value in headers.items()}.get("content-length")
        if length is None:
            raise RuntimeError(f"no content-length in the answer ({status_line}): this client reads no other")
        payload = await self._reader.readexactly(int(length))
        if not status_line.split(" ", 2)[1].startswith("2"):
            raise RuntimeError(f"{status_line}: {payload[:300]!r}")
        return json.loads(payload)
