"""Concurrency keys and rate limits (issue 26): counted in the database, across instances, from
the tasks' own stored start and end times; a task waiting for its key or rate holds no slot."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import POSTGRES_URL, Client
from tests.deadlines import EVENT_WAIT


def nap(tid: str, parent: str | None, seconds: float, **extra: Any) -> dict[str, Any]:
    task = {"id": tid, "name": tid, "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": seconds}, **extra}
    if parent:
        task["parent_id"] = parent
    return task


def fan(root: str, kids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": root, "name": root, "dependencies": [{"id": k["id"]} for k in kids]}, *kids]


def stamp(value: str) -> datetime:
    return datetime.fromisoformat(value)


def most_at_once(rows: list[dict[str, Any]]) -> int:
    """The most of `rows` in progress at one moment, from their stored started_at/completed_at."""
    edges = sorted([(stamp(r["started_at"]), 1) for r in rows] + [(stamp(r["completed_at"]), -1) for r in rows],
                   key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


async def finished(client: Client, ids: list[str], timeout: float = EVENT_WAIT) -> list[dict[str, Any]]:
    return [await client.wait_status(tid, ("completed",), timeout=timeout) for tid in ids]


async def test_at_most_limit_tasks_of_a_key_run_at_once(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_CONCURRENCY": "8"}) as client:
        kids = [nap(f"k{i}", "root", 0.2, concurrency={"key": "api-{user_id}", "limit": 2}, user_id="u")
                for i in range(6)]
        await client.result("tasks.create", fan("root", kids))
        # Meanwhile an unlimited task still runs at once: waiting keyed tasks hold no slot.
        rows = await finished(client, [k["id"] for k in kids])
        assert most_at_once(rows) == 2, rows
        assert rows[0]["concurrency"] == {"key": "api-u", "limit": 2}


async def test_a_waiting_keyed_task_holds_no_slot(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_CONCURRENCY": "2",
                            "SERVICE_CONCURRENCY_LIMITS": "one=1"}) as client:
        kids = [nap(f"k{i}", "root", 0.4, concurrency={"key": "one"}) for i in range(4)]
        await client.result("tasks.create", fan("root", kids))
        # Each pass with a free slot tries a queued kid; refused for its key, it waits without a
        # slot and says so (until it starts). On a busy machine that takes a few passes: look again.
        for _ in range(100):
            await asyncio.sleep(0.02)
            waiting = [await client.result("tasks.get", {"task_id": k["id"]}) for k in kids]
            reasons = [t.get("waiting_for") for t in waiting if t["status"] == "pending"]
            if reasons and all(r == "concurrency key one (1/1)" for r in reasons):
                break
        assert reasons and all(r == "concurrency key one (1/1)" for r in reasons), waiting
        await client.result("tasks.create", [nap("free", None, 0.01)])
        free = await client.wait_status("free", ("completed",))
        keyed = await finished(client, [k["id"] for k in kids])
        assert most_at_once(keyed) == 1
        assert stamp(free["completed_at"]) < max(stamp(k["completed_at"]) for k in keyed[:2]), \
            "the unkeyed task ran while the keyed ones waited for their key, not after them"


async def test_a_rate_spaces_the_starts_of_its_key(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        kids = [nap(f"r{i}", "root", 0.0, rate_limit={"key": "search", "per_second": 5}) for i in range(5)]
        await client.result("tasks.create", fan("root", kids))
        rows = sorted(await finished(client, [k["id"] for k in kids]), key=lambda r: r["started_at"])
        gaps = [(stamp(b["started_at"]) - stamp(a["started_at"])).total_seconds() for a, b in zip(rows, rows[1:])]
        assert all(gap >= 0.2 - 0.005 for gap in gaps), gaps


@pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")
async def test_two_instances_on_one_database_share_a_key() -> None:
    """Several instances share one database on PostgreSQL only (SQLite has one instance)."""
    from taskgrove.agent.foundations.settings import Settings
    from tests.conftest import postgres_database, running_app

    async with postgres_database() as url:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                      "SERVICE_CONCURRENCY_LIMITS": "shared=2", "SERVICE_RATE_LIMITS": "paced=4/s"})
        async with running_app(settings) as a, running_app(settings) as b:
            await _share_a_key(a, b)


async def _share_a_key(a: Client, b: Client) -> None:
    """Each instance creates (so drives) its own trees of the shared key and the shared rate."""
    for client, name in ((a, "A"), (b, "B")):
        await client.result("tasks.create", fan(name, [nap(f"{name}{i}", name, 0.2, concurrency={"key": "shared"})
                                                       for i in range(4)]))
        await client.result("tasks.create", fan(f"p{name}", [nap(f"p{name}{i}", f"p{name}", 0.0,
                                                                   rate_limit={"key": "paced"}) for i in range(3)]))
    keyed = await finished(a, [f"{n}{i}" for n in "AB" for i in range(4)])
    assert most_at_once(keyed) == 2, keyed
    paced = sorted(await finished(a, [f"p{n}{i}" for n in "AB" for i in range(3)]), key=lambda r: r["started_at"])
    gaps = [(stamp(y["started_at"]) - stamp(x["started_at"])).total_seconds() for x, y in zip(paced, paced[1:])]
    assert all(gap >= 0.25 - 0.005 for gap in gaps), gaps


BAD = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
                st.lists(st.integers(), max_size=2),
                st.dictionaries(st.sampled_from(["key", "limit", "per_second", "per_minute", "x"]),
                                st.one_of(st.integers(-2, 3), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                                          st.none(), st.booleans()), max_size=4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(concurrency=BAD, rate=BAD)
async def test_any_value_of_the_fields_is_stored_or_refused_with_32602(client: Client, concurrency: Any,
                                                                       rate: Any) -> None:
    answer = await client.call("tasks.create", [{"name": "t", "concurrency": concurrency, "rate_limit": rate,
                                                 "inputs": {"n": 1}}])
    if "error" in answer:
        assert answer["error"]["code"] == -32602, answer
    else:
        assert answer["result"]["id"]


async def test_metrics_show_each_users_tasks_with_bounded_labels(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_CONCURRENCY": "4",
                            "SERVICE_CONCURRENCY_LIMITS": "one=1"}) as client:
        for u in range(25):  # more users than /metrics names
            await client.result("tasks.create", fan(f"root{u}", [nap(f"u{u}-{i}", f"root{u}", 2, user_id=f"user{u}",
                                                                     concurrency={"key": "one"}) for i in range(2)]))
        await asyncio.sleep(0.3)  # the first of key `one` runs (2 s), the others wait
        text = (await client.http.get("/metrics")).text
        lines = [line for line in text.splitlines() if line.startswith("taskgrove_user_tasks{")]
        users = {line.split('user="')[1].split('"')[0] for line in lines}
        assert len(users) == 21 and "other" in users, users  # 20 busiest by name, the rest summed
        total = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
        assert total == 50, lines  # every task of the 25 trees: one running, the rest waiting for the key
        assert 'taskgrove_deferrals_total{reason="key"}' in text
