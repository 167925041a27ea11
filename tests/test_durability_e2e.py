"""Durable, fault-isolated execution, end to end: real `taskgrove serve` processes, real signals.

- a task whose result cannot be stored fails alone; other trees keep running meanwhile;
- kill -9 mid-tree: the restarted service (SQLite) or the surviving instance (PostgreSQL) finishes
  the tree with no call, and no task that had completed runs again (side effects counted in a file);
- SIGSTOP past the lease, then SIGCONT: the stale instance's late results are refused and no tree
  contradicts itself;
- streams joined on the survivor for trees the killed instance ran end with the stored `final`.

Every scenario counts the commands' side effects from a file: nothing that completed before the
fault runs again, and each task ran at most once more per interruption the service counted.

All of it under the *default* retry policy (one attempt): a fault of the platform is not the task's
failure, so an interrupted attempt runs again with the same attempt number (issue 25).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections import Counter
from datetime import datetime, timezone
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import POSTGRES_URL, postgres_database
from tests.processes import Service, contradictions, start_together

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")


def command_task(tid: str, parent: str | None, marker: Path, seconds: float, deps: list[str] = (),
                 attempts: int | None = None) -> dict[str, Any]:
    """A command that works for `seconds`, then records `<task id>:<attempt>:<interruptions>` in
    `marker` and prints its interruption count (so the stored result tells which run wrote it).
    `attempts`: a retry policy; None leaves the service default (one attempt)."""
    script = (f'sleep {seconds}; echo "$TASKGROVE_TASK_ID:$TASKGROVE_ATTEMPT:$TASKGROVE_INTERRUPTIONS" >> {marker}; '
              'echo "$TASKGROVE_INTERRUPTIONS"')
    task: dict[str, Any] = {"id": tid, "name": tid, "schemas": {"method": "command_executor"},
                            "inputs": {"command": ["sh", "-c", script]},
                            "dependencies": [{"id": d} for d in deps]}
    if attempts is not None:
        task["retry"] = {"max_attempts": attempts, "base_seconds": 0.1, "jitter": False}
    if parent:
        task["parent_id"] = parent
    return task


def _records(marker: Path) -> list[tuple[str, int, int]]:
    lines = marker.read_text().split() if marker.exists() else []
    return [(tid, int(attempt), int(cut)) for tid, attempt, cut in (line.split(":") for line in lines)]


def side_effects(marker: Path) -> Counter[str]:
    """How many runs of each task got as far as recording their work."""
    return Counter(tid for tid, _, _ in _records(marker))


def attempts_seen(marker: Path) -> dict[str, int]:
    """The highest attempt number that recorded its work, per task."""
    best: dict[str, int] = {}
    for tid, attempt, _ in _records(marker):
        best[tid] = max(best.get(tid, 0), attempt)
    return best


def assert_every_side_effect_counted(marker: Path, rows: dict[str, dict[str, Any]], work: set[str],
                                     completed_before: set[str]) -> None:
    """From the marker file: no task of `work` that had completed before the fault ran again, and
    every one ran at least once and at most once more per interruption the service counted."""
    counts = side_effects(marker)
    again = {tid: counts[tid] for tid in completed_before & work if counts[tid] != 1}
    assert not again, f"completed before the fault, yet ran again: {again}"
    wrong = {tid: (counts[tid], rows[tid]["interruptions"]) for tid in work
             if not 1 <= counts[tid] <= 1 + rows[tid]["interruptions"]}
    assert not wrong, f"runs recorded vs interruptions counted: {wrong}"


def sqlite_rows(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT id, status, dependencies, attempt, interruptions FROM tasks")]
    for row in rows:
        row["dependencies"] = json.loads(row["dependencies"])
    return rows


async def wait_until(predicate: Any, timeout: float, what: str) -> float:
    """Poll an async predicate; returns the seconds it took."""
    start = time.monotonic()
    while not await predicate():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


# --- fault isolation ----------------------------------------------------------------------------

async def test_unstorable_results_fail_alone_while_other_trees_run(tmp_path: Path) -> None:
    service = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}",
                                 "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_RESULT_BYTES": str(1024 * 1024)}
                      ).start()
    try:
        # A chain of 1000 aggregates: each result nests the previous one, two levels deeper each time.
        chain = [{"id": f"c{i}", "name": f"c{i}", "parent_id": None if i == 0 else "c0",
                  "schemas": {"method": "aggregate_results_executor"},
                  "dependencies": [{"id": f"c{i - 1}"}] if i else []} for i in range(1000)]
        # A diamond of aggregates: layers of 10, each task depending on the whole previous layer, so
        # the expanded result grows tenfold per layer (the structure itself is shared, not copied).
        diamond = [{"id": "d-root", "name": "d-root", "schemas": {"method": "noop_executor"}}]
        for layer in range(10):
            for i in range(10):
                diamond.append({"id": f"d{layer}-{i}", "name": f"d{layer}-{i}", "parent_id": "d-root",
                                "schemas": {"method": "aggregate_results_executor"},
                                "dependencies": [{"id": f"d{layer - 1}-{j}"} for j in range(10)] if layer else []})
        await service.rpc("tasks.create", chain)
        await service.rpc("tasks.create", diamond)
        # Meanwhile another user's one-task tree runs as usual.
        started = time.monotonic()
        other = await service.rpc("tasks.create", {"tasks": [{"id": "other", "name": "other", "user_id": "bob",
                                                               "schemas": {"method": "noop_executor"}}]})
        await service.wait_status("other", ("completed",))
        other_seconds = time.monotonic() - started
        assert other["id"] == "other"

        async def chain_settled() -> bool:
            rows = {r["id"]: r for r in await service.rpc("tasks.list", {"limit": 1000, "status": "failed"})}
            return any(tid.startswith("c") for tid in rows)

        await wait_until(chain_settled, 60, "the chain to reach its unstorable task")
        failed_chain = [t for t in await service.rpc("tasks.list", {"limit": 1000, "status": "failed"})
                        if t["id"].startswith("c")]
        assert len(failed_chain) == 1
        assert "nested deeper than 100 levels" in failed_chain[0]["error"]
        assert failed_chain[0]["attempt"] == 1, "an unstorable result is not retried"
        depth = int(failed_chain[0]["id"][1:])
        assert 30 < depth < 60
        assert (await service.task(f"c{depth - 1}"))["status"] == "completed"
        assert (await service.task(f"c{depth + 1}"))["status"] == "pending", "its dependents do not run"

        async def diamond_settled() -> bool:
            return any(t["id"].startswith("d") for t in await service.rpc("tasks.list", {"status": "failed"}))

        await wait_until(diamond_settled, 60, "the diamond to reach its unstorable layer")
        failed_layer = {t["id"].split("-")[0] for t in await service.rpc("tasks.list", {"status": "failed"})
                        if t["id"].startswith("d")}
        assert len(failed_layer) == 1
        failed = [t for t in await service.rpc("tasks.list", {"status": "failed"}) if t["id"].startswith("d")]
        assert all("larger than 1048576 bytes" in t["error"] for t in failed)

        # The engine goes on: a new tree still runs, and the log shows no endless write retries.
        await service.rpc("tasks.create", [{"id": "after", "name": "after", "schemas": {"method": "noop_executor"}}])
        await service.wait_status("after", ("completed",))
        assert "retrying" not in service.log() and "Traceback" not in service.log()
        assert other_seconds < 3, f"another user's tree took {other_seconds:.2f}s"
    finally:
        service.stop()


# --- kill -9 on SQLite --------------------------------------------------------------------------

async def test_kill_9_mid_tree_then_restart_finishes_the_tree_without_repeating_work(tmp_path: Path) -> None:
    db = tmp_path / "tg.db"
    marker = tmp_path / "ran.txt"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{db}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_COMMAND_ALLOWLIST": "sh", "SERVICE_MAX_CONCURRENCY": "3"}
    tasks = [{"id": "root", "name": "root", "schemas": {"method": "noop_executor"},
              "dependencies": [{"id": f"t{i}"} for i in range(18)]}]
    tasks += [command_task(f"t{i}", "root", marker, 0.3, deps=[f"t{i - 3}"] if i >= 3 else []) for i in range(18)]
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", tasks)

        async def half_done() -> bool:
            return len(side_effects(marker)) >= 7

        await wait_until(half_done, 30, "half of the tree")
        service.kill()
        completed_before = {r["id"] for r in sqlite_rows(db) if r["status"] == "completed"}
        assert 4 <= len(completed_before) < 18
        service.start()  # nothing else is called: the execution resumes by itself
        await service.wait_status("root", ("completed",))
        statuses = await service.tree_statuses("root")
        assert set(statuses.values()) == {"completed"}
        rows = {r["id"]: r for r in sqlite_rows(db)}
        assert_every_side_effect_counted(marker, rows, {f"t{i}" for i in range(18)}, completed_before)
        assert {r["attempt"] for tid, r in rows.items() if tid != "root"} == {1}, "no attempt used up"
        assert any(r["interruptions"] == 1 for r in rows.values()), "the cut-off attempts are counted"
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        service.stop()


# --- PostgreSQL: two instances, one dies or stalls ---------------------------------------------

def pg_env(url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
            "SERVICE_LEASE_SECONDS": "2", "SERVICE_MAX_CONCURRENCY": "4", **(extra or {})}


def trees(marker: Path, count: int, size: int, seconds: float) -> list[list[dict[str, Any]]]:
    """`count` trees: a root depending on `size` commands, each depending on the one two before."""
    out = []
    for n in range(count):
        root = f"T{n}"
        kids = [command_task(f"{root}-{i}", root, marker, seconds, deps=[f"{root}-{i - 2}"] if i >= 2 else [])
                for i in range(size)]
        out.append([{"id": root, "name": root, "schemas": {"method": "noop_executor"},
                     "dependencies": [{"id": k["id"]} for k in kids]}, *kids])
    return out


async def pg_rows(url: str) -> list[dict[str, Any]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = [dict(r) for r in await conn.fetch(
            "SELECT id, status, dependencies, attempt, interruptions, error, result, started_at FROM tasks")]
    finally:
        await conn.close()
    for row in rows:
        row["dependencies"] = json.loads(row["dependencies"])
        row["result"] = json.loads(row["result"]) if row["result"] else None
    return rows


@contextlib.asynccontextmanager
async def two_instances_at_work(tmp_path: Path, url: str, marker: Path, seconds: float,
                                started: int) -> AsyncIterator[tuple[Service, Service]]:
    """Instances A and B on one database, three trees created on A, `started` tasks done."""
    a, b = start_together(Service(tmp_path, pg_env(url), "a"), Service(tmp_path, pg_env(url), "b"))
    try:
        for tree in trees(marker, 3, 8, seconds):
            await a.rpc("tasks.create", tree)

        async def some_done() -> bool:
            return len(side_effects(marker)) >= started

        await wait_until(some_done, 30, "part of the work")
        yield a, b
    finally:
        a.stop()
        b.stop()


@needs_postgres
async def test_kill_9_of_one_instance_the_other_finishes_every_tree(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    async with postgres_database() as url, two_instances_at_work(tmp_path, url, marker, 0.3, 6) as (a, b):
        a.kill()
        killed_at, killed_wall = time.monotonic(), datetime.now(timezone.utc)
        completed_before = {r["id"] for r in await pg_rows(url) if r["status"] == "completed"}
        interrupted = {r["id"] for r in await pg_rows(url) if r["status"] == "in_progress"}

        async def all_done() -> bool:
            return {r["status"] for r in await pg_rows(url)} == {"completed"}

        await wait_until(all_done, 60, "the survivor to finish every tree")
        took = time.monotonic() - killed_at
        rows = {r["id"]: r for r in await pg_rows(url)}
        assert_every_side_effect_counted(marker, rows, {tid for tid in rows if "-" in tid}, completed_before)
        assert interrupted, "the kill cut off attempts in progress"
        for tid in interrupted:
            assert rows[tid]["attempt"] == 1 and rows[tid]["interruptions"] == 1, rows[tid]
        assert {r["attempt"] for tid, r in rows.items() if "-" in tid} == {1}, "no retry was used up"
        # The survivor took the interrupted work over within the lease (2 s) + 2 s of the kill (the
        # re-runs' stored start times; 2 s more for a loaded test machine), then finished everything.
        restarted = max(datetime.fromisoformat(rows[tid]["started_at"]) for tid in interrupted)
        assert (restarted - killed_wall).total_seconds() < 2 + 2 + 2, (restarted, killed_wall)
        assert took < 2 + 2 + 24 * 0.3 / 4 + 10, f"took {took:.1f}s"
        assert "continuing the execution" in b.log()
        assert not contradictions(list(rows.values()))


@needs_postgres
async def test_a_paused_instance_writes_nothing_stale_and_no_tree_contradicts_itself(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    async with postgres_database() as url, two_instances_at_work(tmp_path, url, marker, 0.4, 4) as (a, b):
        a.pause()  # past its lease: B takes over; A's children go on and finish meanwhile
        completed_before = {r["id"] for r in await pg_rows(url) if r["status"] == "completed"}
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert not contradictions(await pg_rows(url))
            await asyncio.sleep(0.3)
        a.resume()

        async def all_done() -> bool:
            rows = await pg_rows(url)
            assert not contradictions(rows)
            return {r["status"] for r in rows} == {"completed"}

        await wait_until(all_done, 60, "every tree to complete")
        await asyncio.sleep(1.5)  # A had time to try its late writes
        rows = {r["id"]: r for r in await pg_rows(url)}
        assert {r["status"] for r in rows.values()} == {"completed"}
        assert not contradictions(list(rows.values()))
        # Default policy: nothing used up a retry. Each stored outcome is that of the task's latest
        # run (the interruption count it printed), never a stale one of A's.
        for tid, row in rows.items():
            if "-" in tid:
                assert row["attempt"] == 1, row
                assert row["result"]["stdout"].strip() == str(row["interruptions"]), row
        assert any(row["interruptions"] for row in rows.values()), "the pause cut off attempts"
        assert "dropping the run" in a.log(), "the stale instance found out and stopped"
        assert_every_side_effect_counted(marker, rows, {tid for tid in rows if "-" in tid}, completed_before)


async def joined_stream(service: Service, root: str, joined: asyncio.Event) -> list[dict[str, Any]]:
    """The events of a streaming tasks.execute of `root` on `service`; `joined` is set once its
    first event (the answer) arrived."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.execute", "params": {"task_id": root, "use_streaming": True}}
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as http, http.stream("POST", f"{service.url}/tasks", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
                joined.set()
    return events


@needs_postgres
async def test_streams_joined_on_b_end_with_final_when_the_owner_is_killed(tmp_path: Path) -> None:
    """Streams on B for the trees A runs (`already_running`, issue 25 item 4), then kill -9 of A: B
    takes the trees over and every stream ends with one `final` carrying the stored outcome;
    nothing that completed before the kill runs again."""
    marker = tmp_path / "ran.txt"
    async with postgres_database() as url, two_instances_at_work(tmp_path, url, marker, 0.3, 3) as (a, b):
        joined = [asyncio.Event() for _ in range(3)]
        streams = [asyncio.create_task(joined_stream(b, f"T{n}", joined[n])) for n in range(3)]
        for event in joined:
            await asyncio.wait_for(event.wait(), 30)
        a.kill()
        completed_before = {r["id"] for r in await pg_rows(url) if r["status"] == "completed"}
        assert len(completed_before) < 24, "the kill came mid-work"
        for events in await asyncio.wait_for(asyncio.gather(*streams), 90):
            assert events[0]["result"]["status"] == "already_running", events[0]
            kinds = [e.get("type") for e in events[1:]]
            assert kinds[-2:] == ["final", "stream_end"] and kinds.count("final") == 1, kinds
            assert events[-2]["status"] == "completed", events[-2]
        rows = {r["id"]: r for r in await pg_rows(url)}
        assert {r["status"] for r in rows.values()} == {"completed"}
        assert {r["attempt"] for tid, r in rows.items() if "-" in tid} == {1}, "no retry was used up"
        assert not contradictions(list(rows.values()))
        assert_every_side_effect_counted(marker, rows, {tid for tid in rows if "-" in tid}, completed_before)


async def test_the_final_webhook_still_arrives_after_a_crash(tmp_path: Path) -> None:
    """The webhook_config of tasks.execute is part of the stored execution: after kill -9 and a
    restart, the resumed execution still posts its remaining events and `final` to it."""
    from tests.servers import receiver

    marker = tmp_path / "ran.txt"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_COMMAND_ALLOWLIST": "sh"}
    service = Service(tmp_path, env).start()
    try:
        async with receiver() as hook:
            await service.rpc("tasks.create", [
                {"id": "root", "name": "root", "schemas": {"method": "noop_executor"},
                 "dependencies": [{"id": "a"}, {"id": "b"}]},
                command_task("a", "root", marker, 0.1), command_task("b", "root", marker, 0.1, deps=["a"])])
            await service.wait_status("root", ("completed",))
            copy = await service.rpc("tasks.copy", {"task_id": "root"})  # stored, not run
            slow = next(c for c in copy["children"] if c["original_task_id"] == "b")
            await service.rpc("tasks.update", {"task_id": slow["id"], "inputs": {
                "command": ["sh", "-c", f"sleep 2; echo $TASKGROVE_TASK_ID:$TASKGROVE_ATTEMPT:$TASKGROVE_INTERRUPTIONS >> {marker}"]}})
            await service.rpc("tasks.execute", {"task_id": copy["id"], "webhook_config": {"url": hook.url}})
            await service.wait_status(slow["id"], ("in_progress",))
            service.kill()
            service.start()
            await hook.wait_for(lambda reqs: any(r["json"]["type"] == "final" for r in reqs), timeout=20)
            final = next(r["json"] for r in hook.requests if r["json"]["type"] == "final")
            assert final["root_task_id"] == copy["id"] and final["status"] == "completed"
            # The killed service's orphaned command may still finish its work (at-least-once); the
            # re-run, interruption 1 of the same attempt 1, did it in any case.
            assert (slow["id"], 1, 1) in _records(marker), _records(marker)
            assert side_effects(marker)[slow["id"]] <= 2
    finally:
        service.stop()


@needs_postgres
async def test_creates_cut_off_by_a_crash_can_be_resent_to_the_survivor(tmp_path: Path) -> None:
    """The client of a create cut off by kill -9 cannot tell whether its tree was stored: sending
    the same create to another instance answers with the stored tree (or creates it), never
    "already exists", and every tree ends up run."""
    import httpx

    marker = tmp_path / "ran.txt"
    async with postgres_database() as url:
        env = pg_env(url, {"SERVICE_CREATE_WAIT_TIMEOUT": "30"})
        a, b = start_together(Service(tmp_path, env, "a"), Service(tmp_path, env, "b"))
        try:
            forest = trees(marker, 5, 6, 0.3)
            calls = [asyncio.create_task(a.call("tasks.create", tree)) for tree in forest]
            await asyncio.sleep(1.0)  # some stored and running, none finished
            a.kill()
            for call in calls:
                try:
                    await call
                except httpx.HTTPError:
                    pass  # cut off: the client does not know what happened
            answers = [await b.call("tasks.create", tree) for tree in forest]
            assert all("error" not in answer for answer in answers), answers
            assert [answer["result"]["id"] for answer in answers] == [tree[0]["id"] for tree in forest]
            for tree in forest:
                await b.wait_status(tree[0]["id"], ("completed",))
            counts = side_effects(marker)
            assert all(1 <= counts[t["id"]] <= 2 for tree in forest for t in tree[1:]), counts
        finally:
            a.stop()
            b.stop()


async def test_sigterm_lets_running_tasks_finish_then_exits_0_and_the_rest_resumes(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_COMMAND_ALLOWLIST": "sh", "SERVICE_SHUTDOWN_GRACE_SECONDS": "10"}
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", [
            {"id": "root", "name": "root", "schemas": {"method": "noop_executor"},
             "dependencies": [{"id": "first"}, {"id": "second"}]},
            command_task("first", "root", marker, 1.0, attempts=1),
            command_task("second", "root", marker, 0.1, deps=["first"], attempts=1)])
        await service.wait_status("first", ("in_progress",))
        started = time.monotonic()
        assert service.stop() == 0, service.log()
        assert time.monotonic() - started < 10
        assert side_effects(marker) == Counter({"first": 1}), "the running task finished; nothing new started"
        service.start()
        await service.wait_status("root", ("completed",))
        assert side_effects(marker) == Counter({"first": 1, "second": 1})
        assert (await service.task("first"))["attempt"] == 1
    finally:
        service.stop()


