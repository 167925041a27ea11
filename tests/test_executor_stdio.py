"""system_info_executor and command_executor, called directly (no engine)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, ExecutorError
from taskgrove.executors.stdio import CommandExecutor, SystemInfoExecutor
from tests.deadlines import EVENT_WAIT

pytestmark = pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX only")


def context(allow: str = "", **env: str) -> ExecutionContext:
    base = {"PATH": os.environ.get("PATH", ""), "SERVICE_COMMAND_ALLOWLIST": allow, **env}
    return ExecutionContext(task_id="t", task={}, settings=Settings.from_env(base))


async def run(inputs: dict[str, Any], allow: str = "echo", **env: str) -> dict[str, Any]:
    return await CommandExecutor().execute(inputs, context(allow, **env))


# ---- system_info_executor --------------------------------------------------------------------

@pytest.mark.parametrize(
    "resource, key",
    [("cpu", "logical_cores"), ("memory", "total"), ("disk", "free"), ("platform", "system")],
)
async def test_system_info_each_resource(resource: str, key: str) -> None:
    result = await SystemInfoExecutor().execute({"resource": resource}, context())
    assert list(result) == [resource]
    assert key in result[resource]


async def test_system_info_all_is_default() -> None:
    result = await SystemInfoExecutor().execute({}, context())
    assert set(result) == {"cpu", "memory", "disk", "platform"}


async def test_system_info_rejects_unknown_resource() -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"resource": "gpu"}, SystemInfoExecutor.input_schema)
    with pytest.raises(ExecutorError, match="resource must be one of"):
        await SystemInfoExecutor().execute({"resource": "gpu"}, context())


# ---- command_executor: the allow-list --------------------------------------------------------

async def test_refused_when_allowlist_empty() -> None:
    with pytest.raises(ExecutorError, match="SERVICE_COMMAND_ALLOWLIST=echo") as info:
        await run({"command": "echo hi"}, allow="")
    assert "disabled" in str(info.value)


async def test_refused_when_not_listed() -> None:
    with pytest.raises(ExecutorError, match="'rm' is not in the command allow-list.*SERVICE_COMMAND_ALLOWLIST=rm"):
        await run({"command": ["rm", "-rf", "/nonexistent"]}, allow="echo,ls")


async def test_path_with_listed_basename_elsewhere_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "echo"
    fake.write_text("#!/bin/sh\necho pwned\n")
    fake.chmod(0o755)
    with pytest.raises(ExecutorError, match="not the allow-listed"):
        await run({"command": [str(fake), "x"]})
    # The real program by full path is fine.
    real = await run({"command": ["/bin/echo", "ok"]})
    assert real["stdout"] == "ok\n"


async def test_task_path_cannot_swap_the_program(tmp_path: Path) -> None:
    fake = tmp_path / "echo"
    fake.write_text("#!/bin/sh\necho pwned\n")
    fake.chmod(0o755)
    result = await run({"command": ["echo", "real"], "env": {"PATH": str(tmp_path)}})
    assert result["stdout"] == "real\n"


async def test_loader_variables_refused() -> None:
    with pytest.raises(ExecutorError, match="LD_PRELOAD"):
        await run({"command": "echo x", "env": {"LD_PRELOAD": "/tmp/evil.so"}})


# ---- command_executor: running ---------------------------------------------------------------

async def test_argv_form() -> None:
    result = await run({"command": ["echo", "hello world", "$HOME"]})
    assert result["stdout"] == "hello world $HOME\n"
    assert result["command"] == ["echo", "hello world", "$HOME"]
    assert result["return_code"] == 0 and result["stderr"] == "" and result["truncated"] is False
    assert result["duration"] >= 0


async def test_string_form_is_split_without_a_shell() -> None:
    result = await run({"command": "echo 'a  b' c; ls $HOME | cat"})
    assert result["command"] == ["echo", "a  b", "c;", "ls", "$HOME", "|", "cat"]
    assert result["stdout"] == "a  b c; ls $HOME | cat\n"


async def test_timeout_kills_and_fails() -> None:
    started = time.monotonic()
    with pytest.raises(ExecutorError, match="timed out after 0.3s"):
        await run({"command": ["sleep", "60"], "timeout": 0.3}, allow="sleep")
    assert time.monotonic() - started < 10  # long before the sleep's end; a busy machine's margin


async def test_output_is_capped() -> None:
    result = await run(
        {"command": ["head", "-c", "300000", "/dev/zero"], "max_output_bytes": 1000}, allow="head"
    )
    assert result["truncated"] is True
    assert len(result["stdout"]) == 1000


async def test_env_is_minimal_plus_given() -> None:
    result = await run(
        {"command": ["env"], "env": {"FOO": "bar baz"}}, allow="env", SECRET_TOKEN="s3cret"
    )
    lines = result["stdout"].splitlines()
    assert "FOO=bar baz" in lines
    assert not any(line.startswith(("SECRET_TOKEN", "SERVICE_")) for line in lines)
    assert any(line.startswith("PATH=") for line in lines)


async def test_cwd(tmp_path: Path) -> None:
    result = await run({"command": ["pwd"], "cwd": str(tmp_path)}, allow="pwd")
    assert os.path.realpath(result["stdout"].strip()) == os.path.realpath(tmp_path)
    with pytest.raises(ExecutorError, match="cannot start"):
        await run({"command": ["pwd"], "cwd": str(tmp_path / "missing")}, allow="pwd")


async def test_nonzero_exit_fails_with_stderr_tail() -> None:
    with pytest.raises(ExecutorError, match=r"exited with code 3: oops"):
        await run({"command": ["sh", "-c", "echo oops >&2; exit 3"]}, allow="sh")


async def test_background_leftovers_do_not_hold_the_task() -> None:
    started = time.monotonic()
    result = await run({"command": ["sh", "-c", "sleep 30 & echo done"]}, allow="sh")
    assert result["stdout"] == "done\n"
    assert time.monotonic() - started < 10  # not the leftover's 30 s; a busy machine's margin


def _group_members(pgid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_cancel_kills_the_whole_process_group() -> None:
    executor = CommandExecutor()
    task = asyncio.create_task(
        executor.execute({"command": ["sh", "-c", "sleep 30 & sleep 30"]}, context("sh"))
    )
    deadline = time.monotonic() + EVENT_WAIT
    while True:
        process = executor._process
        if process is not None and len(members := _group_members(process.pid)) >= 3:
            break  # sh and both sleeps are running
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.02)
    assert len(members) >= 3
    # What the engine does: executor.cancel(), then cancel the coroutine.
    await executor.cancel()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + EVENT_WAIT
    while not all(_dead(pid) for pid in members):
        assert time.monotonic() < deadline, f"still alive: {[p for p in members if not _dead(p)]}"
        await asyncio.sleep(0.02)
    assert process.returncode is not None  # the leader was reaped
