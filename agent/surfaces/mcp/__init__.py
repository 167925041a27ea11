"""The MCP surface (Model Context Protocol, official `mcp` SDK): /mcp over streamable HTTP in the
app (server.py), the tool catalogue (tools.py), and the stdio proxy behind `taskgrove mcp` (stdio.py).

This module is what the app imports: the /mcp route and its lifetime, without the SDK. The SDK
(about 0.4 s of imports) and the MCP server are built on the first request to /mcp, so a service
nobody asks over MCP starts as fast as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.mcp.mcp_needs import McpServices
    from taskgrove.agent.surfaces.mcp.server import McpSurface


class McpRoute:
    """The /mcp endpoint (an ASGI app) and the lifetime of the MCP server behind it."""

    def __init__(self, services: McpServices) -> None:
        self.services = services
        self.surface: McpSurface | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def route(self) -> Route:
        return Route("/mcp", endpoint=self, methods=["GET", "POST", "DELETE"])

    async def _started(self) -> "McpSurface":
        async with self._lock:
            if self._closed:
                raise RuntimeError("the service is stopping")
            if self.surface is None:
                from taskgrove.agent.surfaces.mcp.server import McpSurface

                surface = McpSurface(self.services)
                await surface.start()
                self.surface = surface
            return self.surface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        surface = await self._started()
        await surface.handle(scope, receive, send)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """For the app's lifespan: stops the MCP server, if one was started, on the way out."""
        try:
            yield
        finally:
            async with self._lock:
                self._closed = True
                if self.surface is not None:
                    await self.surface.stop()


