"""The MCP surface: an official-SDK low-level `Server` whose tools and resources call the same
handlers as the JSON-RPC methods, served over streamable HTTP at /mcp inside the app.

Who is calling is decided exactly as on /tasks: agent.surfaces.edge.call_context (agent.foundations.auth.authenticate
on the request's headers and cookies, the X-LLM-API-KEY header). With JWT on, a request without
a usable token is refused with 401 before the MCP session sees it; a tool call then runs with a
CallContext carrying that caller, so the service functions apply their permission rules. An
RpcError comes back as a tool result with isError and the JSON-RPC error (code, message, data):
so does a tool call over the pending-task quota (-32029, agent/services/admission.py), which the model reads;
a request over the request rate is refused with HTTP 429 before the MCP session sees it. The
database going away (agent/foundations/errors.py `database_unavailable`, asked before -32603) is
a tool result with isError and the -32050 error, whose data says `reason` and `retry_after`; a
resource read answers the same JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from taskgrove.agent import __version__
from taskgrove.agent.foundations.auth import AuthError
from taskgrove.agent.surfaces.bodylimit import replaying
from taskgrove.agent.surfaces.mcp.mcp_needs import McpServices
from taskgrove.agent.surfaces.edge import call_context, limits, unauthorized
from taskgrove.agent.engine import bus
from taskgrove.agent.foundations.errors import INTERNAL_ERROR, RpcError, database_unavailable, invalid_params
from taskgrove.agent.surfaces.mcp.tools import ToolSpec, tool_specs
from taskgrove.agent.foundations.requests import GetTask, GetTree, task_id_text
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply
from taskgrove.agent.surfaces.jsonrpc import JsonReply
from taskgrove.storage import jsonvalues

log = logging.getLogger(__name__)

TASK_URI = "taskgrove://tasks/"
TREE_URI = "taskgrove://trees/"
EXECUTORS_URI = "taskgrove://executors"
SURFACE = "mcp"
# Hints for clients that ask before running tools: what only reads, what removes or stops work.
READ_ONLY = frozenset({"tasks_get", "tasks_tree", "tasks_list", "tasks_children", "tasks_running",
                       "schedules_get", "schedules_list", "system_executors", "system_health"})
DESTRUCTIVE = frozenset({"tasks_delete", "tasks_cancel", "tasks_update", "schedules_delete", "schedules_update",
                         "tasks_purge"})
# How often a followed execution re-reads its root, in case its `final` event never comes.
FOLLOW_POLL_SECONDS = 5.0


def _json(value: Any) -> str:
    return jsonvalues.dumps_bytes(value).decode("utf-8")


def _ok(value: Any) -> types.CallToolResult:
    structured = value if isinstance(value, dict) else {"result": value}
    return types.CallToolResult(content=[types.TextContent(type="text", text=_json(value))],
                                structured_content=structured)


def _failed(exc: RpcError) -> types.CallToolResult:
    error = exc.to_dict()
    return types.CallToolResult(content=[types.TextContent(type="text", text=_json({"error": error}))],
                                structured_content={"error": error}, is_error=True)


class McpSurface:
    """The MCP server of one app: tools, resources, subscriptions, and the /mcp route."""

    def __init__(self, services: McpServices) -> None:
        self.services = services
        self.specs = {spec.name: spec for spec in tool_specs(services.registry.ids())}
        self.server: Server[Any] = Server(
            "taskgrove", version=__version__,
            instructions="Build, run and inspect task trees. parent_id organises a tree; dependencies "
                         "decide execution order. Call system_executors to see what each executor needs.",
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource, on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
        )
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=False, stateless=False)
        self._asgi = StreamableHTTPASGIApp(self.manager)
        # (session id, uri) -> the task forwarding bus events as resources/updated.
        self._watches: dict[tuple[int, str], asyncio.Task[None]] = {}

    # --- HTTP -----------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            ctx = call_context(request, self.services, SURFACE)
        except RpcError as exc:  # a malformed X-LLM-API-KEY header
            await JsonReply({"jsonrpc": "2.0", "id": None, "error": exc.to_dict()}, status_code=400)(scope, receive, send)
            return
        if isinstance(ctx, AuthError):
            await unauthorized(ctx)(scope, receive, send)
            return
        body = await request.body() if request.method == "POST" else None  # the user it names (JWT off)
        if (refusal := self.services.admission.admit_request(ctx, body)) is not None:
            await JsonReply({"jsonrpc": "2.0", "id": None, "error": refusal.to_dict()})(scope, receive, send)  # 429
            return
        await self._asgi(scope, replaying(body, receive) if body is not None else receive, send)

    async def start(self) -> None:
        """Start the session manager's task group. It runs in a task of its own: an anyio task
        group must be left by the task that entered it, and the app's lifespan may be entered and
        left by different tasks (a test fixture's teardown), or start may come from a request."""
        started = asyncio.Event()
        self._stopping = asyncio.Event()

        async def hold() -> None:
            async with self.manager.run():
                started.set()
                await self._stopping.wait()

        self._holder = asyncio.create_task(hold())
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({self._holder, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if self._holder.done():  # failed to start: raise its error
            waiter.cancel()
            self._holder.result()

    async def stop(self) -> None:
        for watch in list(self._watches.values()):
            watch.cancel()
        self._stopping.set()
        await self._holder

    # --- who is calling -------------------------------------------------------------------

    def _call(self, ctx: Any) -> CallContext:
        request = getattr(ctx, "request", None)
        if isinstance(request, Request):
            answer = call_context(request, self.services, SURFACE)
            if isinstance(answer, AuthError):  # refused in _handle already; never trust a stale pass
                raise RpcError(-32001, str(answer), str(answer))
            return answer
        # Not over HTTP (an in-process session): the anonymous caller, only when JWT is off.
        if self.services.settings.jwt_enabled:
            raise RpcError(-32001, "Missing token", "Missing token")
        return CallContext(surface=SURFACE, limits=limits(self.services))

    def _handler(self, spec: ToolSpec) -> Handler:
        table = self.services.task_methods if spec.table == "tasks" else self.services.system_methods
        return table[spec.method]

    # --- tools ----------------------------------------------------------------------------

    async def _list_tools(self, _ctx: Any, _params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=s.name, description=s.description, input_schema=s.schema,
                       annotations=types.ToolAnnotations(
                           read_only_hint=s.name in READ_ONLY,
                           destructive_hint=s.name in DESTRUCTIVE if s.name not in READ_ONLY else None))
            for s in self.specs.values()])

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = self.specs.get(params.name)
        try:
            if spec is None:
                raise invalid_params(f"Unknown tool '{params.name}' (tools: {', '.join(self.specs)})")
            call = self._call(ctx)
            arguments = dict(params.arguments or {})
            if spec.name == "tasks_execute":
                return _ok(await self._execute(ctx, arguments, call))
            result = await self._handler(spec)(arguments, call)
            if isinstance(result, StreamReply):  # never asked for here; release it all the same
                if result.close:
                    result.close()
                result = result.first
            return _ok(result)
        except RpcError as exc:
            return _failed(exc)
        except Exception as exc:  # the same last net as /tasks: -32603, details in the log only
            outage = database_unavailable(exc)
            if outage is not None:  # retryable, not a bug: no traceback (storage/outage.py logs it once)
                return _failed(outage)
            log.exception("MCP tool %s failed", params.name)
            return _failed(RpcError(INTERNAL_ERROR, "Internal error", "The request failed on the server; "
                                                                      "see the service log"))

    async def _execute(self, ctx: Any, arguments: dict[str, Any], call: CallContext) -> Any:
        """tasks.execute, then follow the run on the bus: progress notifications to the caller's
        token while it runs, and the final tree (tasks.tree of the root) as the answer."""
        arguments.pop("use_streaming", None)
        arguments.pop("webhook_config", None)
        # Subscribed before starting, so not even an instant `final` is missed; filtered once the
        # root is known (a copy_execution runs a tree whose id is only known afterwards).
        wanted: list[str | None] = [None]
        sub = self.services.bus.subscribe(lambda e: wanted[0] is None or e.get("root_task_id") == wanted[0],
                                          maxsize=10_000)
        # MCP asks each progress notification to carry a larger value than the one before: an
        # event that does not move the tree's progress is not sent (the final answer says all).
        last = -1.0
        try:
            started = await self.services.task_methods["tasks.execute"](arguments, call)
            root = wanted[0] = started["root_task_id"]
            while True:
                try:  # asyncio.timeout, not wait_for: a cancel must end the follow
                    async with asyncio.timeout(FOLLOW_POLL_SECONDS):
                        event = await sub.get()
                except TimeoutError:
                    if await self.services.engine.run_keeper.following(root) is None:
                        break  # no execution of this tree runs any more (its final was missed)
                    continue
                if event.get("root_task_id") != root:
                    continue
                progress = float((event.get("progress") if event["type"] == bus.FINAL
                                  else event.get("tree_progress")) or 0.0)
                if progress > last:
                    last = progress
                    message = f"{event['type']}: {event.get('name') or event['task_id']} ({event.get('status')})"
                    await _progress(ctx, progress, message)
                if event["type"] == bus.FINAL:
                    break
        finally:
            sub.close()
        tree = await self.services.tasks.tree(GetTree(root), call)
        return {"execution": started, "tree": tree}

    # --- resources ------------------------------------------------------------------------

    async def _list_resources(self, _ctx: Any, _params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(
            uri=EXECUTORS_URI, name="executors", mime_type="application/json",
            description="The executors this service offers (system_executors).")])

    async def _list_templates(self, _ctx: Any, _params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template=TASK_URI + "{id}", name="task", mime_type="application/json",
                                   description="One task (tasks_get); subscribe to hear of its changes, a wait for input "
                                               "(its `waiting`: prompt, schema) among them."),
            types.ResourceTemplate(uri_template=TREE_URI + "{id}", name="tree", mime_type="application/json",
                                   description="The whole tree of a task (tasks_tree); subscribe to hear of "
                                               "changes anywhere in it."),
        ])

    async def _resource(self, uri: str, call: CallContext) -> Any:
        if uri == EXECUTORS_URI:
            return await self.services.system_methods["system.executors"]({}, call)
        if uri.startswith(TASK_URI) and len(uri) > len(TASK_URI):
            task = await self.services.tasks.get(GetTask(task_id_text(uri[len(TASK_URI):])), call)
            if task is None:
                raise invalid_params(f"Task '{uri[len(TASK_URI):]}' not found")
            return task
        if uri.startswith(TREE_URI) and len(uri) > len(TREE_URI):
            return await self.services.tasks.tree(GetTree(task_id_text(uri[len(TREE_URI):])), call)
        raise invalid_params(f"Unknown resource '{uri}' (taskgrove://tasks/<id>, taskgrove://trees/<id>, "
                             f"{EXECUTORS_URI})")

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        value = await _mcp_errors(self._resource(uri, self._call(ctx)))
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=_json(value))])

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        value = await _mcp_errors(self._resource(uri, self._call(ctx)))  # exists, and the caller may read it
        if uri != EXECUTORS_URI:
            session = ctx.session
            key = (id(session), uri)
            if key not in self._watches:
                if uri.startswith(TREE_URI):
                    tree_id = value["id"]
                    match = lambda e: e.get("root_task_id") == tree_id  # noqa: E731
                else:
                    task_id = value["id"]
                    match = lambda e: e.get("task_id") == task_id  # noqa: E731
                sub = self.services.bus.subscribe(match, maxsize=1000)
                watch = asyncio.create_task(self._forward(sub, session, uri))
                self._watches[key] = watch
                watch.add_done_callback(lambda _t: self._watches.pop(key, None))
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        watch = self._watches.pop((id(ctx.session), str(params.uri)), None)
        if watch is not None:
            watch.cancel()
        return types.EmptyResult()

    async def _forward(self, sub: Any, session: Any, uri: str) -> None:
        try:
            while True:
                await sub.get()
                while not sub.queue.empty():  # one notice for a burst of changes
                    sub.queue.get_nowait()
                await session.send_resource_updated(uri)
        except asyncio.CancelledError:
            raise
        except Exception:  # the session is gone: stop following
            log.debug("resource subscription %s ended", uri, exc_info=True)
        finally:
            sub.close()


async def _progress(ctx: Any, progress: float, message: str) -> None:
    try:
        await ctx.session.report_progress(progress, 1.0, message)
    except Exception:  # a client that went away must not fail the run's answer
        log.debug("progress notification not sent", exc_info=True)


async def _mcp_errors(coro: Any) -> Any:
    """Resource reads answer JSON-RPC errors: the same code, message and data as /tasks."""
    from mcp.shared.exceptions import MCPError

    try:
        return await coro
    except RpcError as exc:
        raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None
    except Exception as exc:
        outage = database_unavailable(exc)
        if outage is None:
            raise
        raise MCPError(code=outage.code, message=outage.message, data=outage.data) from None
