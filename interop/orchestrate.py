"""`make interop`'s checks of agents orchestrating agents (issue 45): run by interop/run.py, in the
project's venv, against services run.py started.

- `planned_delegation`: the ADK and the pydantic-ai agents join a taskgrove's directory by their
  cards; a plain-language requirement planned by the stand-in LLM (tests/fakellm.py, scripted to
  name them) becomes a tree whose tasks delegate to them by directory name; the planner's prompt
  names both, and the tree completes with both answers.
- `question_answered`: an ADK agent that asks (interop/adk_asker.py: a long-running tool, A2A
  `input-required`) is called by name from the directory; the local task waits
  (`waiting.kind = agent_input`, the agent's question, the agent's name), `tasks.respond` answers
  it, the answer reaches the ADK agent as the next message of its task, and the task completes with
  what the agent made of the answer.

Each prints what it saw and returns whether it passed.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Protocol

import httpx

TIMEOUT = 120  # seconds for one check's tree
PLAN_MARKER = "[[interop:delegate]]"


class ScriptedLLM(Protocol):
    """What this module needs of tests/fakellm.py's FakeLLM."""

    requests: list[dict[str, Any]]

    def script(self, marker: str, replies: list[Any]) -> None: ...


def rpc(url: str, method: str, params: Any) -> Any:
    """One JSON-RPC call on /tasks; an error answer raises (the check fails with it)."""
    answer = httpx.post(f"{url}/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                        timeout=TIMEOUT).json()
    if "error" in answer:
        raise RuntimeError(f"{method} answered {answer['error']}")
    return answer["result"]


def until(url: str, task_id: str, done: Any) -> dict[str, Any]:
    """tasks.get until `done(task)` or the task ended or TIMEOUT passed: the task as last read."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        task = rpc(url, "tasks.get", {"task_id": task_id})
        if done(task) or task["status"] in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return task
        time.sleep(0.2)


def planned_delegation(url: str, llm: ScriptedLLM, adk_url: str, pydantic_url: str) -> bool:
    print("--- a planned tree delegating to the directory's ADK and pydantic-ai agents", flush=True)
    try:
        rpc(url, "agents.add", {"card_url": adk_url, "name": "shouter", "tags": ["interop"]})
        rpc(url, "agents.add", {"card_url": pydantic_url, "name": "reporter", "tags": ["interop"]})
        plan = [
            {"id": "root", "name": "aggregate_results_executor", "parent_id": None, "inputs": {},
             "dependencies": [{"id": "shout", "required": True}, {"id": "report", "required": True}]},
            {"id": "shout", "name": "a2a_agent_executor", "parent_id": "root", "dependencies": [],
             "inputs": {"agent": "shouter", "message": "hello from a plan", "timeout": 60}},
            {"id": "report", "name": "a2a_agent_executor", "parent_id": "root", "dependencies": [],
             "inputs": {"agent": "reporter", "message": "write the report", "timeout": 60}},
        ]
        llm.script(PLAN_MARKER, ["Here is the plan:\n```json\n" + json.dumps(plan) + "\n```"])
        seen = len(llm.requests)
        generated = rpc(url, "tasks.generate", {"requirement": f"{PLAN_MARKER} ask the shouter to greet and the "
                                                                "reporter for the report"})
        prompt = json.dumps([r.get("messages") for r in llm.requests[seen:]])
        named = "- shouter:" in prompt and "- reporter:" in prompt
        print(f"the planner's prompt names both agents: {named}")
        tasks = generated["tasks"]
        ids = {(t.get("inputs") or {}).get("agent"): t["id"] for t in tasks}
        root_id = next(t["id"] for t in tasks if not t.get("parent_id"))
        rpc(url, "tasks.create", {"tasks": tasks})
    except (RuntimeError, httpx.HTTPError, KeyError, StopIteration) as exc:
        print(f"FAILED: {exc!r}")
        return False
    ok = named
    for agent, expected in (("shouter", "SHOUT: HELLO FROM A PLAN"), ("reporter", "pydantic-ai says")):
        if agent not in ids:
            print(f"{agent}: FAILED, the generated tree does not delegate to it: {json.dumps(tasks)[:600]}")
            ok = False
            continue
        task = until(url, ids[agent], lambda t: False)
        result = task.get("result") or {}
        delegated = result.get("delegated", {}) if isinstance(result, dict) else {}
        if task["status"] == "completed" and expected.lower() in json.dumps(result).lower() \
                and delegated.get("agent") == agent:
            print(f"{agent}: OK, delegated by name, completed with its answer")
        else:
            print(f"{agent}: FAILED, {task['status']}: {task.get('error') or json.dumps(result)[:600]}")
            ok = False
    root = until(url, root_id, lambda t: False) if ok else {"status": "not awaited"}
    print(f"tree: {root['status']}")
    return ok and root["status"] == "completed"


def question_answered(url: str, asker_url: str) -> bool:
    print("--- an ADK agent asks (input-required); tasks.respond answers it", flush=True)
    task_id = f"ask-adk-{uuid.uuid4().hex[:8]}"
    try:
        rpc(url, "agents.add", {"card_url": asker_url, "name": "approver"})
        rpc(url, "tasks.create", {"tasks": [
            {"id": task_id, "name": "refund through the ADK agent", "schemas": {"method": "a2a_agent_executor"},
             "inputs": {"agent": "approver", "message": "order 42", "timeout": 60, "poll_interval": 0.2}}]})
        task = until(url, task_id, lambda t: (t.get("waiting") or {}).get("kind") == "agent_input")
        wait = task.get("waiting") or {}
        agent = wait.get("agent") or {}
        print(f"waiting: {json.dumps({k: wait.get(k) for k in ('kind', 'prompt')})}, agent {agent.get('name')} "
              f"({agent.get('state')})")
        if wait.get("kind") != "agent_input" or "Approve the refund?" not in str(wait.get("prompt")) \
                or agent.get("name") != "approver" or agent.get("state") != "input-required":
            print(f"FAILED: the task does not wait for the agent's question: {task['status']} "
                  f"{task.get('error') or ''}")
            return False
        rpc(url, "tasks.respond", {"task_id": task_id, "value": "yes, refund it"})
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"FAILED: {exc}")
        return False
    task = until(url, task_id, lambda t: False)
    answer = json.dumps(task.get("result"))
    if task["status"] == "completed" and "refund approved: yes, refund it" in answer:
        print("answered: OK, the ADK agent got the answer and the task completed")
        return True
    print(f"FAILED: {task['status']}: {task.get('error') or answer[:600]}")
    return False
