"""The talking part of a2a_agent_executor (executors/a2a.py), loaded when such a task first runs.

The official `a2a-sdk` client does the talking, so any A2A agent (1.0, or 0.3 through the SDK's
compat transport) can be driven, including another taskgrove: send `data: {"tasks": [...]}` and
the remote service creates and runs that tree.

How a run goes:

1. `agent_url` (a base URL, or the agent card's own URL) passes the SSRF guard, then the card is
   fetched. Every request (card, JSON-RPC calls, redirects, and the interface URL the card names)
   goes through one httpx client whose request hook repeats the guard, so a public card cannot
   point the client at a private address. Every answer passes executors/a2a_lenient.py before
   the SDK parses it (a timestamp without an offset read as UTC, unknown states tolerated); what
   still cannot be parsed fails the task naming the field, never with the parser's text. A task
   answered `submitted`, or a stream that ends early, is polled until it ends.
2. The message (a text part from `message`, a data part from `data`) is sent:
   - streaming (default when the card says the agent streams): the remote task arrives first,
     then status and artifact updates until the final state;
   - not streaming: the message is sent with `returnImmediately` (0.3: `blocking: false`) and the
     task is polled with tasks/get every `poll_interval` seconds, so progress is relayed and a
     cancel can reach the remote task (an agent that answers only when done is fine too);
   - `blocking: false`: the executor returns as soon as the agent accepted the message, with the
     remote task id and its state at that moment (usually `working`).
3. The `progress` of each status message's data part becomes this task's progress.
4. The result is the remote task's final state, its artifacts and ids (see `_outcome`). A remote
   `failed` or `rejected` state or a remote cancel fails this task with the remote agent's message.
   A state that asks (`input-required`, `auth-required`) parks this task on a durable wait, answered
   with tasks.respond (executors/a2a_questions.py); only `blocking: false` returns it as it is.

`cancel()` cancels the remote task (tasks/cancel), closes the client and returns what is known so
far as the partial result. The whole exchange is bounded by `timeout`; when it expires the remote
task is cancelled too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict, ParseError
from pydantic import ValidationError

from taskgrove.executors.a2a_lenient import LenientTransport
from taskgrove.executors.a2a_questions import RemoteQuestions
from taskgrove.executors.a2a_states import state_name
from taskgrove.executors.agent_delegation import DIRECTORY_NAME
from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.executors.card_trust import card_check
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url, redact_url, request_guard
from taskgrove.executors.struct_values import restore_ints
from taskgrove.executors import tls

log = logging.getLogger(__name__)

TERMINAL = frozenset({
    TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED,
})
# The remote agent waits for an answer: the exchange pauses there (a wait, executors/a2a_questions.py).
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
FAILED = frozenset({TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED})

# The engine gives cancel() 5 s in all (CANCEL_HOOK_TIMEOUT); these stay inside it.
ID_WAIT = 1.5  # a send still in flight: how long to wait for the remote task id
REMOTE_CANCEL_TIMEOUT = 3.0  # tasks/cancel round trip
# After cancel() the execute coroutine waits this long to be cancelled by the engine rather than
# finishing on its own (a late "failed" or "completed" must not race the cancelled status).
LINGER = 15.0
CONNECT_TIMEOUT = 30.0
# Keys whose values are fractions: a whole 1.0 stays a float there (see struct_values).
_FLOAT_KEYS = frozenset({"progress", "tree_progress", "task_progress"})


def message_id(context: ExecutionContext) -> str:
    """The message's id: the same for every re-run of an interrupted attempt, as its
    `Idempotency-Key` header is (context.idempotency_key), so that a resend of a message the
    cut-off attempt may have sent is the same request: a taskgrove agent then answers it with the
    agent task or tree the first one started (docs/a2a.md), and any agent may recognise it."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "taskgrove-a2a-message:" + context.idempotency_key).hex


def part_json(part: Part) -> dict[str, Any]:
    """One part as plain JSON, in the 0.3 shape: `{kind: text|data|file, ...}`."""
    out: dict[str, Any]
    content = part.WhichOneof("content")
    if content == "text":
        out = {"kind": "text", "text": part.text}
    elif content == "data":
        out = {"kind": "data", "data": restore_ints(MessageToDict(part.data), _FLOAT_KEYS)}
    elif content == "url":
        out = {"kind": "file", "url": part.url}
    elif content == "raw":
        out = {"kind": "file", "bytes": MessageToDict(part)["raw"]}  # base64, as ProtoJSON sends it
    else:
        out = {"kind": "unknown"}
    if part.filename:
        out["filename"] = part.filename
    if part.media_type:
        out["media_type"] = part.media_type
    if part.HasField("metadata"):
        out["metadata"] = restore_ints(MessageToDict(part.metadata), _FLOAT_KEYS)
    return out


