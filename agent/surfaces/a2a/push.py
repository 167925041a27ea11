"""Push notifications of agent tasks, in the shape of the wire the config came in, with its headers and method.

A config set through the A2A 1.0 wire (`SendMessage`, `CreateTaskPushNotificationConfig`, ...) gets
1.0 bodies: a StreamResponse in ProtoJSON (`{"statusUpdate": {...}}`, `{"artifactUpdate": {...}}`,
`TASK_STATE_*`), what a 1.0 webhook receiver parses. A config from the 0.3 wire or our own
`tasks.execute` keeps SPEC.md's event shape (`kind: status-update`, lowercase states, snake keys
beside camelCase) and gets artifact updates in the 0.3 form (`kind: artifact-update`).

The SDK's own sender posts with POST only, and its push config has no `headers` or `method` (the
0.3 compat layer drops them). So we keep two sources per agent task: the standard config in the
SDK's push-config store (url, token, credentials) and the extras the request carried (`headers`,
`method`, possibly a url of their own), merged by url at send time.

Delivery runs in one worker per agent task, so notifications keep their order (the final one
last) and a slow receiver never holds up the task's event stream. Every URL is checked against
SSRF (`executors.netguard`) when the config is accepted and again before each post.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from a2a.server.tasks import PushNotificationConfigStore, PushNotificationEvent, PushNotificationSender
from a2a.types.a2a_pb2 import Task, TaskArtifactUpdateEvent, TaskPushNotificationConfig, TaskStatusUpdateEvent
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.surfaces.a2a.envelope import WIRE_0_3, WIRE_1_0
from taskgrove.agent.surfaces.a2a.wire import TERMINAL_STATES, event_json, message_data, restore_ints
from taskgrove.executors.a2a_states import state_name
from taskgrove.agent.engine.webhooks import post_with_retries
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url

log = logging.getLogger(__name__)
METHODS = ("POST", "PUT", "PATCH")
TOKEN_HEADER = "X-A2A-Notification-Token"


class PushConfigError(ValueError):
    """A push notification config the service will not use; the message says why."""


@dataclass(frozen=True)
class PushTarget:
    """Where and how to post. `url=None` (extras only) applies to the standard config's url."""

    url: str | None
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"
    wire: str = WIRE_0_3  # the body shape this receiver expects


def parse_target(raw: Any, where: str) -> PushTarget:
    """`{url?, headers?, method?}` as SPEC.md's `push_notification_config` gives it."""
    if not isinstance(raw, Mapping):
        raise PushConfigError(f"{where} must be an object with url, headers and method")
    url = raw.get("url")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise PushConfigError(f"{where}.url must be an http:// or https:// URL")
    headers = raw.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise PushConfigError(f"{where}.headers must be an object of string values")
    method = raw.get("method") or "POST"
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise PushConfigError(f"{where}.method must be one of {', '.join(METHODS)}, got {method!r}")
    return PushTarget(url=url, headers=dict(headers), method=method.upper())


async def check_url(url: str, allow_private: bool) -> None:
    try:
        await ensure_public_url(url, allow_private)
    except UnsafeURLError as exc:
        raise PushConfigError(f"push notification url refused: {exc}") from None


def merge_targets(configs: Iterable[TaskPushNotificationConfig], extras: Iterable[PushTarget],
                  wires: Mapping[str | None, str] | None = None) -> list[PushTarget]:
    """Standard configs (token and credentials become headers) merged with the request's extras.

    `wires` maps a config url (or None: any url) to the wire it was set through.
    """
    wires = wires or {}
    extras = list(extras)
    by_url = {e.url: e for e in extras if e.url}
    general = next((e for e in extras if e.url is None), None)
    targets: list[PushTarget] = []
    for config in configs:
        headers: dict[str, str] = {}
        if config.token:
            headers[TOKEN_HEADER] = config.token
        auth = config.authentication
        if config.HasField("authentication") and auth.scheme and auth.credentials:
            headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        extra = by_url.pop(config.url, None) or general
        method = "POST"
        if extra is not None:
            headers.update(extra.headers)
            method = extra.method
        wire = wires.get(config.url) or wires.get(None) or WIRE_0_3
        targets.append(PushTarget(url=config.url, headers=headers, method=method, wire=wire))
    targets.extend(PushTarget(url=e.url, headers=e.headers, method=e.method,
                              wire=wires.get(e.url) or wires.get(None) or e.wire) for e in by_url.values())
    return targets


def is_final(event: PushNotificationEvent) -> bool:
    """The last notification of an agent task: its terminal status."""
    status = getattr(event, "status", None)
    return status is not None and status.state in TERMINAL_STATES


def push_payload(event: PushNotificationEvent, wire: str) -> dict[str, Any] | None:
    """The body posted for one task event, in the receiver's wire (see the module docstring)."""
    if wire == WIRE_1_0:
        return restore_ints(MessageToDict(to_stream_response(event), preserving_proto_field_name=False))
    if isinstance(event, TaskArtifactUpdateEvent):  # never the last one: the final status follows
        return {**event_json(event), "final": False}
    return spec_payload(event)


