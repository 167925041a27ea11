"""`taskgrove run FILE --url`: create the tree on a running service and follow it live.

tasks.create answers only once the tree has run, so the create is sent in the background and the
tree is followed over /ws meanwhile. To follow it before the answer, its root id must be known: a
lone root without an id is given one here (a tree with children names its root already, as every
parent_id does).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.connection import RemoteError
from taskgrove.agent.remote.follow import follow

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.client import AsyncClient

# How long to wait for the create's transaction to commit before following the tree.
STORED_WAIT_SECONDS = 60.0


def root_of(payload: Any) -> dict[str, Any]:
    """The root task of a tasks.create payload (ids filled in where the root has none)."""
    tasks = payload.get("tasks") if isinstance(payload, dict) and "tasks" in payload else payload
    listed = tasks if isinstance(tasks, list) else [tasks]
    roots = [t for t in listed if isinstance(t, dict) and not t.get("parent_id")]
    if len(roots) != 1:
        raise RemoteError("the file must hold one tree: tasks with exactly one root (a task without parent_id)", 2)
    root: dict[str, Any] = roots[0]
    if not root.get("id"):
        root["id"] = str(uuid.uuid4())
    return root


async def run_remote(client: AsyncClient, payload: Any, *, as_json: bool, timeout: float | None) -> int:
    root_id = root_of(payload)["id"]
    tasks = payload["tasks"] if isinstance(payload, dict) and "tasks" in payload else payload
    create = asyncio.create_task(client.create(tasks if isinstance(tasks, list) else [tasks]))
    try:
        await _stored(client, root_id, create)
        return await follow(client, root_id, as_json=as_json, timeout=timeout)
    finally:
        if not create.done():
            create.cancel()
        await asyncio.gather(create, return_exceptions=True)


async def _stored(client: AsyncClient, root_id: str, create: asyncio.Task[Any]) -> None:
    """Until the tree is readable; the create's own error (an invalid tree) if it has one."""
    from taskgrove.client import InvalidParams, NotFound

    deadline = asyncio.get_running_loop().time() + STORED_WAIT_SECONDS
    while True:
        if create.done():
            try:
                create.result()
            except InvalidParams as exc:  # an invalid tree: bad input, as for the embedded `run`
                raise RemoteError(f"invalid tree: {exc}", 2) from None
            return
        try:
            await client.get(root_id)
            return
        except NotFound:
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise RemoteError(f"the tree {root_id} was not stored within {STORED_WAIT_SECONDS:g} s", 2)
        await asyncio.wait({create}, timeout=0.1)
