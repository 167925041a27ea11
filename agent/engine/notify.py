"""Between instances on one PostgreSQL database: events and cancel requests over LISTEN/NOTIFY.

Each instance publishes its engine events on the bus of every other instance, so a WebSocket or
GraphQL subscriber connected to instance B sees a tree that instance A executes, and a cancel
received by B stops the work on A. Events are sent in batches (one NOTIFY per engine pass);
PostgreSQL caps a payload near 8000 bytes, so large results are left out of remote events
(`result_omitted: true`) — subscribers read them with tasks.get.

Nothing is sent while no other instance listens (a lone instance would only hear its own
messages back): every instance's listening connection is named LISTENER_NAME, the sender counts
the others' in pg_stat_activity every PEER_CHECK_SECONDS, and an instance that starts listening
says so on the channel at once (`hello`), so the others send to it from its first request on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from taskgrove.agent.engine.bus import Event, EventBus
from taskgrove.storage import statements
from taskgrove.storage.jsonvalues import dumps_bytes
from taskgrove.storage.outage import recognise

log = logging.getLogger(__name__)
CHANNEL = "taskgrove"
MAX_PAYLOAD = 7500
LISTENER_NAME = "taskgrove-listener"  # the application_name of every instance's listening connection
PEER_CHECK_SECONDS = 1.0
# Other instances listening: named so, or (an older instance) whose last statement was the LISTEN
# (statements.COUNT_LISTENERS takes both).
LISTEN_TEXT = f'LISTEN "{CHANNEL}"'


def asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


class PgNotifier:
    def __init__(self, dsn: str, instance_id: str, bus: EventBus,
                 on_cancel: Callable[[str], Coroutine[Any, Any, None]], on_event: Callable[[Event], None]) -> None:
        self.dsn = dsn
        self.instance_id = instance_id
        self.bus = bus
        self.on_cancel = on_cancel
        self.on_event = on_event
        self._outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=10_000)
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()
        self._own = _wrap(instance_id, [])[:-len("[]}")]  # how every payload we send begins
        self.peers = True  # another instance listens (until the first count says otherwise)
        self._listener_pid: int | None = None
        self.sent = self.skipped = 0  # batches, for tests and a curious operator

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="taskgrove-listen"),
                       asyncio.create_task(self._send(), name="taskgrove-notify")]
        await asyncio.wait_for(self.ready.wait(), 10)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- outgoing -------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        self._queue(_small({"kind": "event", "event": event}))

    def cancel(self, task_id: str) -> None:
        self._queue(_text({"kind": "cancel", "task_id": task_id}))

    def refresh(self, tree_id: str) -> None:
        """Another instance joined the execution of `tree_id`: its owner re-reads it."""
        self._queue(_text({"kind": "refresh", "tree_id": tree_id}))

    def _queue(self, message: str) -> None:
        """`message` is encoded already: once, when it was made (the event may change later).
        Dropped while no other instance listens."""
        if not self.peers:
            self.skipped += 1
            return
        try:
            self._outbox.put_nowait(message)
        except asyncio.QueueFull:
            log.warning("notify outbox full: a cross-instance message was dropped")

    async def _send(self) -> None:
        import asyncpg

        conn = None
        checked = 0.0
        try:
            while True:
                try:  # asyncio.timeout, not wait_for: see PassLoop.loop (a stop's cancel must end this)
                    async with asyncio.timeout(PEER_CHECK_SECONDS):
                        batch = [await self._outbox.get()]
                except TimeoutError:
                    batch = []
                while not self._outbox.empty():
                    batch.append(self._outbox.get_nowait())
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(self.dsn)
                    if time.monotonic() - checked >= PEER_CHECK_SECONDS and self._listener_pid is not None:
                        self.peers = bool(await conn.fetchval(statements.COUNT_LISTENERS.form("postgresql"),
                                                              self._listener_pid, LISTENER_NAME, LISTEN_TEXT))
                        checked = time.monotonic()
                    if batch:
                        # Every payload of the batch in one statement: one round trip, not one each.
                        await conn.execute(statements.NOTIFY_ALL.form("postgresql"), CHANNEL,
                                           _payloads(self.instance_id, batch))
                        self.sent += 1
                except Exception as exc:  # whatever the connection did, the sender lives on
                    # the database away is logged once by storage/outage.py
                    log.log(logging.DEBUG if recognise(exc) else logging.WARNING,
                            "cross-instance notify failed: %s", exc)
                    if conn is not None:
                        conn.terminate()
                    conn = None
        finally:
            if conn is not None:
                conn.terminate()

    # --- incoming -------------------------------------------------------------------------

    async def _listen(self) -> None:
        import asyncpg

        while True:
            conn = None
            try:
                conn = await asyncpg.connect(self.dsn, server_settings={"application_name": LISTENER_NAME})
                await conn.add_listener(CHANNEL, self._received)
                self._listener_pid = conn.get_server_pid()
                # The others send to us from now on. Said on this connection before `ready`, not
                # queued for the sender: start() returns only once the others can hear it, so
                # events of their next request reach us (queued, it could come after them).
                await conn.execute(statements.NOTIFY_ONE.form("postgresql"), CHANNEL, _wrap(self.instance_id, [_HELLO]))
                self.ready.set()
                while not conn.is_closed():
                    await asyncio.sleep(1)
            except Exception as exc:  # (asyncpg's InterfaceError is no PostgresError) connect again
                log.log(logging.DEBUG if recognise(exc) else logging.WARNING,
                        "cross-instance listener lost its connection: %s", exc)
                await asyncio.sleep(1)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()

    def _received(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(self._own):  # our own batch, back from the channel: nothing to parse
            return
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if data.get("from") == self.instance_id:
            return
        self.peers = True  # another instance speaks, so it listens
        for message in data.get("messages", ()):
            if message.get("kind") == "event":
                event = {**message["event"], "remote": True}
                self.bus.publish(event)
                self.on_event(event)
            elif message.get("kind") == "refresh":
                self.on_event({"type": "refresh", "root_task_id": message["tree_id"]})
            elif message.get("kind") == "cancel":
                asyncio.get_running_loop().create_task(self.on_cancel(message["task_id"]))


def _text(message: dict[str, Any]) -> str:
    try:
        return dumps_bytes(message).decode("utf-8")
    except TypeError:  # a value JSON has no form for: its text, as before
        return json.dumps(message, default=str)


def _small(message: dict[str, Any]) -> str:
    """An event message as text, its large fields left out when it would not fit a payload."""
    text = _text(message)
    if len(text) <= MAX_PAYLOAD - 200:
        return text
    event = message["event"]
    return _text({**message, "event": {**{k: v for k, v in event.items() if k not in ("result", "error", "message")},
                                       "result_omitted": True}})


def _payloads(instance_id: str, batch: list[str]) -> list[str]:
    """Pack messages into as few NOTIFY payloads as fit under PostgreSQL's limit."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for text in batch:
        if current and size + len(text) > MAX_PAYLOAD:
            out.append(_wrap(instance_id, current))
            current, size = [], 0
        current.append(text)
        size += len(text) + 1
    if current:
        out.append(_wrap(instance_id, current))
    return out


def _wrap(instance_id: str, messages: list[str]) -> str:
    return f'{{"from": {json.dumps(instance_id)}, "messages": [{",".join(messages)}]}}'


_HELLO = _text({"kind": "hello"})  # a new listener's first message: the others start sending to it
