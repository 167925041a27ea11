"""The real entry points: `taskgrove run`, `taskgrove serve` as a process, `taskgrove token`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT
from tests.servers import free_port

BIN = Path(sys.executable).parent / "taskgrove"


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def test_run_command_exit_status(tmp_path: Path) -> None:
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"tasks": [
        {"id": "r", "name": "report", "schemas": {"method": "aggregate_results_executor"}, "dependencies": [{"id": "c"}]},
        {"id": "c", "name": "cpu info", "parent_id": "r", "schemas": {"method": "system_info_executor"},
         "inputs": {"resource": "cpu"}},
    ]}))
    done = run_cli(["run", str(good)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cpu info" in done.stdout and "completed" in done.stdout

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "refused", "schemas": {"method": "command_executor"},
                                "inputs": {"command": "ls"}}]))
    failed = run_cli(["run", str(bad)], env)
    assert failed.returncode == 1
    assert "SERVICE_COMMAND_ALLOWLIST" in failed.stdout

    invalid = tmp_path / "invalid.json"
    invalid.write_text("[{}]")
    refused = run_cli(["run", str(invalid)], env)
    assert refused.returncode == 2 and "name is required" in refused.stdout


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    done = run_cli(["serve"], {"SERVICE_API_PORT": "eighty", "SERVICE_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"})
    assert done.returncode != 0
    assert "SERVICE_API_PORT" in done.stderr


def _rpc(base: str, path: str, method: str, params: Any) -> Any:
    answer = httpx.post(base + path, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                        timeout=HEAVY_WORK_TIMEOUT).json()
    assert "error" not in answer, answer
    return answer["result"]


def start_server(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}",
           "SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(port)}
    proc = subprocess.Popen([str(BIN), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + EVENT_WAIT
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/system",
                       json={"jsonrpc": "2.0", "id": 1, "method": "system.health"}, timeout=1)
            return proc
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def test_serve_process_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(tmp_path, port)
    try:
        tree = _rpc(base, "/tasks", "tasks.create", [{"id": "e2e", "name": "e2e", "schemas": {"method": "noop_executor"}}])
        assert tree["status"] == "completed"
        health = _rpc(base, "/system", "system.health", {})
        assert health["status"] == "healthy"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    output = proc.stdout.read() if proc.stdout else ""
    assert "Application shutdown complete" in output, output
    # the data survives a restart
    proc = start_server(tmp_path, port)
    try:
        assert _rpc(base, "/tasks", "tasks.get", {"task_id": "e2e"})["status"] == "completed"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
