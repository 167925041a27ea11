"""What a SQLite create's commit costs, and what committing several creates together would save.

Inserts 5-task trees (wire.py's shape, 50 owners) with the engine's own insert
(storage.executions.insert_tree) on a connection like the one creates use on the event loop's
thread (storage.db.create_loop_engine), committing every `--batch` trees; with `--savepoints`
each tree sits in a savepoint of its own, as a batch would need to refuse one tree alone (a taken
id, a full quota). Prints CPU and commit time a tree and the WAL frames a tree wrote (the WAL is
never checkpointed here, so its size counts every frame).

    .venv/bin/python bench/commit_batch.py --batch 1
    .venv/bin/python bench/commit_batch.py --batch 4 --savepoints
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from typing import Any

from taskgrove.storage import db, new_tree, tree_insert
from taskgrove.storage.clock import now_iso


def five_task_tree(user: str) -> list[dict[str, Any]]:
    s = uuid.uuid4().hex[:10]
    tasks = [{"id": f"r{s}", "name": "root", "schemas": {"method": "aggregate_results_executor"},
              "dependencies": [{"id": f"c{i}{s}", "required": True} for i in range(4)]}]
    tasks += [{"id": f"c{i}{s}", "name": f"c{i}", "parent_id": f"r{s}", "schemas": {"method": "noop_executor"},
               "inputs": {"i": i}} for i in range(4)]
    return new_tree.prepare_new_tree(tasks, default_user=user)


async def measure(count: int, batch: int, savepoints: bool, temp_memory: bool) -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="taskgrove-commit-"), "bench.db")
    url = f"sqlite+aiosqlite:///{path}"
    await db.migrate(db.create_engine(url))
    engine = db.create_loop_engine(url)
    assert engine is not None
    conn = engine.connect()
    raw = conn.connection.driver_connection
    if temp_memory:
        raw.execute("PRAGMA temp_store=MEMORY")
    batches = [[five_task_tree(f"user-{i % 50}") for i in range(start, min(start + batch, count))]
               for start in range(0, count, batch)]
    committing = 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    for group in batches:
        if savepoints:
            raw.execute("BEGIN")  # a savepoint outside a transaction would be the transaction
        for index, rows in enumerate(group):
            if savepoints:
                raw.execute(f"SAVEPOINT tree{index}")
            stamp = now_iso()
            tree_insert.insert_tree(conn, rows, rows[0]["user_id"], "bench", stamp, stamp, None,
                                    tree_insert.Quota(rows[0]["user_id"], 1_000_000, len(rows)))
            if savepoints:
                raw.execute(f"RELEASE tree{index}")
        began = time.perf_counter()
        raw.commit()
        committing += time.perf_counter() - began
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    frames = os.path.getsize(path + "-wal") / (4096 + 24)
    print(f"batch {batch}{' with savepoints' if savepoints else ''}{' temp_store=MEMORY' if temp_memory else ''}: CPU {cpu / count * 1e6:.0f} us a tree, "
          f"wall {wall / count * 1e6:.0f} us, commit {committing / count * 1e6:.0f} us, "
          f"{frames / count:.1f} WAL frames a tree")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=1, help="trees a commit")
    parser.add_argument("--savepoints", action="store_true", help="each tree in a savepoint of its own")
    parser.add_argument("--temp-memory", action="store_true", help="PRAGMA temp_store=MEMORY (savepoint journals)")
    args = parser.parse_args()
    asyncio.run(measure(args.trees, args.batch, args.savepoints, args.temp_memory))


if __name__ == "__main__":
    main()
