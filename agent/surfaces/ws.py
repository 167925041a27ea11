"""WebSocket `/ws`: live task events for the tasks a client subscribes to.

Protocol (SPEC.md, WebSocket `/ws`; docs/live-updates.md has examples):

* client -> server: `{"action": "subscribe" | "unsubscribe" | "ping", "task_id": "..."}`; a task's
  log lines: `subscribe_logs` / `unsubscribe_logs` (agent/surfaces/ws_logs.py, `task_log` messages)
* server -> client: `{"type", "task_id", "context_id", "data": {"status", "progress", ...}}` with
  `type` one of `task_status`, `task_progress`, `task_completed`, `task_failed`, `pong`, and
  `{"type": "error", "message": ...}` for a message the server could not act on. `data.waiting`
  is a parked task's wait (docs/waits.md) in its snapshot and when it parks, null when it resumes.
  While the database is unavailable a message that needs it gets an error frame with `data.code`
  -32050, `data.reason` and `data.retry_after` (agent/foundations/errors.py DatabaseUnavailable);
  the socket stays open and its other subscriptions go on: send it again after that wait.

One connection holds one bus subscription whose filter is the set of subscribed task ids, so the
engine only ever does a set lookup and a non-blocking `put` per event and connection. The bus
queue is bounded and drops its oldest event when full: a slow or dead client loses old progress,
it never slows the engine down.

Subscribing answers the task's current state at once (a `task_completed` or `task_failed` message
for a finished task, `task_status` otherwise), then its changes as they happen. The snapshot and
the events are sent under one lock, and the snapshot is taken at the same instant the filter
starts matching, so a client never sees an event older than the snapshot after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from taskgrove.agent.foundations.auth import AuthError, authenticate
from taskgrove.agent.engine import bus
from taskgrove.agent.foundations.errors import (INTERNAL_ERROR, PERMISSION_DENIED, RpcError, database_unavailable,
                                               task_not_found)
from taskgrove.agent.foundations.requests import GetTask, task_id_text
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.surfaces.ws_logs import LogFollows
from taskgrove.storage import jsonvalues
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.clock import now_iso

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.engine.bus import EventBus
    from taskgrove.agent.engine.engine import Engine
    from taskgrove.agent.foundations.settings import Settings
    from taskgrove.agent.services.log_service import LogService
    from taskgrove.agent.services.task_service import TaskService


class WsServices(Protocol):
    """What /ws reads of the services (agent/services/container.py `Services` has it)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def bus(self) -> EventBus: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def tasks(self) -> TaskService: ...

    @property
    def logs(self) -> LogService: ...

log = logging.getLogger(__name__)

# Events kept per connection before the oldest is dropped (see module docstring).
BUFFER_EVENTS = 256
# Task ids one connection may watch at once; beyond this a subscribe is refused.
MAX_SUBSCRIPTIONS = 1000
# Close code sent when the handshake cannot be answered with HTTP 401 (no denial-response support).
CLOSE_UNAUTHORIZED = 4401

ACTIONS = ("subscribe", "unsubscribe", "ping", "subscribe_logs", "unsubscribe_logs")

# Engine event type -> WebSocket message type. `final` is a tree summary whose task_id is the
# root's: the root task's own task_completed/task_failed already reports it, so it is not sent.
WIRE_TYPES = {
    bus.TASK_START: "task_status",
    bus.PROGRESS: "task_progress",
    bus.TASK_COMPLETED: "task_completed",
    bus.TASK_FAILED: "task_failed",
    bus.TASK_CANCELLED: "task_failed",
}


# --- shared with the GraphQL subscription ---------------------------------------------------


async def deny_handshake(websocket: WebSocket, exc: AuthError) -> None:
    """Refuse a WebSocket before accepting it: HTTP 401 with a JSON body where the server supports
    denial responses (uvicorn does), else a close, which the server answers with HTTP 403."""
    body = {"error": {"code": PERMISSION_DENIED, "message": str(exc)}}
    try:
        await websocket.send_denial_response(
            JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        )
    except RuntimeError:
        await websocket.close(code=CLOSE_UNAUTHORIZED, reason=str(exc)[:120])


# --- message shapes ---------------------------------------------------------------------------


