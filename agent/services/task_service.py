"""The task operations every surface calls: `/tasks`, `/`, GraphQL, the CLI.

A surface parses its wire format into the operation's typed request (agent/foundations/requests.py, where the
params are read once) and hands it and the caller here; the rules (validation, permissions,
messages) live only in this module, agent/foundations/requests.py and storage.new_tree.
"""

from __future__ import annotations

import builtins  # `list` in annotations below TaskService.list is the method
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sqlalchemy.exc import IntegrityError

from taskgrove.agent.foundations import cursor
from taskgrove.agent.services.admission import Admission
from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.engine import insert_inline
from taskgrove.agent.engine.engine import AlreadyRunning, Engine
from taskgrove.agent.engine.retry_policy import PolicyError, RetryPolicy, stored_policy
from taskgrove.agent.foundations.errors import (INVALID_PARAMS, QuotaExceeded, RpcError, invalid_params, permission_denied,
                                   task_not_found)
from taskgrove.agent.services import clone_rules
from taskgrove.agent.foundations.requests import (CloneTask, CopyTask, DeleteTask, GetTask,
                                      GetTree, ListChildren, ListTasks, NewTree, UpdateTask)
from taskgrove.agent.foundations.calls import CallContext, Handler, typed
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.usage_service import tree_total
from taskgrove.executors.agent_delegation import breaker_wait
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.llm.budget import budget_remaining
from taskgrove.storage import copy_plan, fields, jsonvalues, new_tree, task_view, tree_graph
from taskgrove.storage.usage_store import UsageStore
from taskgrove.storage.tree_insert import OverQuota
from taskgrove.storage.models import UNFINISHED_STATUSES, TaskStatus
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import now_iso
from taskgrove.storage.new_tree import TreeError
from taskgrove.storage.task_view import public
from taskgrove.storage.wait_store import read as read_wait
from taskgrove.storage.outage import UNAVAILABLE

UPDATABLE = {
    "status", "inputs", "name", "priority", "params", "schemas", "dependencies", "result", "error",
    "progress", "started_at", "completed_at", "description", "retry", "timeout_seconds",
    "budget",  # raised by a person when a budget ran out (docs/costs.md)
}


# How often a create waiting for its tree asks whether the database is still there.
OUTAGE_CHECK_SECONDS = 0.25


