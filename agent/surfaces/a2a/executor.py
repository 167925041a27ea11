"""The A2A AgentExecutor: runs the planned task tree on our engine and reports it as an agent task.

`execute` enqueues the agent task (state working, data part with the run summary), starts the
engine, and turns the engine's bus events into status updates; at the end it adds the outcome
artifact `task_results` (the root's result or error and every task's) and the final state
(completed or failed). It subscribes to the bus before starting the engine, so even a tree that
finishes instantly is seen to its `final` event. A tree planned from text also gets the artifact
`plan` first. A plan-only request stores the plan with a gate, a wait for input that every task of
the plan depends on (agent/surfaces/a2a/plain_language.py): its tree parks on the gate like any tree that
waits for input, and the agent task shows the plan beside the wait.

When a task of the tree parks on a wait for input, `execute` reports `input-required` with the wait
(agent/surfaces/a2a/input_required.py) and returns: the SDK runs one request of an agent task at a time, so
the follow-up message that answers can only run once this one has ended. That follow-up's
`execute` gives the answer (WaitService.respond, the one rule of tasks.respond), then follows the
resumed tree like the first one did, to the next wait or the end.

`cancel` (A2A tasks/cancel) cancels every pending and running task of the tree through the engine,
so the work really stops, then reports the agent task canceled. The SDK awaits `cancel` before it
cancels the `execute` coroutine; meanwhile `execute` stops reporting, so the engine's own `final`
event of the cancelled run cannot race the canceled state.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.types.a2a_pb2 import Artifact, Message, Task, TaskState
from a2a.types.a2a_pb2 import TaskStatus as A2ATaskStatus  # (TaskStatus is our storage enum)
from a2a.utils.errors import InvalidParamsError

from taskgrove.agent.services.usage_service import tree_total
from taskgrove.agent.surfaces.a2a.input_required import Answer, InputWait, waits_for_input
from taskgrove.agent.surfaces.a2a.message_tree import TreePlan, TreeRequestContext, rpc_detail
from taskgrove.agent.surfaces.a2a.plain_language import gate_id, plan_data
from taskgrove.agent.surfaces.a2a.push import PushTargets
from taskgrove.agent.surfaces.a2a.tree_cancel import cancel_tree
from taskgrove.agent.surfaces.a2a.wire import data_message, run_data
from taskgrove.agent.engine import bus
from taskgrove.agent.engine.bus import Event, BusSubscription
from taskgrove.agent.engine.engine import AlreadyRunning, NotExecutable
from taskgrove.agent.engine.follow_final import follow_execution, stored_final
from taskgrove.agent.foundations.errors import RpcError
from taskgrove.agent.foundations.requests import RespondToTask
from taskgrove.agent.services.task_service import never_executed
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.status import FINISHED_STATUSES, TaskStatus

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

STATUS_INTERVAL = 0.1  # seconds between two streamed status updates of one agent task
SETTLE_AFTER = timedelta(seconds=5)  # an agent task quieter than this with its tree ended is settled on read
OUTCOME = "task_results"
OUTCOME_DESCRIPTION = "The outcome of the task tree: the root result and every task's status, result or error"


class TaskTreeAgentExecutor(AgentExecutor):
    def __init__(self, services: "A2AServices", task_store: TaskStore, push_targets: PushTargets) -> None:
        self._services = services
        self._executions = ExecutionStore(services.repo)
        self._task_store = task_store
        self._push = push_targets
        # Agent task id -> set once cancel() has reported the canceled state.
        self._cancelling: dict[str, asyncio.Event] = {}
        # Agent tasks executing here, with the call context their store rows are scoped by.
        self._live: dict[str, ServerCallContext] = {}

    # --- execute --------------------------------------------------------------------------

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        if not isinstance(context, TreeRequestContext):
            raise InvalidParamsError(message="This agent only executes task trees sent with message/send")
        plan, task_id = context.plan, context.task_id
        assert task_id is not None
        updater = TaskUpdater(event_queue, task_id, context.context_id or plan.root_task_id)
        answer = plan.answer
        if answer is not None and answer.problem is not None:  # no answer: ask again, saying why
            assert answer.wait is not None
            await self._ask(updater, plan, answer.wait, answer.problem)
            return
        subscription = self._services.bus.subscribe(
            lambda e: e["root_task_id"] == plan.root_task_id, maxsize=10_000)
        self._live[task_id] = context.call_context
        try:
            if answer is None:
                if not await self._start(context, event_queue, updater, plan):
                    return
            elif not await self._resume(updater, plan, answer):
                return
            outcome = await self._follow(subscription, updater, plan, task_id)
            if isinstance(outcome, InputWait):
                await self._ask(updater, plan, outcome)
            elif outcome is not None:
                await self._finish(updater, plan, outcome)
        finally:
            subscription.close()
            self._cancelling.pop(task_id, None)
            self._live.pop(task_id, None)

    async def _start(self, context: RequestContext, event_queue: EventQueue, updater: TaskUpdater,
                     plan: TreePlan) -> bool:
        """Report the agent task and start the tree's execution, or join the one already under way;
        False when there is nothing to follow: it cannot start (the agent task is then failed),
        or a resent tree's execution had already ended or waits for input (reported as it stands)."""
        await event_queue.enqueue_event(_initial_task(context, plan))
        if plan.planned is not None:  # the plan a text request became, visible to the caller
            await updater.add_artifact([new_data_part({"tasks": plan.planned})], name="plan", last_chunk=True)
        if plan.resent:
            rows = await self._services.repo.tree(plan.root_task_id)
            if not never_executed(rows):
                return await self._rejoin(updater, plan, rows)
        try:
            await self._services.engine.run_keeper.execute(plan.task_id, plan.call)
        except AlreadyRunning:  # started meanwhile (the same message resent at once): follow that execution
            return True
        except (NotExecutable, KeyError) as exc:
            await updater.failed(message=_status_message(
                updater.task_id, plan.root_task_id, plan.task_count, TaskStatus.FAILED.value, 0.0,
                message=f"Task '{plan.task_id}' cannot be executed: {exc}"))
            return False
        return True

    async def _rejoin(self, updater: TaskUpdater, plan: TreePlan, rows: list[dict[str, Any]]) -> bool:
        """A resent tree that was executed: True to follow its execution, still running here or
        on another instance; otherwise it is reported as it stands (False): waiting for input,
        or ended with the stored outcome, as the first message's agent task reported it."""
        if await self._services.engine.run_keeper.following(plan.root_task_id) is not None:
            waits = waits_for_input(rows)
            if not waits:
                return True
            await self._ask(updater, plan, waits[0])
            return False
        await self._finish(updater, plan, await stored_final(self._services.repo, plan.root_task_id))
        return False

    async def _resume(self, updater: TaskUpdater, plan: TreePlan, answer: Answer) -> bool:
        """Give the follow-up's answer to its wait (tasks.respond's rule); the agent task is
        working again. False when the answer was refused: the agent task then still waits, with
        the reason. A wait that ended another way meanwhile (answered, timed out) is no refusal:
        the tree goes on, and is followed."""
        if answer.wait is not None:
            try:
                await self._services.waits.respond(RespondToTask.of(answer.wait.task_id, answer.value), answer.call)
            except RpcError as exc:
                waits = waits_for_input(await self._services.repo.tree(plan.root_task_id))
                still = next((w for w in waits if w.task_id == answer.wait.task_id), None)
                if still is not None:
                    await self._ask(updater, plan, still, rpc_detail(exc))
                    return False
        await updater.update_status(TaskState.TASK_STATE_WORKING, message=_status_message(
            updater.task_id, plan.root_task_id, plan.task_count, TaskStatus.IN_PROGRESS.value, 0.0,
            message=f"Answer to task {answer.wait.task_id} taken; resuming" if answer.wait is not None else None))
        return True

    async def _ask(self, updater: TaskUpdater, plan: TreePlan, wait: InputWait, problem: str | None = None) -> None:
        """The agent task waits for the input `wait` asks for (input-required), with `problem`:
        why the last follow-up was not taken."""
        rows = await self._services.repo.tree(plan.root_task_id)
        done = sum(1 for r in rows if r["status"] in FINISHED_STATUSES) / max(len(rows), 1)
        data = run_data(TaskStatus.IN_PROGRESS.value, done, plan.root_task_id, len(rows) or plan.task_count)
        data.update(wait.data(problem))  # `schema` and `deadline` stay, null too
        if wait.task_id == gate_id(plan.root_task_id):  # a plan's approval: show the plan
            data.update(plan_data(rows, wait.prompt))
        message = data_message(data, task_id=updater.task_id, context_id=plan.root_task_id)
        message.parts.append(new_text_part(wait.text(problem)))
        await updater.requires_input(message=message)

    async def _follow(self, subscription: BusSubscription, updater: TaskUpdater, plan: TreePlan,
                      task_id: str) -> Event | InputWait | None:
        """Report engine events until the run's `final` event (returned), a wait for input of one
        of its tasks (returned), or None once cancelled.

        Every status update is a write of the agent task (whose history grows by one message),
        so updates are sent at most every STATUS_INTERVAL seconds; events in between are
        coalesced into the next update, which reports the latest state.
        """
        loop = asyncio.get_running_loop()
        last_sent = -STATUS_INTERVAL
        # Not the bare subscription: the owner's `final` may never reach this instance (lost
        # NOTIFY, execution taken over elsewhere); follow_execution then reads it from the database.
        events = follow_execution(self._services.repo, subscription, plan.root_task_id)
        try:
            while True:
                batch = [await anext(events)]
                # A push config may also be set while the tree runs (tasks/pushNotificationConfig/set).
                streaming = plan.stream or self._push.enabled(task_id)
                if streaming and batch[0]["type"] != bus.FINAL:
                    delay = last_sent + STATUS_INTERVAL - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                while not subscription.queue.empty():
                    batch.append(subscription.queue.get_nowait())
                cancelled = self._cancelling.get(task_id)
                if cancelled is not None:
                    await cancelled.wait()  # cancel() owns the terminal state now
                    return None
                final = next((e for e in batch if e["type"] == bus.FINAL), None)
                if final is not None:
                    return final
                if any("waiting" in e for e in batch):  # a task parked or resumed: does one wait for input?
                    waits = waits_for_input(await self._services.repo.tree(plan.root_task_id))
                    if waits:
                        return waits[0]
                if streaming:
                    last = batch[-1]
                    await updater.update_status(TaskState.TASK_STATE_WORKING, message=_status_message(
                        task_id, plan.root_task_id, plan.task_count, TaskStatus.IN_PROGRESS.value,
                        last.get("tree_progress", 0.0),
                        task_id=last["task_id"],
                        task_status=last.get("status"), task_progress=last.get("progress"),
                        event=last["type"], message=last.get("message")))
                    last_sent = loop.time()
        finally:
            await events.aclose()

    async def _finish(self, updater: TaskUpdater, plan: TreePlan, final: Event) -> None:
        rows = await self._services.repo.tree(plan.root_task_id)
        status = final["status"]
        # Sent whole, so it is the last chunk: clients that assemble chunks (ADK) drop an open one.
        await updater.add_artifact([new_data_part(_outcome(plan.root_task_id, rows, status))], name=OUTCOME,
                                   metadata={"description": OUTCOME_DESCRIPTION}, last_chunk=True)
        message = _status_message(updater.task_id, plan.root_task_id, len(rows), status, final.get("progress", 0.0))
        if status == TaskStatus.COMPLETED:
            await updater.complete(message=message)
        else:
            await updater.failed(message=message)

    async def settle(self, task: Task, call_context: ServerCallContext | None) -> Task:
        """An agent task left `working` by an instance that no longer follows its tree (stopped,
        restarted, died) gets the tree's stored outcome once its execution, resumed by whichever
        instance, has ended. Read-time, so it costs nothing until someone asks. So does one left
        `input-required` by a wait that ended another way (tasks.respond, a timeout's default)."""
        waited = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if not (task.status.state == TaskState.TASK_STATE_WORKING or waited) or task.id in self._live:
            return task
        if task.status.HasField("timestamp") and \
                datetime.now(timezone.utc) - task.status.timestamp.ToDatetime(timezone.utc) < SETTLE_AFTER:
            return task  # just started here or elsewhere: its own follower reports it
        repo = self._services.repo
        execution = await self._executions.latest(task.context_id)
        if execution is None or execution["status"] == "running":
            return task  # still being carried out (resumed): stays working
        rows = await repo.tree(task.context_id)
        if not rows:
            return task
        status = execution["final_status"] or TaskStatus.FAILED.value
        artifact = Artifact(artifact_id=uuid.uuid4().hex, name=OUTCOME, description=OUTCOME_DESCRIPTION,
                            parts=[new_data_part(_outcome(task.context_id, rows, status))])
        task.artifacts.append(artifact)
        if task.status.HasField("message"):
            task.history.append(task.status.message)
        progress = 1.0 if status == TaskStatus.COMPLETED else 0.0
        state = TaskState.TASK_STATE_COMPLETED if status == TaskStatus.COMPLETED else TaskState.TASK_STATE_FAILED
        message = _status_message(task.id, task.context_id, len(rows), status, progress)
        task.status.CopyFrom(A2ATaskStatus(state=state, message=message))
        task.status.timestamp.FromDatetime(datetime.now(timezone.utc))
        await self._task_store.save(task, call_context)  # type: ignore[arg-type]  # None: no owner filter, as before
        return task

    # --- cancel ---------------------------------------------------------------------------

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id
        root = context.context_id or (context.current_task.context_id if context.current_task else None)
        if not task_id or not root:
            raise InvalidParamsError(message="tasks/cancel needs the agent task id")
        reported = self._cancelling.setdefault(task_id, asyncio.Event())
        # Not executing here (an agent task in input-required): no execute will clear `reported`.
        following = self._live.pop(task_id, None) is not None
        try:
            cancelled, rows = await cancel_tree(self._services, root)
            progress = sum(1 for r in rows if r["status"] in FINISHED_STATUSES) / max(len(rows), 1)
            await TaskUpdater(event_queue, task_id, root).cancel(message=_status_message(
                task_id, root, len(rows), TaskStatus.CANCELLED.value, progress,
                message=f"Cancelled {cancelled} task(s) of tree {root}"))
        finally:
            reported.set()
            if not following:
                self._cancelling.pop(task_id, None)


