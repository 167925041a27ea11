"""The official A2A client (a2a-sdk) against taskgrove: JSON-RPC, HTTP+JSON and gRPC, streaming and not.

Runs in the `sdk` venv (interop/pins/sdk.txt). Each run sends one task tree as a data part and
checks what a client keeps: the task ends `completed`, it holds the `task_results` artifact, a
streamed artifact update says `last_chunk` (so chunk-assembling clients close the artifact), and
the final status message carries the run summary. gRPC is the interface the card declares when the
service runs with SERVICE_GRPC_PORT (interop/run.py sets it).

    python interop/sdk_client.py http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import grpc.aio
import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_data_part
from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict


def tree(run: str) -> list[dict]:
    """A two-task tree; task ids are unique per run (ids are global in one service)."""
    return [
        {"id": f"root-{run}", "name": "collect", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"step-{run}", "required": True}]},
        {"id": f"step-{run}", "name": "step", "parent_id": f"root-{run}", "schemas": {"method": "noop_executor"}},
    ]


async def one_run(url: str, binding: str, streaming: bool) -> list[str]:
    """Problems seen in one send (empty: all good)."""
    problems: list[str] = []
    async with httpx.AsyncClient(timeout=60) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding],
                              grpc_channel_factory=grpc.aio.insecure_channel)
        client = await ClientFactory(config).create_from_url(url)
        request = SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[new_data_part({"tasks": tree(uuid.uuid4().hex[:8])})]))
        task = None
        closed_artifacts: set[str] = set()
        async for event in client.send_message(request):
            kind = event.WhichOneof("payload")
            if kind == "task":
                task = event.task
            elif kind == "artifact_update" and event.artifact_update.last_chunk:
                closed_artifacts.add(event.artifact_update.artifact.name)
            elif kind == "status_update" and task is not None:
                task.status.CopyFrom(event.status_update.status)
        await client.close()
    if task is None:
        return ["no task in the answer"]
    if task.status.state != TaskState.TASK_STATE_COMPLETED:
        problems.append(f"state {TaskState.Name(task.status.state)}")
    summary = next((MessageToDict(p.data) for p in task.status.message.parts if p.HasField("data")), {})
    if summary.get("status") != "completed":
        problems.append(f"final status message {summary}")
    if streaming and "task_results" not in closed_artifacts:
        problems.append("the task_results artifact update was not the last chunk (last_chunk false)")
    if not streaming and not any(a.name == "task_results" for a in task.artifacts):
        problems.append("no task_results artifact on the task")
    return problems


async def main(url: str) -> int:
    failures = 0
    for binding in ("JSONRPC", "HTTP+JSON", "GRPC"):
        for streaming in (True, False):
            label = f"a2a-sdk client, {binding}, {'streaming' if streaming else 'non-streaming'}"
            try:
                problems = await one_run(url, binding, streaming)
            except Exception as exc:  # noqa: BLE001 - reported as this run's failure
                problems = [f"{type(exc).__name__}: {exc}"]
            print(f"{label}: {'OK' if not problems else 'FAILED: ' + '; '.join(problems)}")
            failures += bool(problems)
    return failures


if __name__ == "__main__":
    sys.exit(1 if asyncio.run(main(sys.argv[1].rstrip("/"))) else 0)
