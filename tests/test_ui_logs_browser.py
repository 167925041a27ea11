"""The logs section of the dashboard's task detail in a real browser (Debian's chromium driven by
Playwright, as tests/test_ui_browser.py does) against a real `taskgrove serve` process: a command's
lines appear while it runs and after, each with its stream; markup in a line stays text.

Every wait is for a condition on the page (`expect` retries until its deadline) or on the service.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.processes import Service
from tests.test_ui_browser import WAIT_MS, XSS, browser, node, page, rpc, wait_status  # noqa: F401 (fixtures)


# One worker runs this module (make test's --dist loadgroup): its module-scoped services and browser are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_ui_logs_browser")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("ui-logs")
    started = Service(work, {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
                             "SERVICE_DATABASE_URL": f"sqlite:///{work / 'ui-logs.db'}"}, "ui-logs")
    started.launch()
    try:
        yield started.ready()
    finally:
        started.stop()


def test_the_task_detail_shows_its_logs_while_it_runs_and_after(service: Service, page: Page,
                                                                tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f"echo 'first line'; echo '{XSS}' >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo 'last line'"
    rpc(service, "tasks.create", [{"id": "ui-cmd", "name": "ui command", "schemas": {"method": "command_executor"},
                                   "inputs": {"command": ["sh", "-c", script]}}])
    wait_status(service, "ui-cmd", ("in_progress",))
    page.goto(f"{service.url}/ui#/tree/ui-cmd")
    node(page, "ui-cmd").click()
    lines = page.get_by_test_id("log-line")
    expect(lines.first).to_contain_text("first line", timeout=WAIT_MS)
    expect(lines.first).to_have_attribute("data-stream", "stdout")
    stderr = page.locator('[data-testid=log-line][data-stream="stderr"]')
    expect(stderr).to_contain_text(XSS, timeout=WAIT_MS)  # shown as text, never parsed (no dialog opens)
    gate.touch()
    expect(page.locator('[data-testid=log-line]:has-text("last line")')).to_have_count(1, timeout=WAIT_MS)
    wait_status(service, "ui-cmd", ("completed",))
    page.reload()
    node(page, "ui-cmd").click()
    expect(page.get_by_test_id("log-line")).to_have_count(3, timeout=WAIT_MS)


def test_a_task_without_lines_says_so(service: Service, page: Page) -> None:
    rpc(service, "tasks.create", [{"id": "ui-quiet", "name": "quiet", "schemas": {"method": "noop_executor"}}])
    wait_status(service, "ui-quiet", ("completed",))
    page.goto(f"{service.url}/ui#/tree/ui-quiet")
    node(page, "ui-quiet").click()
    expect(page.get_by_test_id("logs-state")).to_have_text("No log lines.", timeout=WAIT_MS)