def artifact_json(artifact: Artifact) -> dict[str, Any]:
    out: dict[str, Any] = {"artifact_id": artifact.artifact_id, "name": artifact.name,
                           "parts": [part_json(p) for p in artifact.parts]}
    if artifact.description:
        out["description"] = artifact.description
    if artifact.HasField("metadata"):
        out["metadata"] = restore_ints(MessageToDict(artifact.metadata), _FLOAT_KEYS)
    return out


def message_text(message: Message) -> str:
    return "\n".join(p.text for p in message.parts if p.HasField("text")).strip()


def message_data(message: Message) -> dict[str, Any]:
    """The first object-valued data part of a message, or {}."""
    for part in message.parts:
        if part.HasField("data"):
            value = restore_ints(MessageToDict(part.data), _FLOAT_KEYS)
            if isinstance(value, dict):
                return value
    return {}


def _card_location(url: str) -> tuple[str, str | None]:
    """(base URL, card path) for the card resolver.

    A URL whose path is a card (`.../.well-known/...` or `....json`) is fetched as it is; any
    other URL is a base URL whose card is at `<url>/.well-known/agent-card.json`.
    """
    parts = urlsplit(url)
    path = parts.path
    if "/.well-known/" in path or path.endswith(".json"):
        base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        return base, path + (f"?{parts.query}" if parts.query else "")
    return url.rstrip("/"), None


def _error_text(exc: BaseException) -> str:
    """The error's first line (httpx appends a documentation link on a second one)."""
    text = str(getattr(exc, "message", None) or str(exc) or type(exc).__name__).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _parser_text(exc: ParseError | ValidationError) -> str:
    """What a parser refused, in one line: the field and the reason, without library wording
    (`Failed to parse status field: ... at StreamResponse.task.status.timestamp.` becomes
    `task.status.timestamp: ...`), so the task's error says what the agent got wrong."""
    if isinstance(exc, ValidationError):
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in exc.errors()[:3]]
        return "; ".join(problems)
    text = _error_text(exc)
    reason, _, where = text.rpartition(" at ")
    innermost = (reason or text).rsplit(": ", 1)[-1]  # past the parser's "Failed to parse X field: " prefixes
    field = where.rstrip(".").split(".", 1)[-1] if reason else ""
    return f"{field}: {innermost}" if field else innermost


