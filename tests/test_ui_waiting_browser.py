"""The dashboard's "Waiting for an answer" view (#/waiting) in Debian's chromium, driven by Playwright
against two real `taskgrove serve` processes (issue 45, item 6).

The local service has two tasks that wait: a person's input (human_input_executor) and a remote
agent's question (a2a_agent_executor to the second service, whose task asks "Approve the refund?").
The view lists both, says which agent asks, and answers each with its form (tasks.respond): a
refused answer is shown under its form; an answered task leaves the list; both trees complete.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.deadlines import EVENT_WAIT
from tests.processes import Service
from tests.test_ui_browser import WAIT_MS, XSS, _chromium, rpc, wait_status

pytestmark = pytest.mark.xdist_group("test_ui_waiting_browser")

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    tmp: Path = tmp_path_factory.mktemp("ui-waiting")
    remote = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}"}, "remote").launch()
    local = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'local.db'}",
                          "SERVICE_CREATE_WAIT_TIMEOUT": "0"}, "local").launch()
    try:
        yield remote.ready(), local.ready()
    finally:
        local.stop()
        remote.stop()


@pytest.fixture()
def page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        opened = context.new_page()
        errors: list[str] = []
        opened.on("pageerror", lambda exc: errors.append(str(exc)))
        opened.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
        try:
            yield opened
        finally:
            browser.close()
        assert not errors, errors


def wait_waiting(service: Service, task_id: str, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (task := rpc(service, "tasks.get", {"task_id": task_id})).get("waiting"):
        assert task["status"] in ("pending", "in_progress"), task
        assert time.monotonic() < deadline, f"task {task_id} never waited: {task}"
        time.sleep(0.1)
    return task


def test_every_waiting_task_is_listed_and_answered_from_the_waiting_view(
        pair: tuple[Service, Service], page: Page) -> None:
    remote, local = pair
    s = uuid.uuid4().hex[:6]
    approve, human, ask = f"approve-{s}", f"human-{s}", f"ask-{s}"
    rpc(local, "tasks.create", {"tasks": [
        {"id": human, "name": "name the account", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": f"Which account {XSS}?", "schema": {"type": "string"}}}]})
    rpc(local, "tasks.create", {"tasks": [
        {"id": ask, "name": "refund through the remote agent", "schemas": {"method": "a2a_agent_executor"},
         "inputs": {"agent_url": remote.url, "poll_interval": 0.1, "data": {"tasks": [
             {"id": approve, "name": "approve", "schemas": {"method": "human_input_executor"},
              "inputs": {"prompt": "Approve the refund?", "schema": APPROVAL}}]}}}]})
    wait_waiting(local, human)
    wait_waiting(local, ask)

    page.goto(f"{local.url}/ui#/waiting")
    items = page.get_by_test_id("waiting-task")
    expect(items).to_have_count(2, timeout=WAIT_MS)
    agent_item = page.locator(f'[data-testid=waiting-task][data-task-id="{ask}"]')
    human_item = page.locator(f'[data-testid=waiting-task][data-task-id="{human}"]')
    expect(agent_item).to_have_attribute("data-kind", "agent_input")
    expect(agent_item.get_by_test_id("waiting-asker")).to_contain_text("the agent ")
    expect(agent_item.get_by_test_id("answer-prompt")).to_contain_text("Approve the refund?")
    expect(human_item.get_by_test_id("waiting-asker")).to_have_text("asks for your input")
    expect(human_item.get_by_test_id("answer-prompt")).to_have_text(f"Which account {XSS}?")  # text, not markup
    expect(page.locator("main img")).to_have_count(0)

    # The remote agent's schema is checked here: a refusal is shown under the form, nothing is sent.
    value = agent_item.get_by_test_id("answer-value")
    value.fill('{"approved": "yes"}')
    agent_item.get_by_test_id("answer-send").click()
    expect(agent_item.get_by_test_id("answer-error")).to_contain_text("approved", timeout=WAIT_MS)
    value.fill('{"approved": true}')
    agent_item.get_by_test_id("answer-send").click()
    expect(page.locator(f'[data-testid=waiting-task][data-task-id="{ask}"]')).to_have_count(0, timeout=WAIT_MS)
    assert wait_status(local, ask, ("completed", "failed"), timeout=30)["status"] == "completed"
    assert rpc(remote, "tasks.get", {"task_id": approve})["result"] == {"approved": True}

    page.locator(f'[data-testid=waiting-task][data-task-id="{human}"]').get_by_test_id("answer-value").fill("DE89")
    page.locator(f'[data-testid=waiting-task][data-task-id="{human}"]').get_by_test_id("answer-send").click()
    expect(page.get_by_test_id("no-waiting")).to_be_visible(timeout=WAIT_MS)
    assert wait_status(local, human, ("completed",))["result"] == "DE89"
