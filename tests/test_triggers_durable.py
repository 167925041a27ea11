"""Event triggers (docs/triggers.md), what is stored for them: an emit stores the event and the
trigger rows it makes in one transaction (cut between the two, nothing is stored, and the resent
emit starts its run exactly once), and retention sweeps the handled trigger rows, never a waiting
one, nor a trigger's template. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.sql.elements import ColumnElement

from taskgrove.storage import trigger_store
from taskgrove.storage.models import events_table
from taskgrove.storage.trigger_models import trigger_events_table
from tests.conftest import Client
from tests.test_triggers import WAIT, noop_template, runs, until


async def count(client: Client, table: Any, *where: ColumnElement[bool]) -> int:
    query = select(func.count()).select_from(table).where(*where)
    return int(await client.services.repo.transact(lambda c: c.execute(query).scalar()))


async def test_an_emit_cut_between_the_event_and_its_trigger_rows_stores_neither_and_runs_once_when_resent(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    await noop_template(client)
    trigger = await client.result("triggers.create", {"task_id": "tpl", "event": "deploy"})
    real, cuts = trigger_store.take_in, []

    def cut_once(*args: Any) -> int:  # the second step of storing an event: its trigger rows
        if not cuts:
            cuts.append(args)
            raise RuntimeError("the process died between the event and its trigger rows")
        return real(*args)

    monkeypatch.setattr(trigger_store, "take_in", cut_once)
    key = {"Idempotency-Key": "deploy-7"}
    failed = await client.error("events.emit", {"name": "deploy", "payload": {"v": 7}}, headers=key)
    assert failed["code"] == -32603 and cuts
    # Nothing of the emit was stored: not the event, not a trigger row (one transaction).
    assert await count(client, events_table, events_table.c.name == "deploy") == 0
    assert await count(client, trigger_events_table) == 0
    assert (await client.result("triggers.get", {"trigger_id": trigger["id"]}))["matched"] == 0

    resent = await client.result("events.emit", {"name": "deploy", "payload": {"v": 7}}, headers=key)
    assert resent["triggered"] == 1
    started = await until(lambda: runs(client, trigger["id"]), "the resent event's run")
    root = await client.wait_status(started[0]["root_task_id"], ("completed",), timeout=WAIT)
    assert root["inputs"]["event"] == {"v": 7} and root["trigger_event_ids"] == [resent["event_id"]]
    again = await client.result("events.emit", {"name": "deploy", "payload": {"v": 7}}, headers=key)
    assert again == resent  # the key answers the stored emit and starts nothing more
    await until(client.runs_ended, "the run's end")
    await asyncio.sleep(0.2)  # a second run, if any, would have started by now
    assert len(await runs(client, trigger["id"])) == 1
    assert await count(client, events_table, events_table.c.name == "deploy") == 1
    assert await count(client, trigger_events_table) == 1
    found = await client.result("triggers.get", {"trigger_id": trigger["id"]})
    assert (found["matched"], found["runs"], found["waiting"]) == (1, 1, 0)


async def test_retention_sweeps_handled_trigger_rows_and_keeps_waiting_ones_and_the_template(
        client: Client) -> None:
    await noop_template(client)
    # The template itself was run and ended: still a trigger's template, retention keeps it.
    await client.result("tasks.execute", {"task_id": "tpl"})
    await client.wait_status("tpl", ("completed",), timeout=WAIT)
    now = await client.result("triggers.create", {"task_id": "tpl", "event": "now"})
    later = await client.result("triggers.create", {"task_id": "tpl", "event": "later",
                                                    "batch": {"size": 10, "seconds": 3600}})
    for n in range(3):
        await client.result("events.emit", {"name": "now", "payload": {"n": n}})
    await client.result("events.emit", {"name": "later", "payload": {"n": 0}})
    await until(lambda: _ended(client, now["id"], 3), "three runs ended")
    await until(client.runs_ended, "the runs' end")

    kept = await client.result("tasks.purge", {"older_than": "30d"})
    assert kept["trigger_events"] == 0 and await count(client, trigger_events_table) == 4
    await asyncio.sleep(0.05)  # every handled row was handled more than 0.01 s ago
    swept = await client.result("tasks.purge", {"older_than": 0.01})
    assert swept["trigger_events"] == 3
    left = await client.services.repo.transact(
        lambda c: [dict(r._mapping) for r in c.execute(select(trigger_events_table))])
    assert [(r["trigger_id"], r["handled_at"]) for r in left] == [(later["id"], None)]
    assert (await client.result("triggers.get", {"trigger_id": later["id"]}))["waiting"] == 1
    assert (await client.result("tasks.get", {"task_id": "tpl"}))["status"] == "completed"
    metrics = (await client.http.get("/metrics")).text
    assert 'taskgrove_retention_deleted_total{kind="trigger_events"} 3.0' in metrics

    # The trigger still runs from its template after the sweep.
    await client.result("events.emit", {"name": "now", "payload": {"n": 3}})
    await until(lambda: _started(client, now["id"], 4), "a run after the sweep")
    again = await client.result("tasks.purge", {"older_than": "1s"})
    assert again["trigger_events"] == 0


async def _ended(client: Client, trigger_id: str, n: int) -> bool:
    found = await runs(client, trigger_id)
    return len(found) >= n and all(run["final_status"] for run in found)


async def _started(client: Client, trigger_id: str, n: int) -> bool:
    # The runs whose trees retention deleted are still listed (their row in trigger_runs stays).
    return (await client.result("triggers.get", {"trigger_id": trigger_id}))["runs"] >= n