def event_message(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """One bus event as a WebSocket message, or None for events this channel does not send."""
    kind = WIRE_TYPES.get(event["type"])
    if kind is None:
        return None
    data: dict[str, Any] = {
        "status": event["status"],
        "progress": event.get("progress", 0.0),
        "name": event.get("name"),
        "message": event.get("message"),
        "timestamp": event["timestamp"],
    }
    if "waiting" in event:  # a task parks (its wait) or its wait ends (null): docs/waits.md
        data["waiting"] = event["waiting"]
    if event["type"] == bus.TASK_COMPLETED:
        data["result"] = event.get("result")
    elif event["type"] in (bus.TASK_FAILED, bus.TASK_CANCELLED):
        data["error"] = event.get("error")
    return {"type": kind, "task_id": event["task_id"], "context_id": event["root_task_id"], "data": data}


def snapshot_message(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task's current state, in the message type its status would have been reported with."""
    status = task["status"]
    data: dict[str, Any] = {
        "status": status,
        "progress": task["progress"],
        "name": task["name"],
        "timestamp": now_iso(),
        "snapshot": True,
    }
    if task.get("waiting"):
        data["waiting"] = task["waiting"]
    if status == TaskStatus.COMPLETED:
        kind = "task_completed"
        data["result"] = task.get("result")
    elif status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        kind = "task_failed"
        data["error"] = task.get("error")
    else:
        kind = "task_status"
    return {"type": kind, "task_id": task["id"], "context_id": task["task_tree_id"], "data": data}


def error_message(message: str, task_id: Any = None, code: int | None = None,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An error frame; `extra` adds to its data (a DatabaseUnavailable's reason and retry_after)."""
    answer: dict[str, Any] = {"type": "error", "message": message, "task_id": task_id, "context_id": None,
                              "data": {"message": message}}
    if code is not None:
        answer["data"]["code"] = code
    if extra:
        answer["data"].update(extra)
    return answer


def refusal_message(exc: RpcError, task_id: Any) -> dict[str, Any]:
    """The error frame of an RpcError: its detail, code, and a structured data's fields."""
    detail = exc.data if isinstance(exc.data, str) else exc.message
    return error_message(detail, task_id, exc.code, exc.data if isinstance(exc.data, Mapping) else None)


def parse_message(raw: str | bytes | None, max_bytes: int = 64 * 1024,
                  max_depth: int = jsonvalues.DEFAULT_MAX_DEPTH) -> tuple[str, str | None]:
    """(action, task_id) of one client message; ValueError with a message for the client.

    Parsed by storage.jsonvalues like every request body: size and depth bounded, NaN refused,
    a task id that is not valid Unicode refused before it reaches the database."""
    if raw is None:
        raise ValueError("Empty message: send a JSON object with an 'action'")
    size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    if size > max_bytes:
        raise ValueError(f"Message larger than {max_bytes} bytes (the limit is SERVICE_MAX_WS_MESSAGE_BYTES)")
    try:
        payload = jsonvalues.loads(raw, max_depth, what="message").value
    except jsonvalues.JsonTextError as exc:
        raise ValueError(f"{exc}; send a JSON object with an 'action'") from None
    if not isinstance(payload, dict):
        raise ValueError("Message must be a JSON object with an 'action'")
    action = payload.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        shown = repr(action)[:80] if isinstance(action, (str, int, float, bool)) or action is None \
            else f"of type {type(action).__name__}"
        raise ValueError(f"Unknown action {shown}: expected one of {', '.join(ACTIONS)}")
    task_id = payload.get("task_id")
    if isinstance(task_id, str) and not jsonvalues.is_valid_text(task_id):
        raise ValueError(f"task_id {jsonvalues.NOT_UNICODE}")
    if action == "ping":
        return action, task_id if isinstance(task_id, str) and len(task_id) <= 255 else None
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError(f"'{action}' needs a 'task_id' (a non-empty string)")
    if len(task_id) > 255:
        raise ValueError("task_id is longer than 255 characters")
    return action, task_id


# --- one connection ---------------------------------------------------------------------------


class Session:
    """One client connection: its subscribed ids, its bus subscription and its send lock."""

    def __init__(self, websocket: WebSocket, services: WsServices, ctx: CallContext) -> None:
        self.websocket = websocket
        self.services = services
        self.ctx = ctx
        self.watched: set[str] = set()
        self.lock = asyncio.Lock()
        # Filter runs inside the engine's publish: keep it a set lookup.
        self.subscription = services.bus.subscribe(
            lambda e: e["task_id"] in self.watched and e["type"] in WIRE_TYPES, maxsize=BUFFER_EVENTS
        )
        self.logs = LogFollows(services.logs, ctx, self.send_locked, self.send_error)

    async def send_locked(self, message: Mapping[str, Any]) -> None:
        async with self.lock:
            await self.send(message)

    async def send_error(self, problem: Mapping[str, Any]) -> None:
        await self.send_locked(error_message(problem["message"], problem.get("task_id"), problem.get("code")))

    async def send(self, message: Mapping[str, Any]) -> None:
        # jsonvalues.dumps: never the token `Infinity` (not JSON) from a stored or reported value.
        await self.websocket.send_text(jsonvalues.dumps(message))

    async def run(self) -> None:
        pump = asyncio.create_task(self._pump(), name="ws-pump")
        try:
            await self._read()
        finally:
            pump.cancel()
            self.subscription.close()
            await self.logs.close()
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump(self) -> None:
        """Bus events of watched tasks -> the socket, in order."""
        try:
            while True:
                event = await self.subscription.get()
                async with self.lock:
                    # Re-checked under the lock: an unsubscribe processed meanwhile wins.
                    if event["task_id"] not in self.watched:
                        continue
                    message = event_message(event)
                    if message is not None:
                        await self.send(message)
        except (WebSocketDisconnect, OSError):
            return  # the client went away; the reader sees the disconnect and ends the session
        except Exception:
            # Never leave a client connected to a stream that has silently stopped.
            log.exception("WebSocket event pump failed; closing the connection")
            await self.websocket.close(code=1011, reason="internal error")

    async def _read(self) -> None:
        while True:
            frame = await self.websocket.receive()
            if frame["type"] == "websocket.disconnect":
                return
            raw = frame.get("text") if frame.get("text") is not None else frame.get("bytes")
            settings = self.services.settings
            try:
                action, task_id = parse_message(raw, settings.max_ws_message_bytes, settings.max_json_depth)
            except ValueError as exc:
                async with self.lock:
                    await self.send(error_message(str(exc)))
                continue
            try:
                await self.handle(action, task_id)
            except (WebSocketDisconnect, OSError):  # the client's socket (the drivers' errors come wrapped)
                raise
            except Exception as exc:  # one bad message never ends the connection or its other subscriptions
                outage = database_unavailable(exc)
                if outage is not None:  # retryable, not a bug: no traceback (storage/outage.py logs it once)
                    async with self.lock:
                        await self.send(refusal_message(outage, task_id))
                    continue
                log.exception("WebSocket message %s failed", action)
                async with self.lock:
                    await self.send(error_message("The server could not handle this message; see the service log",
                                                  task_id, INTERNAL_ERROR))

    async def handle(self, action: str, task_id: str | None) -> None:
        if action == "ping":
            async with self.lock:
                await self.send({"type": "pong", "task_id": task_id, "context_id": None,
                                 "data": {"timestamp": now_iso()}})
        elif action == "unsubscribe":
            assert task_id is not None
            async with self.lock:
                if task_id in self.watched:
                    self.watched.discard(task_id)
                else:
                    await self.send(error_message(f"Not subscribed to task '{task_id}'", task_id))
        elif action == "subscribe_logs":
            assert task_id is not None
            await self.logs.subscribe(task_id)
        elif action == "unsubscribe_logs":
            assert task_id is not None
            if not await self.logs.unsubscribe(task_id):
                await self.send_locked(error_message(f"Not subscribed to the logs of task '{task_id}'", task_id))
        else:
            assert task_id is not None
            await self.subscribe(task_id)

    async def subscribe(self, task_id: str) -> None:
        async with self.lock:
            if task_id not in self.watched and len(self.watched) >= MAX_SUBSCRIPTIONS:
                await self.send(error_message(
                    f"Too many subscriptions on this connection (at most {MAX_SUBSCRIPTIONS}); "
                    "unsubscribe from some tasks first", task_id))
                return
            already = task_id in self.watched
            # Start matching and take the in-memory state in one synchronous step (no gap).
            self.watched.add(task_id)
            live = self.services.engine.live_state(task_id)
            try:
                task = await self.services.tasks.get(GetTask(task_id_text(task_id)), self.ctx)
                if task is None:
                    raise task_not_found(task_id)
            except Exception as exc:
                refused = exc if isinstance(exc, RpcError) else database_unavailable(exc)
                if not already:
                    self.watched.discard(task_id)
                if refused is None:
                    raise
                await self.send(refusal_message(refused, task_id))
                return
            if live is not None:
                task = {**task, **live}
            await self.send(snapshot_message(task))


async def _endpoint(websocket: WebSocket, services: WsServices) -> None:
    try:
        caller = authenticate(websocket.headers, websocket.cookies, services.settings)
    except AuthError as exc:
        await deny_handshake(websocket, exc)
        return
    await websocket.accept()
    ctx = CallContext(caller=caller, surface="ws")
    try:
        await Session(websocket, services, ctx).run()
    except WebSocketDisconnect:
        pass
    except Exception:  # a broken connection must never take anything else down
        log.exception("WebSocket session failed")


def ws_route(services: WsServices) -> WebSocketRoute:
    async def endpoint(websocket: WebSocket) -> None:
        await _endpoint(websocket, services)

    return WebSocketRoute("/ws", endpoint)
