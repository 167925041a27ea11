"""LLM usage on the dashboard (docs/costs.md) in a real browser: Debian's chromium driven by
Playwright against a real `taskgrove serve` whose LLM is the fake one (15 tokens a call: 10 prompt,
5 completion). The tree page shows what the tree used and what its budget leaves, and follows a call
that ends while the page is open (the call is held at the fake LLM's gate until the test lets it
go); the usage page shows a user's usage per day and daily budget, the same numbers as usage.get.

Every wait is for a condition on the page (Playwright's `expect`) or on the service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from playwright.sync_api import Page, expect

from tests.fakellm import FakeLLMServer
from tests.processes import Service
from tests.test_ui_browser import WAIT_MS, browser, page, rpc, wait_status  # noqa: F401 - fixtures


# One worker runs this module (make test's --dist loadgroup): its module-scoped services and browser are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_ui_usage_browser")


SECRET = "usage-ui-secret-with-enough-bytes-for-hs256"


def started(tmp_path_factory: pytest.TempPathFactory, fake: FakeLLMServer, name: str,
            **env: str) -> Iterator[Service]:
    work = tmp_path_factory.mktemp(name)
    service = Service(work, {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_LLM_BASE_URL": fake.base_url,
                             "SERVICE_LLM_MAX_RETRIES": "0", "SERVICE_USER_DAILY_BUDGET_TOKENS": "1000",
                             "SERVICE_DATABASE_URL": f"sqlite:///{work / 'usage.db'}", **env}, name).start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, fake_llm_server: FakeLLMServer) -> Iterator[Service]:
    yield from started(tmp_path_factory, fake_llm_server, "usage-ui")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, fake_llm_server: FakeLLMServer) -> Iterator[Service]:
    yield from started(tmp_path_factory, fake_llm_server, "usage-ui-jwt", SERVICE_JWT_SECRET=SECRET)


# How long a service's first LLM task may take: it imports litellm (5-8 s of CPU here), which
# on a machine loaded by other suites took past wait_status's 20 s. A ceiling, not a measure:
# the wait ends as soon as the task has.
FIRST_LLM_TASK_S = 90


def llm_task(id_: str, parent: str, prompt: str, user: str) -> dict[str, Any]:
    return {"id": id_, "name": id_, "parent_id": parent, "user_id": user, "schemas": {"method": "llm_executor"},
            "inputs": {"prompt": prompt, "model": "gpt-4o-mini", "max_tokens": 10, "stream": False}}


def test_the_tree_page_shows_usage_and_budget_left_and_follows_a_call(service: Service, page: Page,
                                                                     fake_llm: FakeLLMServer) -> None:
    fake_llm.script("[[held]]", [{"content": "late", "hold": "ui"}])
    rpc(service, "tasks.create", {"tasks": [
        {"id": "u-root", "name": "usage root", "user_id": "carol", "budget": {"max_tokens": 100}},
        llm_task("u-first", "u-root", "hello", "carol"),
        {**llm_task("u-held", "u-root", "[[held]] hello", "carol"), "dependencies": [{"id": "u-first"}]},
    ]})
    wait_status(service, "u-first", ("completed",), timeout=FIRST_LLM_TASK_S)
    wait_status(service, "u-held", ("in_progress",))
    cost = rpc(service, "tasks.get", {"task_id": "u-root"})["tree_usage"]["cost_usd"]
    page.goto(f"{service.url}/ui#/tree/u-root")
    expect(page.get_by_test_id("tree-usage")).to_have_text(f"LLM: 1 calls, 15 tokens, ${cost:.6f}", timeout=WAIT_MS)
    expect(page.get_by_test_id("budget-left")).to_have_text("budget left: 85 of 100 tokens")

    fake_llm.release("ui")  # the second call ends while the page is open
    root = wait_status(service, "u-held", ("completed",)) and rpc(service, "tasks.get", {"task_id": "u-root"})
    assert root["tree_usage"]["calls"] == 2 == len(fake_llm.requests)
    assert root["tree_usage"]["total_tokens"] == 30 and root["budget_remaining"]["tokens"] == 70
    expect(page.get_by_test_id("tree-usage")).to_have_text(
        f"LLM: 2 calls, 30 tokens, ${root['tree_usage']['cost_usd']:.6f}", timeout=WAIT_MS)
    expect(page.get_by_test_id("budget-left")).to_have_text("budget left: 70 of 100 tokens")


def test_the_usage_page_shows_a_users_days_and_daily_budget(service: Service, page: Page,
                                                            fake_llm: FakeLLMServer) -> None:
    rpc(service, "tasks.create", {"tasks": [
        {"id": "d-root", "name": "dave's tree", "user_id": "dave"},
        llm_task("d-a", "d-root", "one", "dave"),
        {**llm_task("d-b", "d-root", "two", "dave"), "dependencies": [{"id": "d-a"}]},
        {**llm_task("d-c", "d-root", "three", "dave"), "dependencies": [{"id": "d-b"}]},
    ]})
    wait_status(service, "d-c", ("completed",), timeout=FIRST_LLM_TASK_S)
    today = rpc(service, "usage.get", {"user_id": "dave"})["today"]
    assert (today["calls"], today["total_tokens"]) == (3, 45) == (len(fake_llm.requests), 15 * len(fake_llm.requests))

    page.goto(f"{service.url}/ui#/")
    page.get_by_role("link", name="Usage", exact=True).click()
    page.get_by_test_id("usage-user").fill("dave")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_test_id("usage-who")).to_have_text("Usage of user dave, per UTC day.", timeout=WAIT_MS)
    day = page.get_by_test_id("usage-day")
    expect(day).to_have_count(1)
    for field, shown in (("calls", "3"), ("prompt_tokens", "30"), ("completion_tokens", "15"),
                         ("total_tokens", "45"), ("cost_usd", f"${today['cost_usd']:.6f}")):
        expect(day.locator(f'[data-field="{field}"]')).to_have_text(shown)
    expect(page.get_by_test_id("daily-budget")).to_have_text(
        "Daily budget (the service's setting): 1000 tokens; left today: 955 tokens.")

    page.goto(f"{service.url}/ui#/usage?user=nobody-yet&days=7")
    expect(page.get_by_test_id("usage-none")).to_have_text("No LLM calls in these days.", timeout=WAIT_MS)
    expect(page.get_by_test_id("usage-days")).to_have_value("7")


def test_with_jwt_the_usage_page_shows_ones_own_and_refuses_anothers(guarded: Service, page: Page,
                                                                     fake_llm: FakeLLMServer) -> None:
    guarded.token = jwt.encode({"user_id": "erin"}, SECRET, algorithm="HS256")
    rpc(guarded, "tasks.create", {"tasks": [{"id": "e-root", "name": "erin's tree"},
                                            llm_task("e-a", "e-root", "hello", "erin")]})
    wait_status(guarded, "e-a", ("completed",), timeout=FIRST_LLM_TASK_S)
    page.goto(f"{guarded.url}/ui#/usage")
    page.locator("#token").fill(guarded.token)
    page.locator("#token-form button[type=submit]").click()
    expect(page.get_by_test_id("usage-who")).to_have_text("Usage of user erin, per UTC day.", timeout=WAIT_MS)
    expect(page.get_by_test_id("usage-day").locator('[data-field="calls"]')).to_have_text("1")
    expect(page.get_by_test_id("daily-budget")).to_contain_text("left today: 985 tokens")

    page.get_by_test_id("usage-user").fill("frank")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#notice")).to_contain_text("usage of user 'frank'", timeout=WAIT_MS)
    assert len(fake_llm.requests) == 1
