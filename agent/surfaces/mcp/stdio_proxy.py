"""`taskgrove mcp`: an MCP server over stdio that forwards every request to a running service's
/mcp (an MCP client of it, official SDK on both sides), so desktop MCP clients can launch it.

Nothing is decided here: tools, schemas, permission rules and errors are the service's. Progress
notifications of a forwarded tool call and resources/updated notifications of a forwarded
subscription are passed back to the stdio client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.shared._httpx_utils import create_mcp_http_client

from taskgrove.agent import __version__


class _Remote:
    """The client session to the service, and the local session that wants its notifications."""

    def __init__(self) -> None:
        self.client: ClientSession | None = None
        self.local: ServerSession | None = None  # the stdio client's session, once it called

    async def on_message(self, message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated" and self.local is not None:
            await self.local.send_resource_updated(str(root.params.uri))


def build_proxy(url: str, token: str | None) -> Server[Any]:
    remote = _Remote()
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/mcp") else "/mcp")

    @contextlib.asynccontextmanager
    async def lifespan(_server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with create_mcp_http_client(headers=headers) as http, \
                streamable_http_client(endpoint, http_client=http) as (read, write), \
                ClientSession(read, write, message_handler=remote.on_message) as client:
            await client.initialize()
            remote.client = client
            yield {}

    def client() -> ClientSession:
        assert remote.client is not None
        return remote.client

    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        return await client().list_tools()

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        return await client().call_tool(params.name, params.arguments, progress_callback=progress)

    async def list_resources(_ctx: Any, _params: Any) -> types.ListResourcesResult:
        return await client().list_resources()

    async def list_templates(_ctx: Any, _params: Any) -> types.ListResourceTemplatesResult:
        return await client().list_resource_templates()

    async def read_resource(_ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await client().read_resource(str(params.uri))

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        remote.local = ctx.session
        return await client().subscribe_resource(str(params.uri))

    async def unsubscribe(_ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        return await client().unsubscribe_resource(str(params.uri))

    return Server(
        "taskgrove", version=__version__, lifespan=lifespan,
        instructions=f"taskgrove at {url}: build, run and inspect task trees.",
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_list_resource_templates=list_templates, on_read_resource=read_resource,
        on_subscribe_resource=subscribe, on_unsubscribe_resource=unsubscribe,
    )


async def serve_stdio(url: str, token: str | None) -> None:
    server = build_proxy(url, token)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