class TaskService:
    def __init__(
        self,
        repo: TaskRepository,
        engine: Engine,
        registry: ExecutorRegistry,
        settings: Settings,
        admission: Admission,
    ) -> None:
        self.repo = repo
        self.usage_store = UsageStore(repo)
        # Asked before every write that stores new tasks: SERVICE_MAX_PENDING_PER_USER.
        self.admission = admission
        self.engine = engine
        self.registry = registry
        self.settings = settings
        # Called with every new tree's rows once prepared (the directory's default concurrency key
        # of a task delegated to an agent by name, agent/services/agent_lookup.py).
        self.row_hooks: list[Callable[[list[dict[str, Any]]], None]] = []

    # --- helpers --------------------------------------------------------------------------

    async def task_for(self, task_id: str, caller: Caller) -> dict[str, Any]:
        row = await self.repo.get(task_id)
        if row is None:
            raise task_not_found(task_id)
        if not caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not access task '{task_id}'")
        return row

    # --- create and read ------------------------------------------------------------------

    def prepare(self, request: NewTree, caller: Caller, *, values_checked: bool = False) -> list[dict[str, Any]]:
        """Validated rows for a new tree (no I/O), permission rules applied. `values_checked`: the
        value gate already cleared the request's values (CallContext.values_checked)."""
        try:
            rows = new_tree.prepare_new_tree(request.tasks, default_user=caller.user_id, values_checked=values_checked)
        except TreeError as exc:
            raise invalid_params(str(exc)) from None
        defaults = self.engine.default_retry
        for index, row in enumerate(rows):
            try:
                row["retry"] = RetryPolicy.parse(row.get("retry"), defaults).as_dict()
            except PolicyError as exc:
                raise invalid_params(f"{new_tree.label(row, index)}: {exc}") from None
        owner = rows[0]["user_id"]
        if caller.authenticated and caller.user_id is not None and not caller.is_admin and owner != caller.user_id:
            raise permission_denied(f"You may not create tasks for user '{owner}'")
        for index, row in enumerate(rows):
            if (row["schemas"] or (row["params"] or {}).get("executor_id")) and self.registry.resolve(row) is None:
                wanted = self.registry.wanted(row)
                raise invalid_params(
                    f"{new_tree.label(row, index)}: executor '{wanted}' is not available "
                    f"(available: {', '.join(self.registry.ids()) or 'none'})"
                )
        for hook in self.row_hooks:
            hook(rows)
        return rows

    async def create_tree(self, request: NewTree, caller: Caller) -> list[dict[str, Any]]:
        """Store a new tree without executing it."""
        return await self._store(self.prepare(request, caller), caller)

    async def create_tree_or_resent(self, request: NewTree, caller: Caller) -> tuple[list[dict[str, Any]], bool]:
        """create_tree for a request its sender may have sent before (an A2A message re-sent by
        a caller cut off before it saw the answer): the same ids and content answer with the
        stored rows and True, as tasks.create answers a resend (`_resent`), instead of refusing
        the ids; the caller then follows or reports that tree's execution rather than start one.
        Any difference in what was sent is still the error naming the id that is taken."""
        rows = self.prepare(request, caller)
        try:
            await self._admit(rows, caller)
            await self.repo.insert(rows)
            return rows, False
        except (QuotaExceeded, IntegrityError) as exc:  # nothing stored; over the quota: perhaps a resend
            if not await self.repo.get_many([rows[0]["id"]]):  # a new tree: a child's id taken, or over the quota
                if isinstance(exc, IntegrityError):
                    await self._taken(rows)
                raise
        return await self._stored_again(rows, caller), True

    async def _stored_again(self, rows: list[dict[str, Any]], caller: Caller) -> list[dict[str, Any]]:
        """The stored tree `rows` were prepared from again (same ids, same content), root first;
        any difference raises the error naming the id that is taken."""
        stored = {row["id"]: row for row in await self.repo.tree(rows[0]["id"])}
        if set(stored) != {row["id"] for row in rows} or any(
                _content(row) != _content(stored[row["id"]]) for row in rows):
            await self._taken(rows)
        if not caller.can_access(rows[0]["user_id"]):
            raise permission_denied(f"You may not access task '{rows[0]['id']}'")
        return [stored[row["id"]] for row in rows]

    async def _store(self, rows: list[dict[str, Any]], caller: Caller) -> list[dict[str, Any]]:
        """Store prepared rows as they are (not executed), once the owner's quota admits them."""
        await self._admit(rows, caller)
        try:
            await self.repo.insert(rows)
        except IntegrityError:  # rolled back whole
            await self._taken(rows)
        return rows

    async def _admit(self, rows: list[dict[str, Any]], caller: Caller) -> None:
        """The pending-task quota of the new rows' owner (one owner per tree), before any write:
        rows stored finished (links, archives of finished tasks) do not count."""
        await self.admission.admit_tasks(caller, rows[0]["user_id"], _unfinished(rows))

    async def _taken(self, rows: list[dict[str, Any]]) -> None:
        """Raise the error naming which id of `rows` is already stored."""
        taken = await self.repo.get_many(row["id"] for row in rows)
        for index, row in enumerate(rows):
            if row["id"] in taken:
                raise invalid_params(f"{new_tree.label(row, index)}: id '{row['id']}' already exists") from None
        raise invalid_params("One of the task ids already exists; nothing was created") from None

    async def create_tree_for(self, tasks: Any, user_id: str | None) -> list[dict[str, Any]]:
        """create_tree on behalf of `user_id`, for executors (which know the owner of the task
        they run, not a Caller, and plain data, not agent/foundations/requests.py): the tree may only belong to
        that user. Not executed."""
        caller = Caller(user_id=user_id, authenticated=user_id is not None)
        return await self.create_tree(NewTree.from_params(tasks, self.settings.max_tree_tasks), caller)

    async def add_child(self, parent_id: str, request: NewTree, caller: Caller) -> list[dict[str, Any]]:
        """One new task under an existing task (GraphQL createTask with parentId); not executed.

        The tree's owner owns the new task; an admin may add under anyone's task."""
        parent = await self.task_for(parent_id, caller)
        if parent["origin_type"] == "archive":
            raise invalid_params(f"Task '{parent_id}' is an archive (read-only): no task can be added under it")
        rows = self.prepare(request, caller)
        rows[0].update(parent_id=parent_id, task_tree_id=parent["task_tree_id"], user_id=parent["user_id"])
        await self._admit(rows, caller)
        await self.repo.insert(rows)
        return rows

    async def create(self, request: NewTree, ctx: CallContext) -> dict[str, Any]:
        """tasks.create: store the tree and its execution in one transaction, execute it, answer
        the tree once it finished, or waits for an answer (docs/waits.md), or the wait timed out.
        A tree stored completed by its insert (every task pure, engine/insert_inline.py) is
        answered from the rows the insert stored, as a read right after it would find them."""
        rows = self.prepare(request, ctx.caller, values_checked=ctx.values_checked)
        root_id = rows[0]["id"]
        if rows[0]["origin_type"] == "archive":  # e.g. an archive made from a clone preview: stored, not run
            await self._store(rows, ctx.caller)  # these rows: prepared again, a root without an id would get another
            return task_view.nest(await self.repo.tree(root_id), root_id)
        quota = self.admission.quota_for(ctx.caller, rows[0]["user_id"], _unfinished(rows))
        try:
            run = await self.engine.run_keeper.create_and_execute(rows, ctx.execution_call(), quota)
            stored = insert_inline.stored_rows(run)
            if stored is not None:  # stored completed by its insert: the answer is what it stored
                return task_view.nest(stored, root_id)
        except OverQuota as over:
            if not await self.repo.get_many([root_id]):  # a new tree over the quota
                raise self.admission.over_quota(over.quota, over.unfinished) from None
            run = await self._resent(rows, ctx)  # resent: it adds nothing, so the quota has no say
        except IntegrityError:
            run = await self._resent(rows, ctx)
        if run is not None:
            await self._wait_while_up(run, self.settings.create_wait_timeout)
        return task_view.nest(await self.repo.tree(root_id), root_id)

    async def _wait_while_up(self, run: Any, timeout: float) -> None:
        """run_keeper.wait, cut short when the database is away meanwhile (storage/outage.py):
        the tree is stored and runs on by itself once the database is back, so holding the
        answer for the whole wait would only leave the client without one (issue 46: a create
        on a full disk answered after SERVICE_CREATE_WAIT_TIMEOUT)."""
        health = self.repo.connections.health
        unwritten = self.engine.run_keeper.passes.unwritten
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or await self.engine.run_keeper.wait(run, min(left, OUTAGE_CHECK_SECONDS),
                                                               until_waiting=True):
                return
            # Away for sure: outcomes of this tree wait in memory for the database, or it is full or
            # read-only (a slow probe on a busy machine says `unavailable`, and is no reason to stop).
            if not unwritten.isdisjoint(getattr(run, "rows", ())) or \
                    (health.outage is not None and health.outage.reason != UNAVAILABLE):
                return

    async def _resent(self, rows: list[dict[str, Any]], ctx: CallContext) -> Any:
        """The same tree sent again (a client whose first create was cut off): answer as the first
        call would now, following its execution, instead of refusing the ids. Any difference in
        what was sent is still an error naming the id that is taken."""
        stored = await self._stored_again(rows, ctx.caller)
        run = await self.engine.run_keeper.following(rows[0]["id"])
        if run is None and never_executed(stored):
            try:  # stored but never executed (tasks.create_tree, a clone): run it as create would have
                run = await self.engine.run_keeper.execute(rows[0]["id"], ctx.execution_call())
            except AlreadyRunning:
                run = await self.engine.run_keeper.following(rows[0]["id"])
        return run

    async def get(self, request: GetTask, ctx: CallContext) -> dict[str, Any] | None:
        task_id = request.task_id
        row, usages = await self.repo.get_with_tree_usages(task_id)
        if row is None:
            return None
        if not ctx.caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not access task '{task_id}'")
        answer = public(row)
        if usages is not None:  # a root: what its whole tree's LLM calls used (docs/costs.md)
            answer["tree_usage"] = tree_total(usages)
        if row.get("budget"):  # what its budget still allows over its subtree
            rows = await self.usage_store.tree_budget_rows(row["task_tree_id"])
            answer["budget_remaining"] = budget_remaining(rows, task_id)
        if row["status"] == TaskStatus.PENDING:  # why it waits, as this instance's engine knows it
            reason = self.engine.why_waiting(task_id)
            if reason is not None:
                answer["waiting_for"] = reason
        elif row.get("waiting") is not None:  # parked on an agent's open breaker: said by the stored wait
            reason = breaker_wait(read_wait(row["waiting"]))
            if reason is not None:
                answer["waiting_for"] = reason
        return answer

    async def list(self, request: ListTasks, ctx: CallContext) -> list[dict[str, Any]] | dict[str, Any]:
        """tasks.list: the plain list of SPEC.md, or with `cursor` in the request a page
        {"tasks", "next_cursor"} (docs/jsonrpc.md; next_cursor null on the last page)."""
        user_id = request.user_id
        if user_id is None and ctx.caller.authenticated and not ctx.caller.unrestricted:
            user_id = ctx.caller.user_id
        if request.status == "deleted":  # deletion is physical: deleted tasks never appear in lists
            return {"tasks": [], "next_cursor": None} if request.paged else []
        # A page by cursor reads one row more: whether another page follows (next_cursor null on the last).
        wanted = request.limit + 1 if request.paged else request.limit
        found = await self.repo.list(user_id=user_id, status=request.status, limit=wanted,
                                     offset=request.offset, root_only=request.root_only, search=request.search,
                                     waiting=request.waiting, after=request.after)
        more = len(found) > request.limit
        rows = found[:request.limit]
        listed = [public(r) for r in rows if ctx.caller.can_access(r["user_id"])]
        if request.root_only:  # one row per tree: say what its tree holds (the dashboard's tree list)
            counts = await self.repo.status_counts([r["task_tree_id"] for r in listed])
            for row in listed:
                row["status_counts"] = counts.get(row["task_tree_id"], {})
        if not request.paged:
            return listed
        # the page's last row read, shown or not; or where a search's window ended (TaskRepository.list)
        last = rows[-1] if more else found.window_end
        return {"tasks": listed, "next_cursor": cursor.encode(last["created_at"], last["id"]) if last else None}

    async def children(self, request: ListChildren, ctx: CallContext) -> builtins.list[dict[str, Any]]:
        parent_id = request.parent_id
        parent = await self.repo.get(parent_id)
        if parent is None:
            raise task_not_found(parent_id)
        if not ctx.caller.can_access(parent["user_id"]):
            return []  # SPEC: children filters out what the caller may not see instead of failing
        rows = await self.repo.children(parent_id)
        return [public(r) for r in rows if ctx.caller.can_access(r["user_id"])]

    async def tree(self, request: GetTree, ctx: CallContext) -> dict[str, Any]:
        row = await self.task_for(request.task_id, ctx.caller)
        rows = await self.repo.tree(row["task_tree_id"])
        nested = task_view.nest(rows, row["task_tree_id"])
        nested["tree_usage"] = tree_total(r.get("usage") for r in rows)
        return nested

    # --- update and delete ----------------------------------------------------------------

    async def update(self, request: UpdateTask, ctx: CallContext) -> dict[str, Any]:
        task_id = request.task_id
        async with self.repo.transaction() as conn:
            if "dependencies" in request.fields:  # the cycle check and the write: one decision per tree
                await self.repo.serialise_tree(task_id, conn)
            row = await self.repo.get(task_id, conn)
            if row is None:
                raise task_not_found(task_id)
            if not ctx.caller.can_access(row["user_id"]):
                raise permission_denied(f"Only the owner or an admin may update task '{task_id}'")
            problems, values = await self._update_values(row, request.fields, conn)
            if problems:
                raise RpcError(INVALID_PARAMS, "Invalid params", "Update failed:\n" + "\n".join(problems))
            values["updated_at"] = now_iso()
            if "status" in values:  # set by hand: no execution runs it or waits for its retry any more
                values.update(execution_id=None, next_attempt_at=None, lease_owner=None, lease_expires_at=None,
                              waiting=None, wake_at=None, wait_answers=None)  # and a wait is over
            # New dependencies only while the task is still pending: an engine that claimed it
            # since it was read (no tree lock is taken to claim) must not see them change under it.
            if not await self.repo.update(task_id, values, conn=conn,
                                          only_status=(TaskStatus.PENDING.value,) if "dependencies" in values else None):
                raise invalid_params(f"Cannot update 'dependencies': task '{task_id}' started while updating; "
                                     "nothing was changed")
            updated = await self.repo.get(task_id, conn)
        assert updated is not None
        if "status" in values:
            self.engine.status_changed(updated)
        else:  # inputs, policy, dependencies...: the next attempt must see them
            self.engine.task_changed(updated)
        return public(updated)

    async def _update_values(self, row: dict[str, Any], given: Mapping[str, Any], conn: Any) -> tuple[builtins.list[str], dict[str, Any]]:
        problems: list[str] = []
        values: dict[str, Any] = {}
        if row["origin_type"] == "archive":
            problems.append(f"Cannot update task '{row['id']}': task is an archive (read-only)")
        for key, value in given.items():
            if key == "parent_id":
                problems.append("Cannot update 'parent_id': field cannot be modified (task hierarchy is fixed)")
            elif key == "user_id":
                problems.append("Cannot update 'user_id': field cannot be modified (task ownership is fixed)")
            elif key not in UPDATABLE:
                problems.append(f"Cannot update '{key}': unknown field")
            elif (problem := _field_problem(key, value)) is not None:
                problems.append(f"Cannot update '{key}': {problem}")
            elif key == "retry":  # fields left out keep the task's current policy; null: the defaults
                current = stored_policy(row, self.engine.default_retry)
                try:
                    values[key] = RetryPolicy.parse(value, current).as_dict() if value is not None \
                        else self.engine.default_retry.as_dict()
                except PolicyError as exc:
                    problems.append(f"Cannot update 'retry': {exc}")
            elif key != "dependencies":
                values[key] = float(value) if key in ("progress", "timeout_seconds") and value is not None else value
        if "dependencies" in given:
            deps_problems, deps = await self._dependency_problems(row, given["dependencies"], conn)
            problems.extend(deps_problems)
            if not deps_problems:
                values["dependencies"] = deps
        return problems, values

    async def _dependency_problems(self, row: dict[str, Any], raw: Any, conn: Any) -> tuple[builtins.list[str], builtins.list[dict[str, Any]]]:
        problems: list[str] = []
        if row["status"] != TaskStatus.PENDING:
            problems.append(f"Cannot update 'dependencies': task status is '{row['status']}' (must be 'pending')")
        try:
            deps = new_tree.normalize_dependencies(raw, "dependencies")
        except TreeError as exc:
            return problems + [f"Cannot update 'dependencies': {exc}"], []
        rows = {r["id"]: r for r in await self.repo.tree(row["task_tree_id"], conn)}
        for dep in deps:
            if dep["id"] not in rows:
                problems.append(f"Dependency reference '{dep['id']}' not found in task tree")
        graph = {tid: [d["id"] for d in r["dependencies"]] for tid, r in rows.items()}
        graph[row["id"]] = [d["id"] for d in deps if d["id"] in rows]
        cycle = tree_graph.find_cycle(graph)
        if cycle:
            problems.append(tree_graph.format_cycle(cycle))
        dependents = tree_graph.transitive([row["id"]], tree_graph.dependents_index(rows.values())) - {row["id"]}
        busy = sorted(tid for tid in dependents if rows[tid]["status"] == TaskStatus.IN_PROGRESS)
        if busy:
            problems.append(
                f"Cannot update dependencies: task '{row['id']}' has dependent tasks that are executing: [{', '.join(busy)}]"
            )
        return problems, deps

    async def delete(self, request: DeleteTask, ctx: CallContext) -> dict[str, Any]:
        task_id = request.task_id
        async with self.repo.transaction() as conn:
            # "nothing depends on it" and the delete: one decision, or a dependency added meanwhile
            # would name a task that is gone.
            await self.repo.serialise_tree(task_id, conn)
            row = await self.repo.get(task_id, conn)
            if row is None:
                raise task_not_found(task_id)
            if not ctx.caller.can_access(row["user_id"]):
                raise permission_denied(f"Only the owner or an admin may delete task '{task_id}'")
            rows = await self.repo.tree(row["task_tree_id"], conn)
            by_id = {r["id"]: r for r in rows}
            doomed = tree_graph.subtree_ids(rows, task_id)
            blockers: list[str] = []
            if row["status"] != TaskStatus.PENDING:
                blockers.append(f"Cannot delete task: task status is '{row['status']}' (must be 'pending')")
            busy = [f"{tid}: {by_id[tid]['status']}" for tid in doomed[1:] if by_id[tid]["status"] != TaskStatus.PENDING]
            if busy:
                blockers.append(f"Cannot delete task: task has {len(busy)} non-pending children: [{', '.join(busy)}]")
            dependents = [dep["id"] for dep in await self.repo.dependents(doomed, conn) if dep["id"] not in doomed]
            if dependents:
                blockers.append(
                    f"Cannot delete task: {len(dependents)} tasks depend on this task: [{', '.join(sorted(dependents))}]"
                )
            if blockers:
                detail = "; ".join(blockers)
                raise RpcError(INVALID_PARAMS, detail, detail)
            deleted = await self.repo.delete(doomed, conn, only_status=TaskStatus.PENDING.value)
            if deleted != len(doomed):  # one of them started meanwhile: roll back, delete nothing
                raise invalid_params("Cannot delete task: a task of its subtree started while deleting; "
                                     "nothing was deleted")
        return {"success": True, "task_id": task_id, "deleted_count": deleted, "children_deleted": deleted - 1}

    # --- copy and clone -------------------------------------------------------------------

    async def copy(self, request: CopyTask, ctx: CallContext) -> dict[str, Any]:
        copies = await self.copy_tree(request.task_id, request.children, ctx.caller)
        return task_view.nest(copies, copies[0]["id"])

    async def copy_tree(self, task_id: str, with_children: bool, caller: Caller) -> builtins.list[dict[str, Any]]:
        """Copy `task_id` (see storage.copy_plan.copy_selection); returns the new rows, root first."""
        async with self.repo.transaction() as conn:
            # The copies are made from one state of the tree that no dependency change or other
            # copy is writing (two copies both mark the originals: without the lock PostgreSQL
            # may find them locking the same rows in opposite orders, a deadlock).
            await self.repo.serialise_tree(task_id, conn)
            row = await self.repo.get(task_id, conn)
            if row is None:
                raise task_not_found(task_id)
            if not caller.can_access(row["user_id"]):
                raise permission_denied(f"You may not copy task '{task_id}'")
            rows = await self.repo.tree(row["task_tree_id"], conn)
            selected, root = copy_plan.connect(rows, copy_plan.copy_selection(rows, task_id, with_children))
            self._check_tree_size(selected)
            copies = copy_plan.plan_copies(
                rows, selected, root, origin_for=dict.fromkeys(selected, "clone"), reset=copy_plan.RESETTABLE
            )
            await self._admit(copies, caller)
            await self.repo.insert(copies, conn)
            await self.repo.update_many(sorted(selected), {"has_copy": True}, conn=conn)
        return copies

    async def clone(self, request: CloneTask, ctx: CallContext) -> dict[str, Any]:
        task_id, mode, link_ids = request.task_id, request.mode, request.link_ids
        async with self.repo.transaction() as conn:
            await self.repo.serialise_tree(task_id, conn)  # see copy_tree
            row = await self.repo.get(task_id, conn)
            if row is None:
                raise task_not_found(task_id)
            if not ctx.caller.can_access(row["user_id"]):
                raise permission_denied(f"You may not clone task '{task_id}'")
            rows = await self.repo.tree(row["task_tree_id"], conn)
            by_id = {r["id"]: r for r in rows}
            selected = set(tree_graph.subtree_ids(rows, task_id)) if request.recursive else {task_id}
            if request.with_children:
                deps = {r["id"]: [d["id"] for d in r["dependencies"] if d["id"] in by_id] for r in rows}
                for child in tree_graph.children_index(rows).get(task_id, ()):
                    selected |= tree_graph.transitive([child["id"]], deps)
            selected, root = copy_plan.connect(rows, selected)
            self._check_tree_size(selected)
            origin_for = clone_rules.origins(mode, rows, selected, link_ids)
            copies = copy_plan.plan_copies(rows, selected, root, origin_for=origin_for, reset=None)
            for copy in copies:
                copy.update(request.reset if copy["origin_type"] == "clone" else request.overrides)
            if not request.save:
                return {"tasks": [clone_rules.preview(c) for c in copies], "saved": False}
            await self._admit(copies, ctx.caller)
            await self.repo.insert(copies, conn)
            await self.repo.update_many(sorted(selected), {"has_references": True}, conn=conn)
        return task_view.nest(copies, copies[0]["id"])

    def _check_tree_size(self, selected: set[str]) -> None:
        """SERVICE_MAX_TREE_TASKS bounds what one copy or clone writes, as it bounds a create."""
        if len(selected) > self.settings.max_tree_tasks:
            raise invalid_params(str(new_tree.too_many_tasks(self.settings.max_tree_tasks, len(selected))))



