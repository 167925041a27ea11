"""The circuit breaker per LLM provider and model (llm/breaker.py, docs/costs.md): unit tests on a
clock the test moves, and the real app against the fake LLM's HTTP 500 answers."""

from __future__ import annotations

import asyncio
from typing import Any

from taskgrove.llm.breaker import CLOSED, HALF_OPEN, OPEN, Breakers, LLMCircuitOpen
from taskgrove.llm.client import LLMAuthError, LLMProviderError

import pytest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_n_failures_in_a_row_then_half_opens_and_closes() -> None:
    clock = Clock()
    breakers = Breakers(2, 10.0, clock)
    fault = LLMProviderError("HTTP 500")
    breakers.record("openai", "m", fault)
    breakers.record("openai", "m", None)  # a success in between: the count starts again
    breakers.record("openai", "m", fault)
    breakers.check("openai", "m")
    breakers.record("openai", "m", fault)
    assert breakers.state("openai", "m") == OPEN
    with pytest.raises(LLMCircuitOpen, match="circuit open"):
        breakers.check("openai", "m")
    breakers.check("openai", "other-model")  # each model has its own
    clock.now += 10.0
    breakers.check("openai", "m")  # the delay is over: half-open, the call may go
    assert breakers.state("openai", "m") == HALF_OPEN
    breakers.record("openai", "m", None)
    assert breakers.state("openai", "m") == CLOSED


def test_a_failure_when_half_open_opens_it_again_and_client_errors_do_not_count() -> None:
    clock = Clock()
    breakers = Breakers(1, 5.0, clock)
    breakers.record("openai", "m", LLMAuthError("bad key"))  # says nothing about the provider's health
    assert breakers.state("openai", "m") == CLOSED
    breakers.record("openai", "m", LLMProviderError("HTTP 503"))
    clock.now += 5.0
    breakers.check("openai", "m")
    breakers.record("openai", "m", LLMProviderError("HTTP 503"))
    assert breakers.state("openai", "m") == OPEN
    with pytest.raises(LLMCircuitOpen):
        breakers.check("openai", "m")
    off = Breakers(0, 5.0, clock)  # threshold 0: no breaker
    for _ in range(5):
        off.record("openai", "m", LLMProviderError("HTTP 500"))
    off.check("openai", "m")


def llm(id_: str, prompt: str, model: str = "m") -> dict[str, Any]:
    return {"id": id_, "name": id_, "schemas": {"method": "llm_executor"},
            "inputs": {"prompt": prompt, "model": model, "stream": False}}


async def test_an_open_breaker_fails_fast_without_calling_the_provider(app_factory, fake_llm):
    env = {"SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0",
           "SERVICE_LLM_BREAKER_FAILURES": "2", "SERVICE_LLM_BREAKER_RESET_SECONDS": "3600"}
    async with app_factory(env=env) as c:
        for n in range(3):
            await c.result("tasks.create", [llm(f"t{n}", "[[error:500]]")])
        errors = [(await c.result("tasks.get", {"task_id": f"t{n}"}))["error"] for n in range(3)]
        assert len(fake_llm.requests) == 2
        assert "HTTP 500" in errors[0] or "failed" in errors[0]
        assert "circuit open" in errors[2]
        await c.result("tasks.create", [llm("other", "hello", model="m2")])  # another model is not held back
        assert (await c.result("tasks.get", {"task_id": "other"}))["status"] == "completed"


