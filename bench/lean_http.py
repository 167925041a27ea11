"""A lean HTTP/1.1 keep-alive client on asyncio streams: what a request costs without a Python client library.

httpx costs about 0.5 ms of the client's CPU a request on this machine (a bare Starlette endpoint
answers in 0.64-0.81 ms p50 to httpx and in 0.16-0.26 ms to this client), which is larger than the
server's own work for a one-task create. DBOS, the peer, is called in process with no client at
all, so bench/peers.py reports the one-task time with both clients, each beside the bare
Starlette endpoint measured with the same client: the httpx figure is what a Python user of
httpx meets, this one is what the service costs (and what a Go, Rust or aiohttp client meets).

Only what the benchmarks need: POST a JSON body, read a `content-length` answer (uvicorn sends
one for every non-streaming response), one connection, one request at a time. `post` is called
as httpx's is (`await client.post(path, json=body)`, then `.json()`), so bench/wire.py's helpers
take either client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

_dumps = json.dumps  # `post` takes a `json` argument, as httpx's does


class LeanAnswer:
    """A 2xx answer's body; `json()` decodes it, as httpx.Response.json does."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def json(self) -> Any:
        return json.loads(self.payload)


class LeanHttp:
    """One keep-alive connection to `url` (http://host:port)."""

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

    async def post(self, path: str, *, json: Any) -> LeanAnswer:
        """POST `json` to `path`; RuntimeError for an answer that is not 2xx."""
        assert self._reader is not None and self._writer is not None, "use `async with LeanHttp(url)`"
        data = _dumps(json).encode()
        self._writer.write(f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                           f"content-length: {len(data)}\r\n\r\n".encode() + data)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in header_lines) if value}
        if "content-length" not in headers:
            raise RuntimeError(f"no content-length in the answer ({status_line}): this client reads no other")
        payload = await self._reader.readexactly(int(headers["content-length"]))
        if not status_line.split(" ", 2)[1].startswith("2"):
            raise RuntimeError(f"{status_line}: {payload[:300]!r}")
        return LeanAnswer(payload)
