"""A write in flight when the database goes away is either stored or clearly refused (issue 46,
item 3), and resending it afterwards gives the stored result or stores it once.

The database is cut at the connection layer (tests/db_faults.py) at the n-th statement or commit
after the request is sent, for n = 1, 2, ... until a request goes through untouched; and, as a
connection lost while the answer to COMMIT travels back, right after the n-th commit. Each time:
the answer is the result or the retryable -32050 (never -32603); then the same request is sent
again, and what is stored is what one request stores.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services import idempotent
from tests.conftest import Client, running_app
from tests.db_faults import DatabaseCut, database_cut
from tests.test_engine import task

MAX_POINTS = 40


def settings(path: Path) -> Settings:
    return Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{path}", "SERVICE_RATE_LIMIT_PER_USER": "0",
                              "SERVICE_CREATE_WAIT_TIMEOUT": "0"})


async def post(client: Client, method: str, params: Any, key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return await client.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                  headers=headers)


def stored_or_refused(response: Any) -> bool:
    """True when the answer is the result; False when it is the documented refusal."""
    body = response.json()
    if response.status_code == 200 and "result" in body:
        return True
    assert response.status_code == 503, response.text
    assert body["error"]["code"] == DATABASE_UNAVAILABLE, body
    assert int(response.headers["Retry-After"]) >= 1
    return False


async def at_every_point(client: Client, cut: DatabaseCut, send: Callable[[int, bool], Awaitable[Any]],
                         check: Callable[[int, bool], Awaitable[None]],
                         prepare: Callable[[int, bool], Awaitable[None]] | None = None) -> int:
    """Cut at the n-th point for n = 1.. (before, then after commits) until a send is over before
    its n-th point (after commits: a point that is a statement is passed uncut, the next n goes
    on); resend after each; `check` what is stored. Returns how many cuts were met."""
    met = 0
    for after_commit in (False, True):
        for n in range(1, MAX_POINTS):
            if prepare is not None:
                await prepare(n, after_commit)
            cut.at(n, after_commit=after_commit)
            first = await send(n, after_commit)
            hit, seen = cut.failed, cut.count
            cut.up()
            stored_or_refused(first)
            again = await send(n, after_commit)
            assert stored_or_refused(again), again.text
            await check(n, after_commit)
            met += bool(hit)
            if not hit and seen < n:  # the send is over before its n-th point: every point was cut
                break
    return met


def rows(path: Path, sql: str, *args: Any) -> list[Any]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, args).fetchall()


async def test_a_create_cut_anywhere_is_stored_once_when_resent(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            def tree(n: int, after: bool) -> list[dict[str, Any]]:
                root = f"c{n}{'x' if after else ''}"
                return [task(root), task(f"{root}-a", root), task(f"{root}-b", root, deps=[f"{root}-a"])]

            async def send(n: int, after: bool) -> Any:
                return await post(client, "tasks.create", tree(n, after))

            async def check(n: int, after: bool) -> None:
                root = tree(n, after)[0]["id"]
                assert rows(path, "SELECT count(*) FROM tasks WHERE task_tree_id = ?", root) == [(3,)]
                assert rows(path, "SELECT count(*) FROM executions WHERE task_tree_id = ?", root) == [(1,)]
                # A tree whose insert lost its commit's answer is stored, leased to this instance
                # with no run in memory: the resend runs it (engine/run_keeper.py `_orphaned`).
                for tid in (root, f"{root}-a", f"{root}-b"):
                    found = await client.wait_status(tid, ("completed", "failed"), timeout=60)
                    assert found["status"] == "completed", found

            # The engine's own statements take some of the cut points, so fewer land in a create.
            assert await at_every_point(client, cut, send, check) >= 1


async def test_a_create_without_ids_cut_anywhere_is_stored_once_when_resent_with_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ids to find the tree by: the key's request gets ids derived from the key
    (agent/services/idempotent.with_ids), so a resend carried out afresh names the same tree."""
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            roots: dict[str, str] = {}

            def name(n: int, after: bool) -> str:
                return f"k{n}{'x' if after else ''}"

            async def send(n: int, after: bool) -> Any:
                root = name(n, after)
                tree = {"name": root, "schemas": {"method": "noop_executor"},
                        "children": [{"name": f"{root}-a", "schemas": {"method": "noop_executor"}},
                                     {"name": f"{root}-b", "schemas": {"method": "noop_executor"}}]}
                response = await post(client, "tasks.create", {"tasks": [tree]}, key=root)
                if response.status_code == 200 and "result" in response.json():
                    assert roots.setdefault(root, response.json()["result"]["id"]) == response.json()["result"]["id"]
                return response

            async def check(n: int, after: bool) -> None:
                root = name(n, after)
                stored = rows(path, "SELECT id, status FROM tasks WHERE name LIKE ? || '%'", root)
                assert len(stored) == 3 and {tid for tid, _ in stored} >= {roots[root]}, stored
                for tid, _ in stored:
                    assert (await client.wait_status(tid, ("completed", "failed"), timeout=60))["status"] == "completed"

            monkeypatch.setattr(idempotent, "IN_FLIGHT_WAIT", 2.0)
            assert await at_every_point(client, cut, send, check) >= 1


