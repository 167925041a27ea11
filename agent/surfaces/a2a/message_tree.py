"""From an A2A message to the task tree it executes, decided before the SDK creates its task.

SPEC.md wants the agent task's `context_id` to be the root task id, and the SDK fixes the context
id before the executor runs. So the tree is created (or found, or copied) here, in the SDK's
request-context builder step: its root id becomes the context id, and a bad tree is answered as a
JSON-RPC error instead of a failed agent task.

The same step reads what a message means: a tree as data (without an LLM, also a text part whose
whole text is that JSON object), a stored tree by `metadata.task_id`, or (with an LLM) a
plain-language requirement planned by agent.surfaces.a2a.plain_language; and, for a task waiting
in `input-required`, the follow-up: the answer to the wait of a task of its tree
(agent.surfaces.a2a.input_required), and when that wait is a plan's approval gate, what approves, replaces
or refines the plan. Every part must be one of
those (ContentTypeNotSupportedError otherwise); a task in any other state takes no further
message (UnsupportedOperationError).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from a2a.server.agent_execution import RequestContext, RequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import Message, SendMessageRequest, Task, TaskState
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.surfaces.a2a.caller_context import PUSH_KEY, call_of, wire_for
from taskgrove.agent.surfaces.a2a.card import llm_configured
from taskgrove.agent.surfaces.a2a.input_required import ANSWER_KEY, Answer, InputWait, read_answer, waits_for_input
from taskgrove.agent.surfaces.a2a.plain_language import (
    GATE_ANSWER,
    REPLY_HINT,
    decision,
    gate_id,
    gated,
    plan_tree,
    requirement_asked,
    requirement_of,
    rooted_at,
    texts_of,
    wants_plan_only,
)
from taskgrove.agent.surfaces.a2a.push import PushConfigError, PushTarget, PushTargets, check_url, parse_target
from taskgrove.agent.surfaces.a2a.tree_cancel import discard_tree
from taskgrove.agent.surfaces.a2a.wire import message_data, restore_ints
from taskgrove.agent.foundations.errors import PERMISSION_DENIED, QuotaExceeded, RpcError
from taskgrove.agent.services.idempotent import HEADER as IDEMPOTENCY_HEADER
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.storage import jsonvalues
from taskgrove.storage.status import TaskStatus

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

STREAMING_METHODS = frozenset({"SendStreamingMessage", "message/stream"})
PUSH_METADATA_KEY = "push_notification_config"


@dataclass
class TreePlan:
    """What one agent task executes, and the numbers its status messages report."""

    task_id: str  # the task handed to the engine: the root of a new tree, or the named/copied one
    root_task_id: str  # the tree's root = the agent task's context id
    task_count: int
    user_id: str | None
    original_task_id: str | None = None
    stream: bool = False  # report every engine event as a status update
    # Planned from text: the plan shown as an artifact.
    planned: list[dict[str, Any]] | None = None
    # A follow-up on a tree waiting for input: answer the wait, then follow the tree (no new execution).
    answer: Answer | None = None
    # The data part named a tree already stored with the same ids and content: the message was sent
    # again (its sender was cut off before it saw the answer). Its execution is followed, not started.
    resent: bool = False
    # Per-execution context for executors (user, LLM key of the request); never stored.
    call: dict[str, Any] = field(default_factory=dict, repr=False)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"protocol": "a2a", "root_task_id": self.root_task_id}
        if self.user_id is not None:
            meta["user_id"] = self.user_id
        if self.original_task_id is not None:
            meta["original_task_id"] = self.original_task_id
        return meta


class TreeRequestContext(RequestContext):
    """The SDK's request context plus our plan, handed to TaskTreeAgentExecutor.execute."""

    def __init__(self, *args: Any, plan: TreePlan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan


def request_metadata(params: SendMessageRequest) -> dict[str, Any]:
    """Message metadata, overridden by request metadata (both places are used by clients)."""
    merged: dict[str, Any] = {}
    if params.message.HasField("metadata"):
        merged.update(MessageToDict(params.message.metadata))
    if params.HasField("metadata"):
        merged.update(MessageToDict(params.metadata))
    return restore_ints(merged)


def push_requested(params: SendMessageRequest, context: ServerCallContext) -> bool:
    """A push config anywhere in the request makes the execution asynchronous (SPEC.md rule 1)."""
    return (
        params.configuration.HasField("task_push_notification_config")
        or bool(context.state.get(PUSH_KEY))
        or PUSH_METADATA_KEY in request_metadata(params)
    )


def tasks_in(message: Message) -> Any:
    """The `tasks` of the first data part that carries them (`{tasks: [...]}` or a bare array)."""
    for part in message.parts:
        if not part.HasField("data"):
            continue
        value = restore_ints(MessageToDict(part.data))
        if isinstance(value, Mapping) and "tasks" in value:
            return value["tasks"]
        if isinstance(value, list):
            return value
    return None


ACCEPTED = 'a data part {"tasks": [task objects]} (application/json)'
ACCEPTED_AS_TEXT = "or a text part whose whole text is that JSON object"


def tasks_in_text(message: Message) -> tuple[int, Any] | None:
    """(index, tasks) of the first text part whose whole text is a JSON object with `tasks`.

    LLM-driven agents (and frameworks such as ADK, whose messages are text) often send the tree
    as JSON text. Without an LLM there is nothing else such a text could mean, so it is read as
    the data part it stands for; with an LLM the text is a requirement like any other. The text
    passes the same JSON gate as a request body (depth, NaN, overflowing numbers)."""
    for index, part in enumerate(message.parts):
        text = part.text.strip() if part.WhichOneof("content") == "text" else ""
        if not text.startswith("{"):
            continue
        where = f"message.parts[{index}].text"
        try:
            value = jsonvalues.loads(text, what=where).value
        except jsonvalues.JsonTextError:
            continue  # not JSON: plain text, refused below with what is accepted
        if isinstance(value, dict) and "tasks" in value:
            found = jsonvalues.problem(value, where)
            if found is not None:
                raise InvalidParamsError(message=found)
            return index, value["tasks"]
    return None


def check_parts(message: Message, *, text_allowed: bool, planner: bool = False,
                data_text: int | None = None) -> None:
    """Every part must be one this agent reads; anything else is ContentTypeNotSupportedError (-32005).

    A part is never skipped silently: a file beside a tasks part would be work the caller thinks
    was sent and the agent never saw. The one exception is a text part beside `metadata.task_id`
    (a message needs a part, and the tree to run is named in the metadata): it stays in history.
    `data_text` is the index of a text part read as the data part (tasks_in_text).
    """
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "data" or (kind == "text" and text_allowed) or index == data_text:
            continue
        shown = {"text": "a text part", "raw": "a raw (bytes) part", "url": "a file (url) part"}.get(
            kind or "", "an empty part")
        media = f" of media type {part.media_type}" if part.media_type else ""
        accepted = f"{ACCEPTED} or text parts (a plain-language requirement, planned into a tree)" if planner \
            else f"{ACCEPTED} {ACCEPTED_AS_TEXT} (other text needs an LLM configured on the service)"
        beside = " beside a tree given as data: send one or the other" if kind == "text" and planner else ""
        raise ContentTypeNotSupportedError(
            message=f"message.parts[{index}] is {shown}{media}{beside}; this agent accepts {accepted}")


def stream_key(context: ServerCallContext, call: CallContext) -> str | None:
    """The Idempotency-Key of a streaming send, if any. A non-streaming send with one is answered
    whole, once, before the SDK sees it (agent/surfaces/a2a/routes.py _send_once); a stream's answer is
    the run it follows, so its resend is deduplicated here, where the run is planned."""
    if context.state.get("method") not in STREAMING_METHODS or call.request is None:
        return None
    return call.request.headers.get(IDEMPOTENCY_HEADER)


def _gives_value(message: Message) -> bool:
    """Whether a data part of `message` answers a wait as any wait is answered ({"value": ...})."""
    return any(isinstance(data := restore_ints(MessageToDict(p.data)), Mapping) and ANSWER_KEY in data
               for p in message.parts if p.HasField("data"))


def _run_call(call: CallContext) -> dict[str, Any]:
    """Per-execution context for executors: user and the request's LLM key (never stored), and the
    caller's trace context (stored with a new execution, agent/foundations/tracing.py)."""
    return {"user_id": call.caller.user_id, "llm_api_key": call.llm_api_key, "llm_provider": call.llm_provider,
            "traceparent": call.traceparent}


def _state_word(state: Any) -> str:
    if state is None:
        return "unknown"
    from taskgrove.executors.a2a_states import state_name

    return state_name(state)


def rpc_detail(exc: RpcError) -> str:
    """What went wrong, in the words a client reads (the error's data when it is text)."""
    return exc.data if isinstance(exc.data, str) and exc.data else exc.message


def a2a_error(exc: RpcError) -> A2AError:
    """Our service errors in the SDK's terms (the SDK renders A2AError into JSON-RPC errors).

    Permission denied maps to TaskNotFoundError, whose JSON-RPC code (-32001) is ours as well.
    """
    detail = rpc_detail(exc)
    if exc.code == PERMISSION_DENIED:
        return TaskNotFoundError(message=f"Permission denied: {detail}")
    return InvalidParamsError(message=detail)


class TreeRequestContextBuilder(RequestContextBuilder):
    def __init__(self, services: "A2AServices", push_targets: PushTargets, task_store: TaskStore) -> None:
        self._services = services
        self._push = push_targets
        self._task_store = task_store  # the SDK hands no task to the builder; follow-ups read it here

    async def build(
        self,
        context: ServerCallContext,
        params: SendMessageRequest | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        task: Task | None = None,
    ) -> RequestContext:
        if params is None:
            return RequestContext(call_context=context, task_id=task_id, context_id=context_id, task=task)
        if task_id and task is None:
            task = await self._task_store.get(task_id, context)
            if task is None:  # unknown, or another user's (the store is scoped by caller)
                raise TaskNotFoundError(message=f"Agent task {task_id} not found")
        waiting = bool(task_id) and task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if task_id and not waiting:
            state = task.status.state if task is not None else None
            raise UnsupportedOperationError(
                message=f"Agent task {task_id} is {_state_word(state)} and takes no further message: every "
                        "message executes a task tree; send a new message without taskId (metadata.task_id "
                        "runs a stored tree). Only a task in input-required (waiting for a plan's approval, "
                        "or for the input a task of its tree asks for) takes a follow-up."
            )
        call = call_of(context)
        metadata = request_metadata(params)
        extras = await self._push_extras(params, context, metadata)
        try:
            if waiting:
                assert task is not None
                plan = await self._answer(params.message, task, call)
            elif (key := stream_key(context, call)) is not None:
                plan = await self._plan_once(params, metadata, call, key)
            else:
                plan = await self._plan(params.message, metadata, call)
        except RpcError as exc:
            if isinstance(exc, QuotaExceeded):  # the SDK cannot answer it: agent/surfaces/a2a/quota.py does
                call.refusal = exc
            raise a2a_error(exc) from None
        plan.stream = (
            context.state.get("method") in STREAMING_METHODS
            or metadata.get("stream") is True
            or push_requested(params, context)
        )
        request_context = TreeRequestContext(
            call_context=context, request=params, plan=plan,
            task_id=task_id or None, task=task if task_id else None,
            context_id=task.context_id if task_id and task is not None else plan.root_task_id,
        )
        if push_requested(params, context):
            assert request_context.task_id is not None
            urls = [params.configuration.task_push_notification_config.url] \
                if params.configuration.HasField("task_push_notification_config") else []
            self._push.enable(request_context.task_id, extras, wire=wire_for(context), urls=urls,
                              traceparent=call.traceparent)
        return request_context

    async def _push_extras(self, params: SendMessageRequest, context: ServerCallContext,
                           metadata: Mapping[str, Any]) -> list[PushTarget]:
        """Headers/method from the raw body or metadata; every url checked against SSRF now."""
        extras: list[PushTarget] = list(context.state.get(PUSH_KEY) or [])
        try:
            if PUSH_METADATA_KEY in metadata:
                extras.append(parse_target(metadata[PUSH_METADATA_KEY], f"metadata.{PUSH_METADATA_KEY}"))
            urls = [e.url for e in extras if e.url]
            if params.configuration.HasField("task_push_notification_config"):
                urls.append(params.configuration.task_push_notification_config.url)
            for url in urls:
                await check_url(url, self._services.settings.allow_private_urls)
        except PushConfigError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return extras

    async def _plan(self, message: Message, metadata: Mapping[str, Any], call: CallContext) -> TreePlan:
        tasks = tasks_in(message)
        task_id = rpc_params.string(metadata, "task_id")
        planner = llm_configured(self._services.settings)
        if tasks is None and task_id is None and planner and texts_of(message):
            check_parts(message, text_allowed=True)
            return await self._from_text(requirement_of(message), wants_plan_only(metadata), call)
        data_text = None
        if tasks is None and not planner and (found := tasks_in_text(message)) is not None:
            data_text, tasks = found
        check_parts(message, text_allowed=task_id is not None and tasks is None, planner=planner,
                    data_text=data_text)
        copy_execution = rpc_params.boolean(metadata, "copy_execution", False)
        copy_children = rpc_params.boolean(metadata, "copy_children", False)
        if tasks is not None and task_id is not None:
            raise InvalidParamsError(message="Give either a data part {tasks: [...]} or metadata.task_id, not both")
        if copy_execution and task_id is None:
            raise InvalidParamsError(
                message="metadata.copy_execution needs metadata.task_id (it copies a stored tree; "
                        "it cannot be used with a data part {tasks: [...]})")
        if copy_children and not copy_execution:
            raise InvalidParamsError(message="metadata.copy_children needs metadata.copy_execution: true")
        run_call = _run_call(call)
        if tasks is not None:  # a resend (its sender was cut off) joins what the first message started
            rows, resent = await self._services.tasks.create_tree_or_resent(self._new_tree(tasks), call.caller)
            root = rows[0]
            return TreePlan(task_id=root["id"], root_task_id=root["task_tree_id"], task_count=len(rows),
                            user_id=root["user_id"], call=run_call, resent=resent)
        if task_id is None:
            raise InvalidParamsError(
                message='The message must carry a data part {"tasks": [task objects]} to create and execute '
                        "a tree, or metadata.task_id to execute a stored one")
        return await self._existing(task_id, copy_execution, copy_children, call, run_call)

    async def _plan_once(self, params: SendMessageRequest, metadata: Mapping[str, Any], call: CallContext,
                         key: str) -> TreePlan:
        """A streaming send with an Idempotency-Key: planned once per (user, key), with the rules
        of every Idempotency-Key (agent/services/idempotent.py: the same request, within
        SERVICE_IDEMPOTENCY_SECONDS; a different one is -32602). A resend (its sender was cut
        off: an a2a_agent_executor attempt that lost its lease mid-stream) gets a new agent task
        on the tree the first one made or named, joined as a resent tree is, so a stored tree
        named by metadata.task_id is not executed twice, and a text is not planned twice."""
        made: list[TreePlan] = []

        async def plan(_params: Any, _call: CallContext) -> dict[str, Any]:
            made.append(await self._plan(params.message, metadata, call))
            return {"task_id": made[0].task_id, "root_task_id": made[0].root_task_id,
                    "original_task_id": made[0].original_task_id}

        assert self._services.idempotency is not None
        first = await self._services.idempotency.once(
            "a2a.stream", plan, MessageToDict(params, preserving_proto_field_name=True), call, key)
        if made:
            return made[0]
        rows = await self._services.repo.tree(first["root_task_id"])
        if not rows:
            raise InvalidParamsError(message=f"The task tree {first['root_task_id']} the first request with this "
                                             "Idempotency-Key executed no longer exists; send it with a new key")
        root = next((r for r in rows if r["id"] == first["root_task_id"]), rows[0])
        return TreePlan(task_id=first["task_id"], root_task_id=first["root_task_id"], task_count=len(rows),
                        user_id=root["user_id"], original_task_id=first["original_task_id"],
                        call=_run_call(call), resent=True)

    async def _from_text(self, requirement: str, plan_only: bool, call: CallContext,
                         root_id: str | None = None) -> TreePlan:
        """A plan from text, stored and run at once; plan_only: behind its approval gate.

        `root_id`: a refined plan, replacing the tree of that root once planned (not before:
        a plan that fails leaves the one shown in place)."""
        tasks = await plan_tree(self._services, call, requirement, root_id)
        if plan_only:
            tasks = gated(tasks, requirement)
        if root_id is not None:
            await discard_tree(self._services, root_id)
        return await self._run_tasks(tasks, call, planned=tasks)

    async def _run_tasks(self, tasks: Any, call: CallContext, planned: list[dict[str, Any]] | None = None) -> TreePlan:
        rows = await self._services.tasks.create_tree(self._new_tree(tasks), call.caller)
        root = rows[0]
        return TreePlan(task_id=root["id"], root_task_id=root["task_tree_id"], task_count=len(rows),
                        user_id=root["user_id"], call=_run_call(call), planned=planned)

    def _new_tree(self, tasks: Any) -> NewTree:
        """The tasks of a data part `{tasks: [...]}` or a plan, read as tasks.create reads its params."""
        return NewTree.from_params({"tasks": tasks}, self._services.settings.max_tree_tasks)

    async def _decide(self, message: Message, gate: InputWait, tree_id: str, call: CallContext) -> TreePlan | Answer:
        """The caller's decision on a plan waiting for its approval: approve answers the gate
        (the executor gives the answer); replace and refine store a new tree in place of the plan."""
        what, value = decision(message)
        if what == "approve":
            return Answer(gate, call, value=GATE_ANSWER)
        if what == "replace":
            tasks = rooted_at(self._checked(value, call), tree_id)
            await discard_tree(self._services, tree_id)
            return await self._run_tasks(tasks, call)
        if what == "refine":
            requirement = f"{requirement_asked(gate.prompt)}\n\nChanges asked for after seeing the plan: {value}"
            return await self._from_text(requirement, True, call, root_id=tree_id)
        return Answer(gate, call, problem="the plan is waiting for a decision: " + REPLY_HINT)

    def _checked(self, tasks: Any, call: CallContext) -> list[dict[str, Any]]:
        """A replacing tree, validated before the plan it replaces goes; its tasks need ids (or
        be one task), so that its root can take the plan's root id."""
        self._services.tasks.prepare(self._new_tree(tasks), call.caller)
        listed = tasks if isinstance(tasks, list) else [tasks]
        if len(listed) > 1 and not all(isinstance(t, Mapping) and t.get("id") for t in listed):
            raise InvalidParamsError(message="A tree replacing a plan needs an id on every task")
        return [dict(t) for t in listed]

    async def _answer(self, message: Message, task: Task, call: CallContext) -> TreePlan:
        """The caller's answer to a tree waiting for input: read here, given by the executor."""
        check_parts(message, text_allowed=True)
        tree_id = task.context_id
        rows = await self._services.repo.tree(tree_id)
        if not rows:
            raise InvalidParamsError(message=f"Task tree {tree_id} of this agent task no longer exists")
        root = next((r for r in rows if r["id"] == tree_id), rows[0])
        if not call.caller.can_access(root["user_id"]):
            raise TaskNotFoundError(message=f"Permission denied: only the owner or an admin may answer tree {tree_id}")
        shown = message_data(task.status.message) if task.status.HasField("message") else None
        answer = read_answer(message, waits_for_input(rows), call, shown)
        if answer.wait is not None and answer.wait.task_id == gate_id(tree_id) and not _gives_value(message):
            decided = await self._decide(message, answer.wait, tree_id, call)
            if isinstance(decided, TreePlan):
                return decided
            answer = decided
        return TreePlan(task_id=root["id"], root_task_id=tree_id, task_count=len(rows), user_id=root["user_id"],
                        call=_run_call(call), answer=answer)

    async def _existing(self, task_id: str, copy_execution: bool, copy_children: bool, call: CallContext,
                        run_call: dict[str, Any]) -> TreePlan:
        repo = self._services.repo
        row = await repo.get(task_id)
        if row is None:
            raise InvalidParamsError(message=f"Task '{task_id}' not found")
        if not call.caller.can_access(row["user_id"]):
            raise TaskNotFoundError(message=f"Permission denied: you may not execute task '{task_id}'")
        original = None
        if copy_execution:
            copies = await self._services.tasks.copy_tree(task_id, copy_children, call.caller)
            original, task_id = task_id, {c["original_task_id"]: c["id"] for c in copies}[task_id]
            row = await repo.get(task_id)
            assert row is not None
        if row["origin_type"] == "archive":
            raise InvalidParamsError(message=f"Task '{task_id}' is an archive (read-only) and cannot be executed")
        if row["status"] == TaskStatus.IN_PROGRESS or task_id in self._services.engine.running:
            raise InvalidParamsError(message=f"Task '{task_id}' is already running")
        tree_id = row["task_tree_id"]
        count = len(await repo.tree(tree_id))
        return TreePlan(task_id=task_id, root_task_id=tree_id, task_count=count, user_id=row["user_id"],
                        original_task_id=original, call=run_call)