async def test_the_breaker_of_the_running_service_closes_again_after_its_delay(app_factory, fake_llm):
    """Through the app: 2 HTTP 500 answers open m's breaker; SERVICE_LLM_BREAKER_RESET_SECONDS
    later a call goes through, its success closes the breaker, and later calls reach the provider
    (one more failure does not open it again: the count started over). That the open breaker
    fails fast is the test above; here the breaker object tells it opened, without a race
    against its short delay."""
    reset = 0.5
    env = {"SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0",
           "SERVICE_LLM_BREAKER_FAILURES": "2", "SERVICE_LLM_BREAKER_RESET_SECONDS": str(reset)}
    async with app_factory(env=env) as c:
        breakers = c.services.engine.services["llm_breakers"]  # the service's own (agent/services/container.py)
        for n in range(2):
            await c.result("tasks.create", [llm(f"down-{n}", "[[error:500]]")])
        assert len(fake_llm.requests) == 2
        assert breakers.state("openai", "m") == OPEN
        await asyncio.sleep(reset)  # the half-open delay passes
        await c.result("tasks.create", [llm("trial", "hello")])
        trial = await c.result("tasks.get", {"task_id": "trial"})
        assert trial["status"] == "completed", trial["error"]
        assert len(fake_llm.requests) == 3 and breakers.state("openai", "m") == CLOSED
        await c.result("tasks.create", [llm("one-more-failure", "[[error:500]]")])
        failed = await c.result("tasks.get", {"task_id": "one-more-failure"})
        assert failed["status"] == "failed" and "circuit open" not in failed["error"]
        assert breakers.state("openai", "m") == CLOSED  # 1 failure of 2
        for n in range(3):
            await c.result("tasks.create", [llm(f"after-{n}", "hello")])
        later = [await c.result("tasks.get", {"task_id": f"after-{n}"}) for n in range(3)]
    assert [t["status"] for t in later] == ["completed"] * 3
    assert [r["model"] for r in fake_llm.requests] == ["m"] * 7, "every call after the trial reached the provider"


async def test_a_429_is_retried_after_the_providers_retry_after(app_factory, fake_llm):
    """SERVICE_LLM_MAX_RETRIES retries (litellm hands them to the OpenAI client, which waits the
    answer's Retry-After): the second request comes no sooner than 2 s after the first."""
    fake_llm.script("[[busy]]", [{"status": 429, "content": "slow down", "retry_after": 2}, "fine"])
    env = {"SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "1",
           "SERVICE_LLM_BREAKER_FAILURES": "1"}
    async with app_factory(env=env) as c:
        await c.result("tasks.create", [llm("t", "[[busy]] hello")])
        task = await c.result("tasks.get", {"task_id": "t"})
    assert task["status"] == "completed" and task["result"]["text"] == "fine"
    first, second = fake_llm.requests
    assert second["received_at"] - first["received_at"] >= 2.0
    assert task["usage"]["calls"] == 1  # one call as the task sees it, its retry inside


async def test_an_open_breaker_falls_back_to_the_next_model_of_the_budget_whose_breaker_is_closed(
        app_factory, fake_llm):
    """m and m2 answer HTTP 500 until their breakers open; a task for m under a budget naming
    fallback_models [m2, m3] goes to m3 (neither m nor m2 is called); a task for m without such
    a budget still fails fast."""
    fake_llm.script("model:m", [{"status": 500, "content": "m is down"}])
    fake_llm.script("model:m2", [{"status": 500, "content": "m2 is down"}])
    env = {"SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0",
           "SERVICE_LLM_BREAKER_FAILURES": "2", "SERVICE_LLM_BREAKER_RESET_SECONDS": "3600"}
    budget = {"max_tokens": 10_000, "fallback_models": ["m2", "m3"]}
    async with app_factory(env=env) as c:
        for n in range(2):
            await c.result("tasks.create", [llm(f"m-{n}", "hello")])
            await c.result("tasks.create", [llm(f"m2-{n}", "hello", model="m2")])
        assert len(fake_llm.requests) == 4
        await c.result("tasks.create", [{**llm("fell-back", "hello"), "budget": budget}])
        fell_back = await c.result("tasks.get", {"task_id": "fell-back"})
        await c.result("tasks.create", [llm("no-fallback", "hello")])
        fast = await c.result("tasks.get", {"task_id": "no-fallback"})
    assert fell_back["status"] == "completed", fell_back["error"]
    assert fell_back["result"]["model"] == "m3" and fell_back["usage"]["calls"] == 1
    assert [r["model"] for r in fake_llm.requests[4:]] == ["m3"]
    assert fast["status"] == "failed" and "'m' failed 2 times in a row" in fast["error"]
    assert "circuit open" in fast["error"] and len(fake_llm.requests) == 5


def anthropic_task(id_: str, prompt: str) -> dict[str, Any]:
    return {"id": id_, "name": id_, "schemas": {"method": "llm_executor"},
            "inputs": {"prompt": prompt, "provider": "anthropic", "model": "claude-haiku-4-5",
                       "stream": False}}


