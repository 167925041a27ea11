"""Unit tests of the side-effect-free executors, the SSRF guard and every executor's input schema."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import jsonschema
import pytest

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor, Waiting
from taskgrove.executors.core import (AggregateResultsExecutor, EventWaitExecutor, HumanInputExecutor, NoopExecutor,
                                      SleepExecutor)
from taskgrove.executors.database import DatabaseExecutor
from taskgrove.executors.http import RestExecutor
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url, non_public_reason
from taskgrove.executors.stdio import CommandExecutor, SystemInfoExecutor

ALL: list[type[Executor]] = [
    AggregateResultsExecutor, NoopExecutor, SleepExecutor, SystemInfoExecutor, CommandExecutor,
    RestExecutor, DatabaseExecutor, HumanInputExecutor, EventWaitExecutor,
]


def context(**kw: Any) -> ExecutionContext:
    kw.setdefault("settings", Settings.from_env({}))
    return ExecutionContext(task_id="t", task={}, **kw)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.id)
def test_descriptor_and_schema_are_valid(cls: type[Executor]) -> None:
    assert cls.id and cls.extension and cls.description
    assert cls.descriptor()["id"] == cls.id
    if cls.input_schema is not None:
        jsonschema.Draft202012Validator.check_schema(cls.input_schema)


async def test_aggregate_collects_dependency_results() -> None:
    ctx = context(dependency_results={"a": {"x": 1}, "b": [2]})
    result = await AggregateResultsExecutor().execute({}, ctx)
    assert result == {"results": {"a": {"x": 1}, "b": [2]}, "count": 2}
    assert await AggregateResultsExecutor().execute({}, context()) == {"results": {}, "count": 0}


async def test_noop_echoes_inputs() -> None:
    assert await NoopExecutor().execute({"k": 1}, context()) == {"ok": True, "inputs": {"k": 1}}


async def test_sleep_reports_progress() -> None:
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, message: str | None) -> None:
        seen.append((value, message))

    result = await SleepExecutor().execute({"seconds": 0.2}, context(_progress=progress))
    assert result == {"slept": 0.2}
    assert seen and seen[-1][0] == 1.0
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)
    assert await SleepExecutor().execute({"seconds": 0}, context()) == {"slept": 0.0}


async def test_sleep_is_cancellable_with_partial_result() -> None:
    executor = SleepExecutor()
    in_process = Settings.from_env({"SERVICE_PARK_SLEEP_SECONDS": "60"})  # 30 s: below it, no park
    task = asyncio.create_task(executor.execute({"seconds": 30}, context(settings=in_process)))
    await asyncio.sleep(0.1)
    answer = await executor.cancel()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert answer is not None and 0 < answer["result"]["slept"] < 5


async def test_long_sleep_parks_and_returns_once_woken() -> None:
    """At SERVICE_PARK_SLEEP_SECONDS (default 5) and above, a sleep is a durable timer: the attempt
    parks (Waiting), and the run after the wake-up returns at once."""
    with pytest.raises(Waiting) as parked:
        await SleepExecutor().execute({"seconds": 5}, context())
    assert parked.value.wait == {"kind": "timer", "prompt": "sleep 5s", "schema": None, "index": 0, "timeout": 5.0,
                                 "default": None}
    assert await SleepExecutor().execute({"seconds": 5}, context(wait_answers=[None])) == {"slept": 5.0}


def test_sleep_schema_bounds() -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"seconds": 3601}, SleepExecutor.input_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"seconds": -1}, SleepExecutor.input_schema)


# ---- SSRF guard ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.0.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost:8080/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://100.64.0.1/",
        "https://192.168.1.1/",
        "http://224.0.0.1/",
    ],
)
async def test_guard_refuses_private_addresses(url: str) -> None:
    with pytest.raises(UnsafeURLError) as info:
        await ensure_public_url(url, allow_private=False)
    assert "SERVICE_ALLOW_PRIVATE_URLS=true" in str(info.value)
    await ensure_public_url(url, allow_private=True)  # the override lets it through


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/", "gopher://x/", "//x/", "http:///nohost"])
async def test_guard_refuses_other_schemes_even_with_override(url: str) -> None:
    with pytest.raises(UnsafeURLError):
        await ensure_public_url(url, allow_private=True)


async def test_guard_accepts_public_literal() -> None:
    await ensure_public_url("https://93.184.216.34/path", allow_private=False)
    await ensure_public_url("http://[2606:4700:4700::1111]/", allow_private=False)


async def test_guard_checks_every_resolved_address(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    answers = {
        "public.test": ["93.184.216.34"],
        "mixed.test": ["93.184.216.34", "10.1.2.3"],
    }

    async def fake_getaddrinfo(host: str, port: int, **kw: Any) -> list[Any]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answers[host]]

    monkeypatch.setattr(loop, "getaddrinfo", fake_getaddrinfo)
    await ensure_public_url("https://public.test/", allow_private=False)
    with pytest.raises(UnsafeURLError, match=r"mixed\.test \(10\.1\.2\.3\): private"):
        await ensure_public_url("https://mixed.test/", allow_private=False)
    with pytest.raises(UnsafeURLError, match="cannot resolve"):
        await ensure_public_url("https://nowhere.test/", allow_private=False)


def test_non_public_reason_labels() -> None:
    assert non_public_reason(ipaddress.ip_address("127.0.0.1")) == "loopback"
    assert non_public_reason(ipaddress.ip_address("169.254.169.254")) == "link-local"
    assert non_public_reason(ipaddress.ip_address("8.8.8.8")) is None
