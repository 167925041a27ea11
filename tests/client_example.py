"""A user's script, as issue 47 describes it: with only the client installed, build a three-task
tree, run it, watch it to the end answering its question, and read it back, typed.

tests/test_client_types.py checks it with `mypy --strict`; tests/test_client_wheel.py runs it (and
mypy) in a fresh virtual environment holding only the built wheel, against a real service. It reads
the service's address from TASKGROVE_URL and prints one JSON line: what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys

from taskgrove import AsyncClient, Client
from taskgrove.client import Answer, AsyncEvent, QuotaExceeded, TaskStatus, TaskTree, Tree


def build(prefix: str) -> Tree:
    release = Tree(f"{prefix} release", "aggregate_results_executor", id=f"{prefix}-release")
    notes = release.add("Release notes", "noop_executor", version="1.2.0")
    approve = release.add("Approve", "human_input_executor", after=[notes], prompt="Ship 1.2.0?",
                          schema={"type": "object", "properties": {"ship": {"type": "boolean"}},
                                  "required": ["ship"]})
    release.after(notes, approve)
    return release


async def main(prefix: str) -> dict[str, object]:
    events: list[str] = []
    async with AsyncClient() as client:
        try:
            created: TaskTree = await client.create(build(prefix))
        except QuotaExceeded as exc:  # retried already; what is left is the caller's to decide
            raise SystemExit(f"over quota, retry after {exc.retry_after} s") from None
        event: AsyncEvent
        async for event in client.watch(created.id):
            events.append(f"{event.type}:{event.task_id}")
            if event.wants_input and event.waiting is not None:
                answer: Answer = await event.respond({"ship": True})
                events.append(f"answered:{answer.task_id}:{event.waiting.prompt}")
        tree = await client.tree(created.id)
    approved = next(node for node in tree.walk() if node.executor == "human_input_executor")
    return {"status": tree.status.value, "tasks": len(list(tree.walk())), "answer": approved.result,
            "all_completed": all(s is TaskStatus.COMPLETED for s in tree.statuses.values()), "events": events}


def check_sync(prefix: str) -> str:
    with Client() as client:
        return client.get(f"{prefix}-release").status.value


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "example"
    seen = asyncio.run(main(name))
    seen["sync_read"] = check_sync(name)
    print(json.dumps(seen))
