#!/usr/bin/env python3
"""`make interop`: third-party A2A clients and servers against a real `taskgrove serve`.

Each third-party package lives in its own venv under `.interop/` (pinned in interop/pins/*.txt,
installed by the make target); this script runs in the project's venv and starts:

- `taskgrove serve` (fresh SQLite file, no LLM, private URLs allowed: everything is on loopback);
- an ADK `to_a2a` agent and a pydantic-ai `agent_to_a2a` agent (interop/adk_server.py,
  interop/pydantic_server.py), each in its venv;

then runs, in order, each as its own process:

1. ADK `RemoteA2aAgent` streaming and non-streaming (interop/adk_client.py);
2. the official a2a-sdk client on JSON-RPC, HTTP+JSON and gRPC, streaming and not (interop/sdk_client.py),
   against a second `taskgrove serve` with SERVICE_GRPC_PORT set (ADK's RemoteA2aAgent refuses a
   card that declares an interface on another port, so the first service keeps gRPC off);
3. a tree whose two `a2a_agent_executor` tasks call the ADK and the pydantic-ai agent: it must
   complete with both remote answers;
4. an ADK agent that asks (interop/adk_asker.py, `input-required`) called by its directory name: the
   task waits (agent_input) and `tasks.respond` answers it (interop/orchestrate.py);
5. `a2a-lint --live --strict`: without an LLM, its plain-text probe is refused with -32005 as
   documented (docs/a2a.md, "What a message does"), and that must be its only finding; then against a
   second `taskgrove serve` planning with the fake LLM (tests/fakellm.py, in this process) it must pass
   (grade A);
6. on that service, a plain-language requirement planned by the fake LLM into a tree that delegates to
   the ADK and the pydantic-ai agents by their directory names (interop/orchestrate.py).

Exit status 0 only when every check passed; each check prints one verdict line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from orchestrate import planned_delegation, question_answered  # interop/orchestrate.py, beside this file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/fakellm.py: the stand-in LLM, run in this process
from tests.fakellm import FakeLLMServer  # noqa: E402

ENVS = REPO / ".interop"
BIN = Path(sys.executable).parent
STEP_TIMEOUT = 120  # seconds for one client run
# What a2a-lint may report against a server without an LLM: its text probe refused with -32005
# (message/send), and so its message/stream probe gets that error event instead of a final status.
TEXT_REFUSED = ("message/send returned JSON-RPC error -32005", "Stream ended without a final status-update event")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def venv_python(name: str) -> str:
    return str(ENVS / name / "bin" / "python")


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


@contextmanager
def process(argv: list[str], log: Path, ready_url: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """A background process (server), up once `ready_url` answers; stopped on exit."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    try:
        wait_http(ready_url, proc, log)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def taskgrove(work: Path, name: str, extra_env: dict[str, str] | None = None) -> tuple[str, ExitStack]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(port),
                "SERVICE_DATABASE_URL": f"sqlite:///{work / (name + '.db')}",
                "SERVICE_ALLOW_PRIVATE_URLS": "true", **(extra_env or {})})
    url = f"http://127.0.0.1:{port}"
    stack = ExitStack()
    stack.enter_context(process([str(BIN / "taskgrove"), "serve"], work / f"{name}.log",
                                f"{url}/.well-known/agent-card.json", env))
    return url, stack


def step(label: str, argv: list[str]) -> bool:
    """Run one client; its output is shown; passes on exit status 0."""
    print(f"--- {label}", flush=True)
    try:
        done = subprocess.run(argv, timeout=STEP_TIMEOUT, text=True, capture_output=True)
    except subprocess.TimeoutExpired:
        print(f"FAILED: {label} did not finish within {STEP_TIMEOUT}s")
        return False
    print((done.stdout + done.stderr).rstrip()[-4000:])
    return done.returncode == 0