@needs_postgres
async def test_two_instances_started_at_once_on_an_empty_database_both_come_up(tmp_path: Path) -> None:
    async with postgres_database() as url:
        # One migrates under the advisory lock, the other finds nothing to do.
        services = start_together(*(Service(tmp_path, pg_env(url), f"s{n}") for n in range(2)))
        try:
            for n, service in enumerate(services):
                await service.rpc("tasks.create", [{"id": f"t{n}", "name": "t", "schemas": {
                    "method": "noop_executor"}}], timeout=30)
                assert (await service.wait_status(f"t{n}", ("completed",)))["status"] == "completed"
        finally:
            for service in services:
                service.stop()


async def test_json_logs_carry_the_task_and_never_a_secret(tmp_path: Path) -> None:
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", "SERVICE_LOG_FORMAT": "json",
           "SERVICE_LOG_LEVEL": "warning", "SERVICE_COMMAND_ALLOWLIST": "sh"}
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", [{"id": "boom", "name": "boom", "schemas": {"method": "rest_executor"},
                                            "inputs": {"url": "http://user:hunter2@127.0.0.1:9/x?token=s3cret",
                                                       "timeout": 0.5, "retries": 0}}])
        await service.rpc("tasks.execute", {"task_id": "boom", "webhook_config": {
            "url": "http://127.0.0.1:9/hook?token=s3cret", "max_retries": 0}})
        await asyncio.sleep(1.5)
    finally:
        assert service.stop() == 0
    lines = [line for line in service.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert all(r["level"] in ("WARNING", "ERROR", "CRITICAL") for r in records), "SERVICE_LOG_LEVEL=warning"
    assert any(r["logger"] == "taskgrove.agent.engine.webhooks" for r in records)
    assert "hunter2" not in service.log() and "s3cret" not in service.log()


@needs_postgres
async def test_lost_database_connections_leave_no_tree_unfinished(tmp_path: Path) -> None:
    """Every connection of the instance cut by the database server (a failover, a restart, an
    admin's pg_terminate_backend) in the middle of the work: the instance reconnects, and every
    tree still completes under the default retry policy, none contradicting itself."""
    import asyncpg

    marker = tmp_path / "ran.txt"
    async with postgres_database() as url:
        a = Service(tmp_path, pg_env(url), "a").start()
        try:
            for tree in trees(marker, 3, 8, 0.3):
                await a.rpc("tasks.create", tree)

            async def some_done() -> bool:
                return len(side_effects(marker)) >= 5

            await wait_until(some_done, 30, "part of the work")
            admin = await asyncpg.connect(url)
            try:
                for _ in range(3):  # again while it reconnects
                    cut = await admin.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                    assert cut >= 1
                    await asyncio.sleep(0.5)
            finally:
                await admin.close()

            async def all_done() -> bool:
                rows = await pg_rows(url)
                assert not contradictions(rows)
                return {r["status"] for r in rows} == {"completed"}

            await wait_until(all_done, 60, "every tree to complete after the connections were cut")
            counts = side_effects(marker)
            assert all(1 <= counts[f"T{n}-{i}"] <= 2 for n in range(3) for i in range(8)), counts
            assert {r["attempt"] for r in await pg_rows(url) if "-" in r["id"]} == {1}
        finally:
            a.stop()