def spec_payload(event: PushNotificationEvent) -> dict[str, Any] | None:
    """SPEC.md's payload: task_id, context_id, status{state, message{role, parts}}, final."""
    if isinstance(event, Task):
        task_id, status = event.id, event.status
    elif isinstance(event, TaskStatusUpdateEvent):
        task_id, status = event.task_id, event.status
    else:
        return None
    state = state_name(status.state)
    message: dict[str, Any] = {"kind": "message", "role": "agent", "parts": []}
    if status.HasField("message"):
        message["message_id"] = message["messageId"] = status.message.message_id
        message["parts"] = [{"kind": "data", "data": message_data(status.message)}]
    payload_status: dict[str, Any] = {"state": state, "message": message}
    if status.HasField("timestamp"):
        payload_status["timestamp"] = status.timestamp.ToJsonString()
    return {
        "kind": "status-update",
        "task_id": task_id,
        "taskId": task_id,
        "context_id": event.context_id,
        "contextId": event.context_id,
        "status": payload_status,
        "final": status.state in TERMINAL_STATES,
    }


class PushTargets:
    """Agent tasks that want notifications, with the extras their request carried."""

    def __init__(self) -> None:
        self._extras: dict[str, list[PushTarget]] = {}
        # task id -> {config url (None: the task's default) -> wire}
        self._wires: dict[str, dict[str | None, str]] = {}
        # task id -> the `traceparent` of the request that asked for notifications (sent with them)
        self._traces: dict[str, str] = {}

    def enable(self, task_id: str, extras: Iterable[PushTarget] = (), *, wire: str = WIRE_0_3,
               urls: Iterable[str] = (), traceparent: str | None = None) -> None:
        """Notify for `task_id`; configs with `urls` (and extras) were set through `wire`.
        `traceparent`: the caller's trace context, sent with every notification (docs/observability.md)."""
        if traceparent:
            self._traces[task_id] = traceparent
        extras = list(extras)
        self._extras.setdefault(task_id, []).extend(extras)
        wires = self._wires.setdefault(task_id, {})
        wires.setdefault(None, wire)
        for url in [*urls, *(e.url for e in extras if e.url)]:
            wires[url] = wire

    def wires(self, task_id: str) -> dict[str | None, str]:
        return dict(self._wires.get(task_id, {}))

    def enabled(self, task_id: str) -> bool:
        return task_id in self._extras

    def extras(self, task_id: str) -> list[PushTarget]:
        return list(self._extras.get(task_id, ()))

    def traceparent(self, task_id: str) -> str | None:
        return self._traces.get(task_id)

    def forget(self, task_id: str) -> None:
        self._extras.pop(task_id, None)
        self._wires.pop(task_id, None)
        self._traces.pop(task_id, None)


class SpecPushSender(PushNotificationSender):
    """The SDK calls `send_notification` for every task event; we queue and post in order."""

    def __init__(self, config_store: PushNotificationConfigStore, targets: PushTargets, *,
                 allow_private: bool, timeout: float = 10.0, max_retries: int = 3) -> None:
        self._config_store = config_store
        self._targets = targets
        self._allow_private = allow_private
        self._timeout = timeout
        self._max_retries = max_retries
        self._client: httpx.AsyncClient | None = None
        self._queues: dict[str, asyncio.Queue[PushNotificationEvent]] = {}
        self._workers: set[asyncio.Task[None]] = set()

    async def send_notification(self, task_id: str, event: PushNotificationEvent) -> None:
        if not self._targets.enabled(task_id):
            return
        if not isinstance(event, (Task, TaskStatusUpdateEvent, TaskArtifactUpdateEvent)):
            return
        queue = self._queues.get(task_id)
        if queue is None:
            queue = self._queues[task_id] = asyncio.Queue()
            worker = asyncio.create_task(self._deliver(task_id, queue), name=f"a2a-push-{task_id}")
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        snapshot = type(event)()  # the SDK keeps changing its task object after this call
        snapshot.CopyFrom(event)
        queue.put_nowait(snapshot)

    async def _deliver(self, task_id: str, queue: asyncio.Queue[PushNotificationEvent]) -> None:
        try:
            while True:
                event = await queue.get()
                try:
                    configs = await self._config_store.get_info_for_dispatch(task_id)
                except Exception:
                    log.exception("reading push configs of agent task %s failed", task_id)
                    configs = []
                for target in merge_targets(configs, self._targets.extras(task_id), self._targets.wires(task_id)):
                    try:
                        payload = push_payload(event, target.wire)
                        if payload is not None:
                            await self._post(task_id, target, payload)
                    except Exception:  # one bad notification must not end the task's later ones
                        log.exception("push notification for agent task %s to %s failed", task_id, target.url)
                if is_final(event):
                    return
        finally:
            self._queues.pop(task_id, None)
            if queue.empty():
                self._targets.forget(task_id)

    async def _post(self, task_id: str, target: PushTarget, payload: dict[str, Any]) -> None:
        assert target.url is not None
        try:
            await ensure_public_url(target.url, self._allow_private)
        except UnsafeURLError as exc:
            log.warning("push notification for agent task %s not sent: %s", task_id, exc)
            return
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)
        traceparent = self._targets.traceparent(task_id)
        headers = {**target.headers, "traceparent": traceparent} if traceparent else target.headers
        await post_with_retries(self._client, target.method, target.url, payload, headers,
                                max_retries=self._max_retries)

    async def aclose(self) -> None:
        """Stop undelivered notifications and close the HTTP client (service shutdown)."""
        for worker in list(self._workers):
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

