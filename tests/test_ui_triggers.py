"""The Triggers tab of the dashboard's schedules page in a real browser (Debian's chromium driven by
Playwright, as tests/test_ui_browser.py) against a real `taskgrove serve`: a trigger's policy and
counters, its runs with the reason a replace cancelled one, disable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.processes import Service
from tests.test_ui_browser import WAIT_MS, _chromium, rpc

pytestmark = pytest.mark.xdist_group("test_ui_triggers")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("ui-triggers")
    started = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work / 'tg.db'}",
                             "SERVICE_CREATE_WAIT_TIMEOUT": "0"}).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert not errors, errors


def test_the_triggers_tab_shows_policy_counters_runs_and_why_one_was_cancelled(service: Service, page: Page) -> None:
    rpc(service, "tasks.create", {"tasks": [
        {"id": "ui-gated", "name": "gated", "schemas": {"method": "noop_executor"},
         "dependencies": [{"id": "ui-gated-gate"}]},
        {"id": "ui-gated-gate", "name": "gate", "parent_id": "ui-gated", "schemas": {"method": "event_wait_executor"},
         "inputs": {"event": "ui.finish", "timeout_seconds": 600}}]})
    trigger = rpc(service, "triggers.create", {"id": "ui-deploys", "task_id": "ui-gated", "event": "ui.deploy",
                                               "key": "service", "singleton": "replace"})
    rpc(service, "events.emit", {"name": "ui.deploy", "payload": {"service": "api", "n": 1}})
    deadline = time.monotonic() + 30
    while not rpc(service, "triggers.runs", {"trigger_id": trigger["id"]}):
        assert time.monotonic() < deadline, "no first run"
        time.sleep(0.05)
    rpc(service, "events.emit", {"name": "ui.deploy", "payload": {"service": "api", "n": 2}})
    while rpc(service, "triggers.get", {"trigger_id": trigger["id"]})["runs"] < 2:
        assert time.monotonic() < deadline, "no second run"
        time.sleep(0.05)

    page.goto(f"{service.url}/ui#/schedules")
    page.get_by_test_id("tab-triggers").click()
    row = page.locator('[data-testid=trigger-row][data-trigger-id="ui-deploys"]')
    expect(row.locator("[data-field=policy]")).to_have_text("singleton replace", timeout=WAIT_MS)
    expect(row.locator("[data-field=runs]")).to_have_text("2", timeout=WAIT_MS)
    row.get_by_test_id("show-runs").click()
    runs = page.locator("[data-testid=trigger-run]")
    expect(runs).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator("[data-testid=trigger-run] [data-field=reason]").filter(
        has_text="Replaced by a newer run")).to_have_count(1, timeout=WAIT_MS)

    row.get_by_test_id("toggle").click()
    expect(row).to_contain_text("ui.deploy (disabled)", timeout=WAIT_MS)
    assert rpc(service, "triggers.get", {"trigger_id": "ui-deploys"})["enabled"] is False
    page.get_by_test_id("tab-schedules").click()
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible(timeout=WAIT_MS)