async def test_an_update_cut_anywhere_is_applied_once_when_resent(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            blocker = task("blocker", method="sleep_executor", inputs={"seconds": 600})
            await client.result("tasks.create", [blocker, task("held", "blocker", deps=["blocker"])])

            async def send(n: int, after: bool) -> Any:
                return await post(client, "tasks.update", {"task_id": "held", "description": f"d{n}{after}"})

            async def check(n: int, after: bool) -> None:
                held = await client.result("tasks.get", {"task_id": "held"})
                assert held["description"] == f"d{n}{after}" and held["status"] == "pending", held

            assert await at_every_point(client, cut, send, check) >= 1


async def test_an_emit_cut_anywhere_is_stored_once_when_resent_with_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            answers: dict[str, Any] = {}

            async def send(n: int, after: bool) -> Any:
                name = f"e{n}{'x' if after else ''}"
                response = await post(client, "events.emit", {"name": name, "payload": {"n": n}}, key=name)
                if response.status_code == 200 and "result" in response.json():
                    answers.setdefault(name, response.json()["result"])
                    assert response.json()["result"] == answers[name]  # a resend answers the first answer
                return response

            async def check(n: int, after: bool) -> None:
                name = f"e{n}{'x' if after else ''}"
                # Once: the event and its key's mark commit together (storage/idempotency.marked),
                # and a key whose attempt ended here unsettled is known to have ended
                # (agent/services/idempotent.py), so the resend neither repeats nor is refused.
                assert rows(path, "SELECT count(*) FROM events WHERE name = ?", name) == [(1,)], name

            monkeypatch.setattr(idempotent, "IN_FLIGHT_WAIT", 2.0)  # how long a resend waits for a first answer
            assert await at_every_point(client, cut, send, check) >= 1


async def test_a_respond_cut_anywhere_is_answered_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tasks.respond is a compare-and-set on the wait (storage/wait_store.answer): cut anywhere, the
    answer is stored once or not at all. A resend gives the result when the first stored nothing,
    else the documented -32602 "not waiting for input" (the wait is answered, as for any second
    answer, also when the first's caller saw the outage); either way the task completes with that
    answer, once, in its first attempt."""
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            met = 0
            for after_commit in (False, True):
                for n in range(1, MAX_POINTS):
                    tid = f"w{n}{'x' if after_commit else ''}"
                    await client.result("tasks.create", [task(tid, method="human_input_executor",
                                                              inputs={"prompt": "go?"})])
                    while not (await client.result("tasks.get", {"task_id": tid}))["waiting"]:
                        await asyncio.sleep(0.02)
                    cut.at(n, after_commit=after_commit)
                    first = await post(client, "tasks.respond", {"task_id": tid, "value": n})
                    hit, seen = cut.failed, cut.count
                    cut.up()
                    stored_or_refused(first)
                    again = (await post(client, "tasks.respond", {"task_id": tid, "value": n})).json()
                    if "error" in again:  # the first answer was stored (seen by its caller or not)
                        assert again["error"]["code"] == -32602, again
                        assert "not waiting for input" in again["error"]["message"], again
                    else:  # the first was refused and stored nothing: this one answers
                        assert again["result"]["status"] == "resumed", again
                    done = await client.wait_status(tid, ("completed", "failed"), timeout=60)
                    assert done["status"] == "completed" and done["result"] == n and done["attempt"] == 1, done
                    met += bool(hit)
                    if not hit and seen < n:
                        break
            assert met >= 1


async def test_an_emit_cut_anywhere_resumes_its_waiting_task_once(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An emit cut after its event was stored, before the waits it answers were resumed: the
    resend with its key completes it (resumes them) instead of emitting again."""
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        async with running_app(settings(path)) as client:
            def name(n: int, after: bool) -> str:
                return f"go{n}{'x' if after else ''}"

            async def prepare(n: int, after: bool) -> None:
                waiter = task(name(n, after), method="event_wait_executor", inputs={"event": name(n, after)})
                await client.result("tasks.create", [waiter])
                while not (await client.result("tasks.get", {"task_id": name(n, after)}))["waiting"]:
                    await asyncio.sleep(0.02)

            async def send(n: int, after: bool) -> Any:
                return await post(client, "events.emit", {"name": name(n, after), "payload": {"n": n}},
                                  key=name(n, after))

            async def check(n: int, after: bool) -> None:
                assert rows(path, "SELECT count(*) FROM events WHERE name = ?", name(n, after)) == [(1,)]
                done = await client.wait_status(name(n, after), ("completed", "failed"), timeout=60)
                assert done["status"] == "completed" and done["result"] == {"n": n} and done["attempt"] == 1, done

            monkeypatch.setattr(idempotent, "IN_FLIGHT_WAIT", 2.0)
            assert await at_every_point(client, cut, send, check, prepare) >= 1


async def test_a_tree_whose_create_lost_its_commits_answer_runs_without_a_resend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody resends: the lease keeper takes up an execution of its own instance that has no
    run there once its lease ran out (storage/executions.take_over's `driven`)."""
    path = tmp_path / "cut.db"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{path}", "SERVICE_RATE_LIMIT_PER_USER": "0",
           "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_LEASE_SECONDS": "2"}
    with database_cut(monkeypatch) as cut:
        async with running_app(Settings.from_env(env)) as client:
            orphan = None
            for n in range(1, MAX_POINTS):
                root = f"L{n}"
                cut.at(n, after_commit=True)
                response = await post(client, "tasks.create", [task(root), task(f"{root}-a", root)])
                cut.up()
                if not stored_or_refused(response) and rows(path, "SELECT count(*) FROM tasks WHERE id = ?",
                                                            root) == [(1,)]:
                    orphan = root  # stored, its caller told the database was away
                    break
            assert orphan is not None
            for tid in (orphan, f"{orphan}-a"):
                found = await client.wait_status(tid, ("completed", "failed"), timeout=60)
                assert found["status"] == "completed", found


async def test_a_key_left_reserved_by_an_outage_is_settled_once_the_database_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes away at the n-th point of an emit and stays away, so the key's release
    or answer cannot be written either; once it is back, the instance settles the key by itself
    (agent/services/idempotent.py `_keep_settling`): no reservation is left in flight, which a
    resend to another instance would wait for in vain. Then a resend stores the event once."""
    path = tmp_path / "cut.db"
    with database_cut(monkeypatch) as cut:
        cut_here = cut._cut_here

        def stays_down(is_commit: bool) -> bool:  # from the first cut on, every point is cut
            cut.is_down = cut_here(is_commit) or cut.is_down
            return cut.is_down

        monkeypatch.setattr(cut, "_cut_here", stays_down)
        async with running_app(settings(path)) as client:
            met = 0
            for n in range(1, MAX_POINTS):
                name = f"bg{n}"
                cut.at(n)
                first = await post(client, "events.emit", {"name": name}, key=name)
                hit, seen = cut.failed, cut.count
                cut.up()
                stored_or_refused(first)
                in_flight = "SELECT count(*) FROM idempotency_keys WHERE key = ? AND answer IS NULL"
                deadline = asyncio.get_running_loop().time() + 60
                while rows(path, in_flight, name) != [(0,)]:
                    assert asyncio.get_running_loop().time() < deadline, f"{name} is left reserved"
                    await asyncio.sleep(0.1)
                again = await post(client, "events.emit", {"name": name}, key=name)
                assert stored_or_refused(again), again.text
                assert rows(path, "SELECT count(*) FROM events WHERE name = ?", name) == [(1,)], name
                met += bool(hit)
                if not hit and seen < n:
                    break
            assert met >= 1
