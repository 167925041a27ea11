"""Google ADK as a client: a `RemoteA2aAgent` pointed at taskgrove, run by an ADK `Runner`.

Runs in the `adk` venv (interop/pins/adk.txt). The RemoteA2aAgent is the root agent itself, so ADK
needs no model of its own. The user's message is a task tree written as JSON text, the way an
LLM-driven agent sends it. Passes when the ADK session holds the tree's outcome (the `task_results`
artifact: its data part, not a partial event). The block between the docs/interop.md markers is
that page's snippet, word for word (tests/test_interop_docs.py checks it).

    python interop/adk_client.py http://127.0.0.1:8000 [--no-streaming]
"""

from __future__ import annotations

import argparse
import sys
import uuid

# docs/interop.md: adk-client
import asyncio
import json

import httpx
from a2a.client import ClientConfig, ClientFactory
from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types


async def ask_taskgrove(url: str, tree: dict, streaming: bool = True) -> list:
    """Send a task tree to taskgrove through ADK (as JSON text, as an LLM would); the session's events."""
    async with httpx.AsyncClient(timeout=60) as http:
        factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http))
        # The RemoteA2aAgent is the root agent: ADK needs no model of its own.
        taskgrove = RemoteA2aAgent(name="taskgrove", agent_card=f"{url}/.well-known/agent-card.json",
                                   a2a_client_factory=factory)
        sessions = InMemorySessionService()
        runner = Runner(app_name="interop", agent=taskgrove, session_service=sessions)
        session = await sessions.create_session(app_name="interop", user_id="u1")
        message = types.Content(role="user", parts=[types.Part(text=json.dumps(tree))])
        async for event in runner.run_async(user_id="u1", session_id=session.id, new_message=message):
            print(event.author, "partial" if event.partial else "", event.content)
        kept = await sessions.get_session(app_name="interop", user_id="u1", session_id=session.id)
        return kept.events
# docs/interop.md: end


def tree(run: str) -> dict:
    """A two-task tree; task ids are unique per run (ids are global in one service)."""
    return {"tasks": [
        {"id": f"root-{run}", "name": "collect", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"hello-{run}", "required": True}]},
        {"id": f"hello-{run}", "name": "hello", "parent_id": f"root-{run}", "schemas": {"method": "noop_executor"},
         "inputs": {"greeting": "hi from ADK", "count": 3}},
    ]}


def outcome_in(events: list) -> dict | None:
    """The task_results data ({root_task_id, status, result, tasks, ...}) as the session holds it."""
    for event in events:
        if event.partial or event.content is None:
            continue
        for part in event.content.parts or []:
            raw = None
            if part.inline_data is not None and part.inline_data.data:
                raw = part.inline_data.data.decode(errors="replace")
            elif part.text:
                raw = part.text
            if not raw or "root_task_id" not in raw:
                continue
            raw = raw.removeprefix("<a2a_datapart_json>").removesuffix("</a2a_datapart_json>")
            try:
                data = json.loads(raw)
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("tasks"), list):
                return data
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--no-streaming", action="store_true")
    args = parser.parse_args()
    mode = "non-streaming" if args.no_streaming else "streaming"
    events = asyncio.run(ask_taskgrove(args.url.rstrip("/"), tree(uuid.uuid4().hex[:8]), not args.no_streaming))
    outcome = outcome_in(events)
    if outcome is None:
        sys.exit(f"ADK {mode}: no task_results artifact among the session's {len(events)} events")
    # Struct numbers reach ADK as doubles (its converter's doing): 2.0 == 2.
    if outcome.get("status") != "completed" or outcome.get("task_count") != 2:
        sys.exit(f"ADK {mode}: unexpected outcome {outcome}")
    hello = next(t for t in outcome["tasks"] if t["name"] == "hello")
    if hello["status"] != "completed":
        sys.exit(f"ADK {mode}: task hello {hello}")
    print(f"ADK {mode}: OK, the session holds task_results ({outcome['status']}, "
          f"{len(outcome['tasks'])} tasks) among {len(events)} events")


if __name__ == "__main__":
    main()
