"""The same calls answer the same on SQLite and on PostgreSQL, over real `taskgrove serve`
processes.

Each backend has fast paths of its own (plain SQLite cursors; asyncpg statements reading JSON
documents on PostgreSQL), and a value one of them cannot carry shows up as a difference here: a
NUL inside a JSON value once failed every PostgreSQL create (-32603) while SQLite stored it.
Ids holding LIKE wildcards, quotes and backslashes go through the paths that match JSON text
(dependents), and bad paging arguments through the list queries.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL, postgres_database
from tests.processes import Service, start_together

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")

NUL = "a\u0000b"
ODD_IDS = ["a%b", "a_b", 'q"q', "b\\s", "\u00e9\u2603", "x y", "%", "_"]


def calls() -> list[tuple[str, Any]]:
    noop = {"method": "noop_executor"}
    made: list[tuple[str, Any]] = [
        ("tasks.create", [{"id": "n1", "name": "n1", "inputs": {"k": NUL, NUL: [NUL]}, "params": {"p": NUL},
                           "custom\u0000": NUL, "schemas": noop},
                          {"id": "n2", "name": "n2", "parent_id": "n1", "dependencies": [{"id": "n1"}], "schemas": noop}]),
        ("tasks.get", {"task_id": "n1"}),
        ("tasks.tree", {"task_id": "n1"}),
        ("tasks.detail", {"task_id": "n1"}),
        ("tasks.update", {"task_id": "n2", "result": {"r": NUL}, "inputs": {"i": NUL}}),
        ("tasks.update", {"task_id": "n2", "error": NUL}),
        ("tasks.copy", {"task_id": "n1"}),
        ("tasks.create", [{"id": "big", "name": "big", "schemas": noop,
                           "inputs": {"n": 10 ** 30, "f": 1e300, "neg": -0.0, "e": "\U0001F600", "deep": [[[[[1]]]]]}}]),
        ("tasks.get", {"task_id": "big"}),
    ]
    for odd in ODD_IDS:
        made.append(("tasks.create", [{"id": f"r{odd}", "name": "r"}, {"id": odd, "name": "t", "parent_id": f"r{odd}"},
                                      {"id": f"d{odd}", "name": "d", "parent_id": f"r{odd}", "dependencies": [{"id": odd}]}]))
    for odd in ODD_IDS:
        made += [("tasks.get", {"task_id": odd}), ("tasks.children", {"task_id": f"r{odd}"}),
                 ("tasks.delete", {"task_id": odd}), ("tasks.list", {"parent_id": f"r{odd}"}),
                 ("tasks.copy", {"task_id": f"r{odd}"})]
    made += [("tasks.list", {"limit": 0}), ("tasks.list", {"offset": 10 ** 12}), ("tasks.list", {"status": "nope"}),
             ("tasks.list", {"user_id": "%"}), ("tasks.list", {"status": "completed", "limit": 1000}),
             ("tasks.running.count", {})]
    return made


def shown(answer: dict[str, Any]) -> str:
    """An answer with what differs by nature (times, generated ids) masked; lists of tasks in id
    order (created in the same second, their order is the database's)."""
    if isinstance(answer.get("result"), list):
        answer = {**answer, "result": sorted(answer["result"], key=lambda t: json.dumps(t, sort_keys=True))}
    text = json.dumps(answer, sort_keys=True)
    text = re.sub(r'"\d{4}-\d\d-\d\dT[^"]*"', '"<time>"', text)
    return re.sub(r'"[0-9a-f]{32}"|"[0-9a-f]{8}-[0-9a-f-]{27}"', '"<id>"', text)


async def answers(service: Service) -> list[str]:
    found = []
    for method, params in calls():
        answer = await service.call(method, params)
        assert answer.get("error", {}).get("code") != -32603, (method, answer)
        found.append(shown(answer))
    return found


async def test_sqlite_and_postgresql_answer_alike(tmp_path: Path) -> None:
    (tmp_path / "sqlite").mkdir()
    (tmp_path / "pg").mkdir()
    sqlite = Service(tmp_path / "sqlite", {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'sqlite' / 'db.sqlite'}"})
    async with postgres_database() as url:
        postgres = Service(tmp_path / "pg", {"SERVICE_DATABASE_URL": url}, name="postgres")
        try:
            start_together(sqlite, postgres)
            on_sqlite = await answers(sqlite)
            on_postgres = await answers(postgres)
        finally:
            sqlite.stop()
            postgres.stop()
    for (method, params), a, b in zip(calls(), on_sqlite, on_postgres):
        assert a == b, f"{method} {params!r}:\nsqlite:   {a[:600]}\npostgres: {b[:600]}"
