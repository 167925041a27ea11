"""`taskgrove tasks logs ID [--attempt N] [--follow]` as a person or a script runs it: the real
console script against a real `taskgrove serve` process (tests/test_cli_remote.py's pattern)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import Service
from tests.test_cli_remote import BIN, cli, env_for


# One worker runs this module (make test's --dist loadgroup): its module-scoped services are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_cli_logs")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("cli-logs")
    started = Service(work, {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
                             "SERVICE_DATABASE_URL": f"sqlite:///{work / 'logs.db'}"}, "logs")
    started.launch()
    try:
        yield started.ready()
    finally:
        started.stop()


def command(tid: str, script: str) -> dict[str, object]:
    return {"id": tid, "name": tid, "schemas": {"method": "command_executor"},
            "inputs": {"command": ["sh", "-c", script]}}


def test_logs_for_people_and_scripts(service: Service) -> None:
    asyncio.run(service.rpc("tasks.create", [command("done", "echo hello; echo oops >&2")]))
    asyncio.run(service.wait_status("done", ("completed",)))
    people = cli(["tasks", "logs", "done"], service)
    assert people.returncode == 0, people.stderr
    assert "stdout hello" in people.stdout and "stderr oops" in people.stdout
    scripts = cli(["tasks", "logs", "done", "--json"], service)
    lines = [json.loads(line) for line in scripts.stdout.splitlines()]
    assert sorted(line["text"] for line in lines) == ["hello", "oops"] and all(line["attempt"] == 1 for line in lines)
    assert cli(["tasks", "logs", "done", "--attempt", "2", "--json"], service).stdout == ""
    missing = cli(["tasks", "logs", "nope"], service)
    assert missing.returncode == 1 and "Task 'nope' not found" in missing.stderr and "Traceback" not in missing.stderr


def test_follow_prints_lines_as_they_come_and_ends_with_the_task(service: Service, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.02; done; echo second"
    asyncio.run(service.rpc("tasks.create", [command("live", script)]))
    follow = subprocess.Popen([str(BIN), "tasks", "logs", "live", "--follow", "--json"], env=env_for(service),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        first = json.loads(follow.stdout.readline())  # printed while the command still runs
        assert first["text"] == "first"
        assert asyncio.run(service.task("live"))["status"] == "in_progress"  # type: ignore[index]
        gate.touch()
        rest, errors = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, errors
    assert [json.loads(line)["text"] for line in rest.splitlines()] == ["second"]