def _field_problem(key: str, value: Any) -> str | None:
    """The JSON value gate, then the field's rule (storage.fields, with update's stricter `result`)."""
    if (bad := jsonvalues.problem(value, key, jsonvalues.STORED_MAX_DEPTH)) is not None:
        return bad  # the one gate for values: NaN, 1e400, lone surrogates never reach the row
    return fields.problem(key, value, fields.UPDATE_RULES)


# What a tree's sender decides; a resend must match these to count as the same request.
_CONTENT = ("name", "description", "user_id", "parent_id", "priority", "dependencies", "inputs", "params",
            "schemas", "product_id", "retry", "timeout_seconds", "extra")


def _content(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(key) for key in _CONTENT)


def never_executed(rows: list[dict[str, Any]]) -> bool:
    """Whether a stored tree was never executed (tasks.create_tree, a clone): every task pending
    and in no execution. A resend of it runs it, as the first request would have."""
    return all(row["status"] == TaskStatus.PENDING and row["execution_id"] is None for row in rows)


def _unfinished(rows: list[dict[str, Any]]) -> int:
    """How many of a new tree's rows count against the pending-task quota: rows stored finished
    (links, archives of finished tasks) do not."""
    return sum(1 for row in rows if row.get("status", TaskStatus.PENDING) in UNFINISHED_STATUSES)


def task_methods(service: TaskService) -> dict[str, Handler]:
    return {
        "tasks.create": typed(partial(NewTree.from_params, max_tasks=service.settings.max_tree_tasks), service.create),
        "tasks.get": typed(GetTask.from_params, service.get),
        "tasks.detail": typed(GetTask.from_params, service.get),
        "tasks.update": typed(UpdateTask.from_params, service.update),
        "tasks.delete": typed(DeleteTask.from_params, service.delete),
        "tasks.copy": typed(CopyTask.from_params, service.copy),
        "tasks.clone": typed(CloneTask.from_params, service.clone),
        "tasks.list": typed(ListTasks.from_params, service.list),
        "tasks.children": typed(ListChildren.from_params, service.children),
        "tasks.tree": typed(GetTree.from_params, service.tree),
    }