def delegate(url: str, adk_url: str, pydantic_url: str) -> bool:
    """A tree whose children call the two remote agents; it must complete with their answers."""
    print("--- a2a_agent_executor calling an ADK to_a2a agent and a pydantic-ai agent", flush=True)
    run = uuid.uuid4().hex[:8]
    tree = [
        {"id": f"gather-{run}", "name": "gather", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"adk-{run}", "required": True}, {"id": f"pydantic-{run}", "required": True}]},
        {"id": f"adk-{run}", "name": "ask ADK", "parent_id": f"gather-{run}", "schemas": {"method": "a2a_agent_executor"},
         "inputs": {"agent_url": adk_url, "message": "hello from taskgrove", "timeout": 60}},
        {"id": f"pydantic-{run}", "name": "ask pydantic-ai", "parent_id": f"gather-{run}",
         "schemas": {"method": "a2a_agent_executor"},
         "inputs": {"agent_url": pydantic_url, "message": "write the report", "timeout": 60}},
    ]
    reply = httpx.post(f"{url}/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                                             "params": {"tasks": tree}}, timeout=STEP_TIMEOUT).json()
    if "result" not in reply:
        print(f"FAILED: tasks.create answered {reply}")
        return False
    for name in ("adk", "pydantic"):
        wait_final(url, f"{name}-{run}")
    ok = True
    for name, expected in (("adk", "SHOUT: HELLO FROM TASKGROVE"), ("pydantic", "pydantic-ai says")):
        task = wait_final(url, f"{name}-{run}")
        answer = json.dumps(task.get("result"))
        if task["status"] == "completed" and expected.lower() in answer.lower():
            print(f"{name}: OK, completed with the remote answer")
        else:
            print(f"{name}: FAILED, {task['status']}: {task.get('error') or answer[:600]}")
            ok = False
    if not ok:  # the root waits for both: it would never end
        return False
    root = wait_final(url, f"gather-{run}")
    print(f"tree: {root['status']}")
    return ok and root["status"] == "completed"


def wait_final(url: str, task_id: str) -> dict:
    """tasks.get until the task has ended (or STEP_TIMEOUT passed): the task as last read."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while True:
        task = httpx.post(f"{url}/tasks", json={"jsonrpc": "2.0", "id": 2, "method": "tasks.get",
                                                "params": {"task_id": task_id}}, timeout=30).json()["result"]
        if task["status"] in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return task
        time.sleep(0.2)


def lint(url: str, allowed: tuple[str, ...] | None) -> bool:
    """a2a-lint --live --strict; `allowed`: texts one of which each finding must start with (None: no finding)."""
    print(f"--- a2a-lint --live --strict ({'no LLM' if allowed else 'fake LLM'})", flush=True)
    done = subprocess.run([str(ENVS / "lint" / "bin" / "a2a-lint"), url, "--live", "--strict", "--json"],
                          timeout=STEP_TIMEOUT, text=True, capture_output=True)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        print(f"FAILED: a2a-lint printed no report (exit {done.returncode}): {done.stdout}{done.stderr}")
        return False
    findings = [f for f in report.get("findings", []) if f.get("level") in ("error", "warn")]
    grade = report.get("summary", {}).get("grade")
    print(f"grade {grade}, exit {done.returncode}, findings: {json.dumps(findings)[:1500]}")
    if allowed is None:
        return done.returncode == 0 and not findings
    return all(f["message"].startswith(allowed) for f in findings)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="taskgrove-interop-"))
    started = time.monotonic()
    results: dict[str, bool] = {}
    with ExitStack() as stack:
        url, server = taskgrove(work, "taskgrove")
        stack.enter_context(server)
        adk_port, pydantic_port = free_port(), free_port()
        adk_url, pydantic_url = f"http://127.0.0.1:{adk_port}", f"http://127.0.0.1:{pydantic_port}"
        here = Path(__file__).resolve().parent
        stack.enter_context(process([venv_python("adk"), str(here / "adk_server.py"), str(adk_port)],
                                    work / "adk_server.log", f"{adk_url}/.well-known/agent-card.json"))
        stack.enter_context(process([venv_python("pydantic"), str(here / "pydantic_server.py"),
                                     str(pydantic_port)], work / "pydantic_server.log",
                                    f"{pydantic_url}/.well-known/agent-card.json"))
        asker_url = f"http://127.0.0.1:{free_port()}"
        stack.enter_context(process([venv_python("adk"), str(here / "adk_asker.py"), asker_url.rsplit(":", 1)[1]],
                                    work / "adk_asker.log", f"{asker_url}/.well-known/agent-card.json"))
        for streaming in (True, False):
            mode = "streaming" if streaming else "non-streaming"
            argv = [venv_python("adk"), str(here / "adk_client.py"), url] + ([] if streaming else ["--no-streaming"])
            results[f"ADK RemoteA2aAgent {mode}"] = step(f"ADK RemoteA2aAgent, {mode}", argv)
        # gRPC on in a service of its own: ADK refuses a card with an interface on another port (docs/interop.md)
        grpc_url, grpc_server = taskgrove(work, "taskgrove-grpc", {"SERVICE_GRPC_PORT": str(free_port())})
        stack.enter_context(grpc_server)
        results["a2a-sdk client"] = step("official a2a-sdk client",
                                         [venv_python("sdk"), str(here / "sdk_client.py"), grpc_url])
        results["a2a_agent_executor -> ADK, pydantic-ai"] = delegate(url, adk_url, pydantic_url)
        results["ADK agent asks, tasks.respond answers"] = question_answered(url, asker_url)
        results["a2a-lint, no LLM"] = lint(url, TEXT_REFUSED)
        fake = stack.enter_context(fake_llm())
        llm_url, llm_server = taskgrove(work, "taskgrove-llm", {"SERVICE_LLM_BASE_URL": fake.base_url,
                                                                "SERVICE_LLM_MAX_RETRIES": "0"})
        stack.enter_context(llm_server)
        results["a2a-lint, fake LLM"] = lint(llm_url, None)
        results["planned tree -> directory agents"] = planned_delegation(llm_url, fake, adk_url, pydantic_url)
    print("\n=== interop summary")
    for name, ok in results.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    failed = sum(not ok for ok in results.values())
    if failed:
        print(f"ran in {time.monotonic() - started:.0f}s; servers' logs kept in {work}")
    else:
        print(f"ran in {time.monotonic() - started:.0f}s")
        shutil.rmtree(work, ignore_errors=True)
    print(f"interop: {len(results) - failed} passed, {failed} failed")  # the plain closing line CI reads
    return 1 if failed else 0


@contextmanager
def fake_llm() -> Iterator[FakeLLMServer]:
    """tests/fakellm.py in this process (so a check can script its replies): every text without a
    scripted marker plans into a valid tree."""
    server = FakeLLMServer("[[tree:valid]]").start()
    try:
        yield server
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