def _outcome(root_id: str, rows: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """The `task_results` artifact's data: the root's result or error and every task's."""
    root = next((r for r in rows if r["id"] == root_id), None)
    return {
        "root_task_id": root_id,
        "status": status,
        "result": root["result"] if root is not None else None,
        "error": root["error"] if root is not None else None,
        "task_count": len(rows),
        "tree_usage": tree_total(r.get("usage") for r in rows),  # LLM tokens and cost (docs/costs.md)
        "tasks": [{"id": r["id"], "name": r["name"], "parent_id": r["parent_id"], "status": r["status"],
                   "progress": r["progress"], "result": r["result"], "error": r["error"]} for r in rows],
    }


def _status_message(agent_task_id: str | None, root_task_id: str, task_count: int, status: str, progress: float,
                    **extra: Any) -> Message:
    """A status message whose data part is the run summary (SPEC.md, Agent-surface task object).

    It names its agent task (`taskId`) as well as the context: a message a client keeps on its own
    (the final status of a stream, a history entry) still says which task it belongs to."""
    return data_message(run_data(status, progress, root_task_id, task_count, **extra),
                        task_id=agent_task_id or None, context_id=root_task_id)


def _initial_task(context: RequestContext, plan: TreePlan) -> Task:
    """The agent task as first reported: working, nothing done yet (the push answer's shape).

    A follow-up on a task that waited for a plan's approval keeps that task's history.
    """
    status = A2ATaskStatus(state=TaskState.TASK_STATE_WORKING,
                        message=_status_message(context.task_id, plan.root_task_id, plan.task_count,
                                                TaskStatus.IN_PROGRESS.value, 0.0))
    status.timestamp.FromDatetime(datetime.now(timezone.utc))
    if context.current_task is not None:
        task = Task()
        task.CopyFrom(context.current_task)
        task.status.CopyFrom(status)
    else:
        task = Task(id=context.task_id, context_id=context.context_id or plan.root_task_id, status=status)
        if context.message is not None:
            task.history.append(context.message)
    task.metadata.update(plan.metadata())
    return task