@pytest.fixture
def anthropic_env(fake_llm: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Anthropic's API played by the fake LLM (/v1/messages): litellm calls it with its own HTTP
    client, not the OpenAI one (it reads ANTHROPIC_API_BASE from the process environment)."""
    monkeypatch.setenv("ANTHROPIC_API_BASE", fake_llm.base_url.removesuffix("/v1"))
    return {"ANTHROPIC_API_KEY": "test-anthropic-key", "SERVICE_LLM_MAX_RETRIES": "1"}


async def test_a_429_of_a_provider_litellm_calls_itself_is_retried_after_its_retry_after(
        app_factory, fake_llm, anthropic_env):
    fake_llm.script("[[busy]]", [{"status": 429, "content": "slow down", "retry_after": 2}, "fine"])
    async with app_factory(env=anthropic_env) as c:
        await c.result("tasks.create", [anthropic_task("t", "[[busy]] hello")])
        task = await c.result("tasks.get", {"task_id": "t"})
    assert task["status"] == "completed", task["error"]
    assert task["result"]["text"] == "fine" and task["result"]["provider"] == "anthropic"
    first, second = fake_llm.requests
    assert first["path"] == second["path"] == "/v1/messages"
    assert second["received_at"] - first["received_at"] >= 2.0
    assert task["usage"]["calls"] == 1 and task["usage"]["total_tokens"] == 15 and task["usage"]["cost_usd"] > 0


async def test_a_retry_after_past_a_minute_is_not_waited_for_and_a_500_is_retried_after_a_backoff(
        app_factory, fake_llm, anthropic_env):
    fake_llm.script("[[later]]", [{"status": 429, "content": "come back tomorrow", "retry_after": 86400}, "fine"])
    fake_llm.script("[[flaky]]", [{"status": 500, "content": "oops"}, "fine"])
    async with app_factory(env=anthropic_env) as c:
        await c.result("tasks.create", [anthropic_task("later", "[[later]] hello")])
        later = await c.result("tasks.get", {"task_id": "later"})
        assert len(fake_llm.requests) == 1
        await c.result("tasks.create", [anthropic_task("flaky", "[[flaky]] hello")])
        flaky = await c.result("tasks.get", {"task_id": "flaky"})
    assert later["status"] == "failed" and "rate limit" in later["error"]
    assert "test-anthropic-key" not in later["error"]
    assert flaky["status"] == "completed" and flaky["result"]["text"] == "fine", flaky["error"]
    assert len(fake_llm.requests) == 3


class Refused(Exception):
    """A provider's refusal as litellm raises it: the answer's headers on the exception."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("refused")
        self.litellm_response_headers = headers


@pytest.mark.parametrize("headers, expected", [
    ({"retry-after": "2"}, 2.0), ({"retry-after": "0.5"}, 0.5), ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
    ({"retry-after": "-3"}, 0.0), ({"retry-after": "soon"}, None), ({}, None),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date gone by: no wait
])
def test_the_retry_after_of_an_answer_is_read_as_seconds_milliseconds_or_a_date(headers, expected) -> None:
    from taskgrove.llm.retry import retry_after

    assert retry_after(Refused(headers)) == expected


def test_a_future_http_date_and_the_waits_bounds() -> None:
    import datetime as dt
    import email.utils

    from taskgrove.llm.retry import BACKOFF_MAX, MAX_RETRY_AFTER, retry_after, wait_seconds

    later = email.utils.format_datetime(dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30), usegmt=True)
    assert 0 < retry_after(Refused({"retry-after": later})) <= 30
    assert wait_seconds(Refused({"retry-after": str(MAX_RETRY_AFTER + 1)}), 0) is None  # not waited for
    assert wait_seconds(Refused({"retry-after": "7"}), 5) == 7.0
    assert 0.5 <= wait_seconds(Refused({}), 0) <= 0.625  # no header: the backoff, with jitter
    assert BACKOFF_MAX <= wait_seconds(Refused({}), 10) <= BACKOFF_MAX * 1.25
    assert wait_seconds(ValueError("no answer at all"), 1) <= 1.25