class RemoteAgentCall(RemoteQuestions, Executor):
    """One run of a2a_agent_executor (executors/a2a.py holds the registered class, which delegates
    here): the message sent, the remote task followed, its outcome returned; a question of the
    remote task is a durable wait (RemoteQuestions, executors/a2a_questions.py)."""

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._http: httpx.AsyncClient | None = None
        self._client: Client | None = None
        self._card: AgentCard | None = None
        self._url = ""
        self._directory_name: str | None = None  # the agent's name in the directory, when delegated by it
        self._task: Task | None = None  # the remote task as last seen
        self._artifacts: dict[str, Artifact] = {}  # by artifact id, in arrival order
        self._reply: Message | None = None  # an agent may answer with a message instead of a task
        self._known = asyncio.Event()  # set once the remote task id is known
        self._cancelled = False
        self._closed = False
        self._last_progress: float | None = None
        self._remembered = False  # the remote task id is in this task's checkpoint

    # --- execute --------------------------------------------------------------------------

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        try:
            result = await self._execute(inputs, context)
        except asyncio.CancelledError:
            if not self._cancelled:  # stopped without cancel() (e.g. shutdown): do not orphan the remote task
                await self._cancel_remote()
            raise
        except BaseException:
            if self._cancelled:
                await self._linger()
            raise
        finally:
            if not self._cancelled:
                await self._close()
        if self._cancelled:
            await self._linger()
        return result

    async def _execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        url = str(inputs.get("agent_url") or "").strip()
        if not url:
            raise ExecutorError("agent_url is required")
        self._url = redact_url(url)
        self._directory_name = inputs.get(DIRECTORY_NAME) if isinstance(inputs.get(DIRECTORY_NAME), str) else None
        if inputs.get("message") is None and inputs.get("data") is None:
            raise ExecutorError("give message (text) and/or data (object) to send to the agent")
        timeout = float(inputs.get("timeout", 300))
        poll_interval = float(inputs.get("poll_interval", 0.5))
        blocking = bool(inputs.get("blocking", True))
        answer_timeout = inputs.get("answer_timeout_seconds")  # how long a remote question waits
        headers = inputs.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ExecutorError("headers must be an object of string values")
        allow_private = bool(context.settings.allow_private_urls)
        try:
            await ensure_public_url(url, allow_private)
        except UnsafeURLError as exc:
            raise ExecutorError(str(exc)) from None
        request = SendMessageRequest(message=self._message(inputs, context))
        if context.traceparent:  # traces on: the remote agent's spans join the execution's trace
            headers = {**headers, "traceparent": context.traceparent}
        if not any(name.lower() == "idempotency-key" for name in headers):
            headers = {**headers, "Idempotency-Key": context.idempotency_key}

        # trust_env=False: no proxy or .netrc credentials from the service's environment.
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
            follow_redirects=True,
            event_hooks={"request": [request_guard(allow_private)]},
            trust_env=False,
            # tolerated deviations put right before the SDK parses
            transport=LenientTransport(httpx.AsyncHTTPTransport(verify=tls.shared_context(trust_env=False),
                                                                 trust_env=False)),
        )
        try:
            async with asyncio.timeout(timeout):
                base, card_path = _card_location(url)
                self._card = await A2ACardResolver(self._http, base).get_agent_card(
                    relative_card_path=card_path, signature_verifier=card_check(context.settings, self._url))
                streaming = inputs.get("streaming", True) is not False and self._card.capabilities.streaming
                config = ClientConfig(streaming=bool(streaming and blocking),
                                      polling=not (streaming and blocking), httpx_client=self._http)
                self._client = ClientFactory(config).create(self._card)
                if self._cancelled:
                    raise ExecutorError("cancelled before the message was sent")
                if await self._reattach(context):  # an earlier attempt had sent it: follow that task
                    if blocking and not self._finished():
                        await self._poll(context, poll_interval)
                    if blocking:
                        await self._answer_questions(context, url, bool(streaming), poll_interval, answer_timeout)
                    return self._check_outcome()
                if not blocking:
                    await self._send(request, context)
                    return self._check_outcome()
                if streaming:
                    await self._stream(request, context)
                else:
                    await self._send(request, context)
                if self._reply is None and not self._finished():
                    await self._poll(context, poll_interval)
                await self._answer_questions(context, url, bool(streaming), poll_interval, answer_timeout)
        except TimeoutError:
            if self._cancelled:
                raise ExecutorError("cancelled") from None
            cancelled = await self._cancel_remote()
            remote = f"; its task {self._remote_id()} was cancelled" if cancelled else ""
            raise ExecutorError(
                f"the A2A agent at {self._url} did not finish within {timeout:g}s{remote}") from None
        except UnsafeURLError as exc:  # a redirect or the card's interface URL is private
            raise ExecutorError(str(exc)) from None
        except A2AError as exc:
            if self._cancelled:
                raise ExecutorError("cancelled") from None
            stage = "sending the message to" if self._card is not None else "fetching the agent card of"
            raise ExecutorError(f"A2A error {stage} {self._url}: {_error_text(exc)}") from None
        except (ParseError, ValidationError) as exc:  # what the SDK's parsers refused, even after a2a_lenient
            raise ExecutorError(f"the A2A agent at {self._url} broke the protocol: {_parser_text(exc)}") from None
        except ValueError as exc:  # e.g. a card with no JSON-RPC interface: "no compatible transports found"
            raise ExecutorError(f"cannot talk to the A2A agent at {self._url}: {_error_text(exc)}") from None
        except httpx.HTTPError as exc:  # anything the SDK did not wrap
            if self._cancelled:
                raise ExecutorError("cancelled") from None
            raise ExecutorError(f"request to the A2A agent at {self._url} failed: {_error_text(exc)}") from None
        return self._check_outcome()

    def _message(self, inputs: Mapping[str, Any], context: ExecutionContext) -> Message:
        parts: list[Part] = []
        if inputs.get("message") is not None:
            parts.append(new_text_part(str(inputs["message"])))
        if inputs.get("data") is not None:
            if not isinstance(inputs["data"], dict):
                raise ExecutorError("data must be an object")
            parts.append(new_data_part(inputs["data"]))
        message = Message(role=Role.ROLE_USER, message_id=message_id(context), parts=parts)
        metadata = inputs.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise ExecutorError("metadata must be an object")
            message.metadata.update(metadata)
        return message

    async def _reattach(self, context: ExecutionContext) -> bool:
        """A later attempt (after a crash, a timeout, a lost lease) finds the remote task id the
        earlier one stored and follows that task instead of sending the work a second time. A
        remote task that was cancelled (our own shutdown cancels what it cuts off) is sent anew."""
        remote_id = (context.last_checkpoint or {}).get("remote_task_id")
        if not isinstance(remote_id, str) or not remote_id:
            return False
        assert self._client is not None
        try:
            task = await self._client.get_task(GetTaskRequest(id=remote_id))
        except A2AError:
            return False  # the agent no longer knows it: send again
        if task.status.state == TaskState.TASK_STATE_CANCELED:
            return False
        self._remembered = True
        await self._absorb(StreamResponse(task=task), context)
        return True

    async def _remember(self, context: ExecutionContext) -> None:
        """Store the remote task id as soon as it is known, for a later attempt to re-attach."""
        if not self._remembered and self._task is not None and self._task.id:
            self._remembered = True
            await context.checkpoint({"remote_task_id": self._task.id})

    async def _send(self, request: SendMessageRequest, context: ExecutionContext) -> None:
        """One non-streaming send (return immediately): the task as first reported, or a reply."""
        assert self._client is not None
        async with contextlib.aclosing(self._client.send_message(request)) as events:  # type: ignore[type-var]  # an async generator
            async for event in events:
                await self._absorb(event, context)

    async def _stream(self, request: SendMessageRequest, context: ExecutionContext) -> None:
        """A streaming send, followed to the final state (or to a reply message)."""
        assert self._client is not None
        async with contextlib.aclosing(self._client.send_message(request)) as events:  # type: ignore[type-var]  # an async generator
            async for event in events:
                await self._absorb(event, context)
                if self._reply is not None or self._finished():
                    break

    async def _poll(self, context: ExecutionContext, interval: float) -> None:
        """tasks/get until the remote task is final (also after a stream that ended early)."""
        assert self._client is not None
        if not self._known.is_set():
            raise ExecutorError(f"the A2A agent at {self._url} answered without a task or message")
        while not self._finished():
            await asyncio.sleep(interval)
            task = await self._client.get_task(GetTaskRequest(id=self._remote_id()))
            await self._absorb(StreamResponse(task=task), context)

    # --- what the remote agent reports ------------------------------------------------------

    async def _absorb(self, event: StreamResponse, context: ExecutionContext) -> None:
        kind = event.WhichOneof("payload")
        if kind == "message":
            self._reply = event.message
            return
        if kind == "task":
            task = event.task
            if self._task is None:
                self._task = Task()
            self._task.CopyFrom(task)
            if task.artifacts:  # tasks/get returns the whole list
                self._artifacts = {a.artifact_id or str(i): a for i, a in enumerate(task.artifacts)}
            status: TaskStatus | None = task.status
        elif kind == "status_update":
            update = event.status_update
            self._ensure_task(update.task_id, update.context_id)
            await self._remember(context)
            assert self._task is not None
            self._task.status.CopyFrom(update.status)
            status = update.status
        elif kind == "artifact_update":
            update_a = event.artifact_update
            self._ensure_task(update_a.task_id, update_a.context_id)
            self._add_artifact(update_a)
            return
        else:
            return
        if self._task is not None and self._task.id:
            self._known.set()
            await self._remember(context)
        if status is not None and status.HasField("message") and not self._cancelled:
            await self._relay(status, context)

    def _ensure_task(self, task_id: str, context_id: str) -> None:
        if self._task is None:
            self._task = Task(id=task_id, context_id=context_id)
        if task_id:
            self._known.set()

    def _add_artifact(self, update: TaskArtifactUpdateEvent) -> None:
        key = update.artifact.artifact_id or str(len(self._artifacts))
        existing = self._artifacts.get(key)
        if update.append and existing is not None:
            existing.parts.extend(update.artifact.parts)
        else:
            artifact = Artifact()
            artifact.CopyFrom(update.artifact)
            self._artifacts[key] = artifact

    async def _relay(self, status: TaskStatus, context: ExecutionContext) -> None:
        """The remote progress (data part `progress`) as this task's progress."""
        data = message_data(status.message)
        progress = data.get("progress")
        if isinstance(progress, bool) or not isinstance(progress, (int, float)):
            return
        progress = max(0.0, min(1.0, float(progress)))
        text = message_text(status.message) or data.get("message")
        if progress == self._last_progress and not text:
            return
        self._last_progress = progress
        note = text if isinstance(text, str) and text else state_name(status.state)
        await context.report_progress(progress, f"remote agent: {note}")

    def _finished(self) -> bool:
        return self._task is not None and self._task.status.state in TERMINAL | INTERRUPTED

    def _remote_id(self) -> str:
        return self._task.id if self._task is not None else ""

    def _outcome(self) -> dict[str, Any]:
        """The result: remote ids, final state, status message (text and data) and artifacts."""
        out: dict[str, Any] = {"agent_url": self._url,
                               "agent_name": self._card.name if self._card is not None else None}
        if self._reply is not None and (self._task is None or not self._task.id):
            reply = self._reply
            out.update(remote_task_id=reply.task_id or None, remote_context_id=reply.context_id or None,
                       state="completed", message=message_text(reply) or None, status_data=message_data(reply),
                       reply={"message_id": reply.message_id, "parts": [part_json(p) for p in reply.parts]},
                       artifacts=[])
            return out
        task = self._task or Task()
        status = task.status
        out.update(
            remote_task_id=task.id or None,
            remote_context_id=task.context_id or None,
            state=state_name(status.state),
            message=(message_text(status.message) or message_data(status.message).get("message") or None)
            if status.HasField("message") else None,
            status_data=message_data(status.message) if status.HasField("message") else {},
            artifacts=[artifact_json(a) for a in self._artifacts.values()],
        )
        return out

    def _check_outcome(self) -> dict[str, Any]:
        """The result, or ExecutorError for an end that is not a success."""
        if self._task is None or self._reply is not None:
            return self._outcome()
        state = self._task.status.state
        if state in FAILED:
            raise ExecutorError(
                f"remote A2A task {self._task.id} ended {state_name(state)}: {self._failure_message()}")
        if state == TaskState.TASK_STATE_CANCELED:
            raise ExecutorError(f"remote A2A task {self._task.id} was cancelled: {self._failure_message()}")
        if state in INTERRUPTED:
            raise ExecutorError(
                f"remote A2A task {self._task.id} is {state_name(state)} and waits for an answer this "
                f"executor cannot give: {self._failure_message()}")
        return self._outcome()

    def _failure_message(self) -> str:
        """What the remote agent said about the failure.

        The status message's text, or its data part's `message` / `error`; failing that, errors
        found in the artifacts (a taskgrove agent lists `{tasks: [{name, status, error}]}` there).
        """
        assert self._task is not None
        status = self._task.status
        if status.HasField("message"):
            if text := message_text(status.message):
                return text
            data = message_data(status.message)
            for key in ("message", "error"):
                if isinstance(data.get(key), str) and data[key]:
                    return data[key]
        found: list[str] = []
        for artifact in self._artifacts.values():
            for part in artifact.parts:
                if part.HasField("text"):
                    continue
                content = restore_ints(MessageToDict(part.data), _FLOAT_KEYS) if part.HasField("data") else None
                if not isinstance(content, dict):
                    continue
                if isinstance(content.get("error"), str) and content["error"]:
                    found.append(content["error"])
                for sub in content.get("tasks") or ():
                    if isinstance(sub, dict) and sub.get("error") and sub.get("status") != "cancelled":
                        found.append(f"{sub.get('name') or sub.get('id')}: {sub['error']}")
        return "; ".join(found) or "the agent gave no message"

    # --- cancel -----------------------------------------------------------------------------

    async def cancel(self) -> dict[str, Any] | None:
        """Cancel the remote task, close the client, and report what is known as partial result."""
        self._cancelled = True
        if self._client is not None and not self._known.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._known.wait(), ID_WAIT)
        await self._cancel_remote()
        await self._close()
        if self._task is None and self._reply is None:
            return None
        return {"result": {**self._outcome(), "cancelled": True}}

    async def _cancel_remote(self) -> bool:
        """tasks/cancel for the remote task when it is still live; True when the agent accepted."""
        if self._client is None or self._closed or not self._remote_id() or self._finished():
            return False
        try:
            task = await asyncio.wait_for(
                self._client.cancel_task(CancelTaskRequest(id=self._remote_id())), REMOTE_CANCEL_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - cancel is best effort; the reason is logged
            log.warning("cancelling remote A2A task %s at %s failed: %s", self._remote_id(), self._url,
                        _error_text(exc))
            return False
        if self._task is not None:
            self._task.status.CopyFrom(task.status)
        return True

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        client, http = self._client, self._http
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if http is not None:
            with contextlib.suppress(Exception):
                await http.aclose()

    @staticmethod
    async def _linger() -> None:
        """cancel() has run: wait for the engine to cancel this coroutine instead of finishing."""
        await asyncio.sleep(LINGER)
        raise ExecutorError("cancelled")
