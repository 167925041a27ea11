"""Executors that look at or act on the machine the service runs on.

`command_executor` runs programs, so it is off until the operator lists the programs it may start
(SERVICE_COMMAND_ALLOWLIST). It never uses a shell, starts each command in its own process group
and kills the whole group on timeout or cancel, so no stray processes outlive their task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shlex
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError

# ---------------------------------------------------------------------------------------------
# system_info_executor
# ---------------------------------------------------------------------------------------------

RESOURCES = ("cpu", "memory", "disk", "platform", "all")


def _cpu() -> dict[str, Any]:
    # A short sampling interval: without one psutil answers 0.0 on the first call.
    info: dict[str, Any] = {
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "percent": psutil.cpu_percent(interval=0.1),
    }
    if hasattr(os, "getloadavg"):
        info["load_average"] = list(os.getloadavg())
    with contextlib.suppress(Exception):  # not available on every platform / container
        freq = psutil.cpu_freq()
        if freq is not None:
            info["frequency_mhz"] = freq.current
    return info


def _memory() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return {
        "total": vm.total,
        "available": vm.available,
        "used": vm.used,
        "percent": vm.percent,
        "swap_total": swap.total,
        "swap_used": swap.used,
        "swap_percent": swap.percent,
    }


def _disk() -> dict[str, Any]:
    root = Path.cwd().anchor or "/"
    usage = psutil.disk_usage(root)
    return {
        "path": root,
        "total": usage.total,
        "used": usage.used,
        "free": usage.free,
        "percent": usage.percent,
    }


def _platform() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "version": platform.version(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "boot_time": psutil.boot_time(),
    }


_READERS = {"cpu": _cpu, "memory": _memory, "disk": _disk, "platform": _platform}


class SystemInfoExecutor(Executor):
    """Reports CPU, memory, disk and platform facts of the host running the task."""

    id = "system_info_executor"
    name = "System info"
    extension = "stdio"
    description = "CPU, memory, disk or platform information of the service host (inputs.resource)."
    input_schema = {
        "type": "object",
        "properties": {
            "resource": {"type": "string", "enum": list(RESOURCES), "default": "all"},
        },
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        resource = inputs.get("resource", "all")
        if resource not in RESOURCES:
            raise ExecutorError(f"resource must be one of {', '.join(RESOURCES)}, got {resource!r}", retryable=False)
        # psutil calls block (cpu_percent sleeps for its interval): keep them off the event loop.
        if resource == "all":
            return await asyncio.to_thread(lambda: {name: read() for name, read in _READERS.items()})
        return {resource: await asyncio.to_thread(_READERS[resource])}


# ---------------------------------------------------------------------------------------------
# command_executor
# ---------------------------------------------------------------------------------------------

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Copied from the service's environment into the child's; nothing else (no secrets) is passed on.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
# Loader variables would let a task inject code into an allow-listed program.
_FORBIDDEN_ENV_PREFIXES = ("LD_", "DYLD_")
_READ_CHUNK = 64 * 1024
_STDERR_TAIL = 500
_LINE_MAX = 16 * 1024  # longest line passed to the task log at once
# A SIGKILLed leader is reaped at once; this only bounds the wait if something is badly wrong.
_REAP_WAIT = 5.0


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ExecutorError(f"cannot parse command: {exc}", retryable=False) from None
    elif isinstance(command, list) and all(isinstance(part, str) for part in command):
        argv = list(command)
    else:
        raise ExecutorError("command must be a string or a list of strings", retryable=False)
    if not argv or not argv[0]:
        raise ExecutorError("command is empty", retryable=False)
    return argv


def _resolve_program(argv0: str, allowlist: tuple[str, ...], path: str) -> str:
    """The absolute path to execute, or ExecutorError when the program is not allow-listed.

    The allow-list names programs (`ls`) and the name is looked up on the *service's* PATH, so a
    task cannot swap in its own `ls` through `env.PATH`. An explicit path (`/bin/ls`) is
    accepted when it is listed itself, or when its name is listed and it is the same file the
    name resolves to; `/tmp/evil/ls` is refused even though its basename is `ls`.
    """
    prog = os.path.basename(argv0)
    hint = f"set SERVICE_COMMAND_ALLOWLIST={prog} (a comma-separated list of program names) to allow it"
    if not allowlist:
        raise ExecutorError(f"command_executor is disabled: no program is allow-listed; {hint}", retryable=False)
    if argv0 in allowlist and os.path.isabs(argv0):
        return argv0
    if prog not in allowlist:
        raise ExecutorError(f"program {prog!r} is not in the command allow-list; {hint}", retryable=False)
    found = shutil.which(prog, path=path)
    if found is None:
        raise ExecutorError(f"program {prog!r} is allow-listed but was not found on PATH {path}", retryable=False)
    if argv0 != prog and os.path.realpath(argv0) != os.path.realpath(found):
        raise ExecutorError(
            f"{argv0!r} is not the allow-listed {prog!r} ({found}); use the bare name {prog!r}", retryable=False
        )
    return found


def _child_env(service_env: Any, extra: Any) -> dict[str, str]:
    env = {name: service_env[name] for name in _INHERITED_ENV if service_env.get(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    if extra is None:
        return env
    if not isinstance(extra, dict):
        raise ExecutorError("env must be an object of string values", retryable=False)
    for key, value in extra.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
            raise ExecutorError(f"env entry {key!r} must be a name with a string value", retryable=False)
        if key.upper().startswith(_FORBIDDEN_ENV_PREFIXES):
            raise ExecutorError(f"env variable {key!r} is not allowed (dynamic loader settings)", retryable=False)
        env[key] = value
    return env


class _Lines:
    """Splits a pipe's chunks into lines for the task's log (`ExecutionContext.log_output`) as they
    come. A line longer than `_LINE_MAX` is passed on in pieces, so a program that never writes a
    newline holds no more than that in memory."""

    def __init__(self, context: ExecutionContext, stream: str) -> None:
        self.context, self.stream, self.partial = context, stream, b""

    def feed(self, chunk: bytes) -> None:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        while len(self.partial) > _LINE_MAX:
            lines.append(self.partial[:_LINE_MAX])
            self.partial = self.partial[_LINE_MAX:]
        for line in lines:
            self.context.log_output(self.stream, line.rstrip(b"\r").decode("utf-8", errors="replace"))

    def end(self) -> None:
        if self.partial:
            self.context.log_output(self.stream, self.partial.decode("utf-8", errors="replace"))
            self.partial = b""


async def _read_capped(stream: asyncio.StreamReader, cap: int, lines: _Lines | None = None) -> tuple[bytes, bool]:
    """Read a pipe to EOF, keeping at most `cap` bytes, each chunk fed to `lines` as it comes.

    The rest is drained and dropped rather than left unread: a child writing into a full pipe
    would block forever.
    """
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(_READ_CHUNK):
        if lines is not None:
            lines.feed(chunk)
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
    if lines is not None:
        lines.end()
    return bytes(kept), truncated


async def _leader_exit(process: asyncio.subprocess.Process) -> int:
    """The leader's exit code, as soon as it exits.

    `Process.wait()` alone is not enough: it also waits for the pipes to close, which a
    background child the command left behind can keep open for ever. So the return code is
    also polled (cheaply, backing off to 0.1 s) and whichever answers first wins.
    """

    async def poll() -> int:
        delay = 0.005
        while process.returncode is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
        return process.returncode

    waiters = {asyncio.ensure_future(process.wait()), asyncio.ensure_future(poll())}
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next(iter(done)).result()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class CommandExecutor(Executor):
    """Runs one allow-listed program without a shell and returns its exit code and output.

    A non-zero exit code or a timeout fails the task (ExecutorError). Background processes the
    command leaves behind are killed when it exits: a task must not leave processes running.
    """

    id = "command_executor"
    name = "Command"
    extension = "stdio"
    description = (
        "Runs an allow-listed program (SERVICE_COMMAND_ALLOWLIST) without a shell: "
        "inputs.command, timeout, max_output_bytes, env, cwd."
    )
    input_schema = {
        "type": "object",
        "required": ["command"],
        "properties": {
            "command": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ]
            },
            "timeout": {"type": "number", "exclusiveMinimum": 0, "default": 60},
            "max_output_bytes": {"type": "integer", "minimum": 0, "default": 1024 * 1024},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "cwd": {"type": "string", "minLength": 1},
        },
    }

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._process: asyncio.subprocess.Process | None = None

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        argv = _argv(inputs.get("command"))
        settings = context.settings
        env = _child_env(settings.environ, inputs.get("env"))
        # What a command needs to make its own side effects idempotent (docs/scale-out.md): the
        # same task id and attempt on every try of one attempt.
        env.update(TASKGROVE_TASK_ID=context.task_id, TASKGROVE_ATTEMPT=str(context.attempt),
                   TASKGROVE_IDEMPOTENCY_KEY=context.idempotency_key,
                   TASKGROVE_INTERRUPTIONS=str(context.interruptions))
        # The program is found on the service's PATH, never on one the task supplied.
        service_path = settings.environ.get("PATH") or DEFAULT_PATH
        program = _resolve_program(argv[0], tuple(settings.command_allowlist), service_path)
        timeout = float(inputs.get("timeout", 60))
        cap = int(inputs.get("max_output_bytes", 1024 * 1024))
        if timeout <= 0 or cap < 0:
            raise ExecutorError("timeout must be positive and max_output_bytes not negative", retryable=False)
        cwd = inputs.get("cwd")

        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                *argv[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # own process group: killpg reaches grandchildren too
            )
        except OSError as exc:
            raise ExecutorError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        self._process = process
        assert process.stdout is not None and process.stderr is not None
        readers = asyncio.gather(
            _read_capped(process.stdout, cap, _Lines(context, "stdout")),
            _read_capped(process.stderr, cap, _Lines(context, "stderr")),
        )
        try:
            async with asyncio.timeout(timeout):
                return_code = await _leader_exit(process)
                # The leader is gone; kill what it left in its group so the pipes close.
                _kill_group(process.pid)
                (stdout, out_cut), (stderr, err_cut) = await readers
                await process.wait()
        except TimeoutError:
            await self._stop(readers)
            raise ExecutorError(f"command {argv[0]!r} timed out after {timeout:g}s") from None
        except BaseException:  # cancelled by the engine, or anything unexpected
            await self._stop(readers)
            raise
        duration = round(time.monotonic() - started, 6)

        stdout_text = stdout.decode("utf-8", errors="replace")
        stderr_text = stderr.decode("utf-8", errors="replace")
        if return_code != 0:
            tail = stderr_text[-_STDERR_TAIL:].strip() or "(no stderr)"
            raise ExecutorError(f"command {argv[0]!r} exited with code {return_code}: {tail}")
        return {
            "command": argv,
            "return_code": return_code,
            "stdout": stdout_text,
            "stderr": stderr_text,
            "truncated": out_cut or err_cut,
            "duration": duration,
        }

    async def _stop(self, readers: asyncio.Future[Any]) -> None:
        """Kill the process group, reap the leader and drop the pipe readers."""
        process = self._process
        if process is not None:
            _kill_group(process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # the leader itself, should killpg have been refused
            # Not process.wait(): a process that left our group could hold the pipes open.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(_leader_exit(process)), _REAP_WAIT)
        readers.cancel()
        with contextlib.suppress(BaseException):
            await readers

    async def cancel(self) -> dict[str, Any] | None:
        process = self._process
        if process is not None and process.returncode is None:
            _kill_group(process.pid)
        return None
