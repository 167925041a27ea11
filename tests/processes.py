"""Real `taskgrove serve` processes for end-to-end tests: start, call, kill -9, pause, resume.

Faults are what they are in production: a signal to a process id. Nothing here reaches into the
server's memory; what a test learns, it learns over HTTP or from the database file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.deadlines import EVENT_WAIT
from tests.servers import free_port

BIN = Path(sys.executable).parent / "taskgrove"
# SERVICE_PARK_SLEEP_SECONDS of the tests' services (tests/conftest.py's too): a long sleep_executor
# task is the tests' stand-in for slow work held in a slot, so it never parks as a durable timer;
# tests/test_waits.py sets the setting itself.
IN_PROCESS_SLEEPS = "86400"
# Every call here is plain HTTP to a local server, yet a new httpx client builds a TLS context
# (30 ms: it loads the CA bundle); made once, it is shared by every client of the tests' calls.
TLS = ssl.create_default_context()


class Service:
    """One `taskgrove serve` process and JSON-RPC helpers for it."""

    def __init__(self, workdir: Path, env: dict[str, str], name: str = "service") -> None:
        self.workdir = workdir
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Only our variables: a SERVICE_* set in the developer's shell must not change the service.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        self.env.update({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(self.port),
                         "SERVICE_ALLOW_PRIVATE_URLS": "true", "SERVICE_SHUTDOWN_GRACE_SECONDS": "2",
                         "SERVICE_PARK_SLEEP_SECONDS": IN_PROCESS_SLEEPS, **env})
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.token: str | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = EVENT_WAIT) -> "Service":
        return self.launch().ready(timeout)

    def launch(self) -> "Service":
        """Start the process without waiting for it (several at the same moment)."""
        log = open(self.log_path, "a")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([str(BIN), "serve"], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     text=True, cwd=self.workdir)
        return self

    def ready(self, timeout: float = EVENT_WAIT) -> "Service":
        """Wait until the service answers."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                httpx.post(f"{self.url}/system", json={"jsonrpc": "2.0", "id": 1, "method": "system.health"},
                           timeout=1, verify=TLS)
                return self
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise AssertionError(f"{self.name} did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> int:
        """SIGTERM, then kill after a grace period; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    # --- calls ----------------------------------------------------------------------------

    async def call(self, method: str, params: Any = None, path: str = "/tasks", timeout: float = 60) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(timeout=timeout, verify=TLS) as http:
            response = await http.post(f"{self.url}{path}", headers=headers, json={
                "jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params is not None else {})})
        assert response.status_code == 200, response.text
        return response.json()

    async def rpc(self, method: str, params: Any = None, **kw: Any) -> Any:
        answer = await self.call(method, params, **kw)
        assert "error" not in answer, answer
        return answer["result"]

    async def task(self, task_id: str) -> dict[str, Any] | None:
        return await self.rpc("tasks.get", {"task_id": task_id})

    async def wait_status(self, task_id: str, statuses: tuple[str, ...], timeout: float = EVENT_WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            task = await self.task(task_id)
            if task and task["status"] in statuses:
                return task
            assert time.monotonic() < deadline, f"{self.name}: task {task_id} stuck in {task and task['status']}"
            await asyncio.sleep(0.05)

    async def tree_statuses(self, root_id: str) -> dict[str, str]:
        tree = await self.rpc("tasks.tree", {"task_id": root_id})
        found: dict[str, str] = {}
        stack = [tree]
        while stack:
            node = stack.pop()
            found[node["id"]] = node["status"]
            stack.extend(node["children"])
        return found


def start_together(*services: Service, timeout: float = EVENT_WAIT) -> tuple[Service, ...]:
    """Start `services` at the same moment and wait until each answers: their start-ups (a second
    or two of imports and migrations each) overlap instead of adding up. Instances on one empty
    database starting at once is what tests/test_durability_e2e.py's
    test_two_instances_started_at_once_on_an_empty_database_both_come_up checks on its own.
    If one does not come up, every one of them is stopped."""
    for service in services:
        service.launch()
    try:
        for service in services:
            service.ready(timeout)
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


@contextmanager
def plain_and_guarded(work: Path, secret: str) -> Iterator[dict[str, Service]]:
    """Two services started side by side: "plain" (no JWT) and "jwt" (JWT on with `secret`), each
    answering tasks.create right after starting, so a test can watch the tree run."""
    common = {"SERVICE_CREATE_WAIT_TIMEOUT": "0"}
    plain = Service(work, {**common, "SERVICE_DATABASE_URL": f"sqlite:///{work / 'plain.db'}"}, "plain")
    guarded = Service(work, {**common, "SERVICE_DATABASE_URL": f"sqlite:///{work / 'jwt.db'}",
                             "SERVICE_JWT_SECRET": secret}, "jwt")
    start_together(plain, guarded)
    try:
        yield {"plain": plain, "jwt": guarded}
    finally:
        plain.stop()
        guarded.stop()


def contradictions(rows: list[dict[str, Any]]) -> list[str]:
    """Tasks that ran or completed although a required dependency had not completed."""
    by_id = {row["id"]: row for row in rows}
    bad = []
    for row in rows:
        if row["status"] not in ("in_progress", "completed"):
            continue
        for dep in row["dependencies"]:
            target = by_id.get(dep["id"])
            if dep.get("required", True) and target is not None and target["status"] != "completed":
                bad.append(f"{row['id']} is {row['status']} but its dependency {dep['id']} is {target['status']}")
    return bad
