"""The dashboard's timeline (issue 30, item 3; docs/observability.md "Timeline") in a real
browser: Debian's chromium driven by Playwright against a real `taskgrove serve` process.

The tree: prep, then two branches, `flaky` (a command that fails twice, retried after 0.3 s each
time) and `approve` (waits for input), joined by the root. The test answers the wait only once
`flaky` completed, so `approve` took longer than `flaky` from the same start (both became runnable
when prep ended): the slowest path is prep -> approve -> root, whatever the machine's speed.
Every wait is for a condition on the page (Playwright's `expect`) or on the service.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.processes import Service
from tests.test_retries import FLAKY, policy
from tests.test_ui_browser import WAIT_MS, browser, page, rpc, wait_status  # noqa: F401 - fixtures

# One worker runs this module (make test's --dist loadgroup): its module-scoped services and browser are then
# started once, not once on each worker that gets some of its tests.
pytestmark = [pytest.mark.skipif(not Path("/bin/sh").exists(), reason="the flaky task is a sh script"),
              pytest.mark.xdist_group("test_ui_timeline_browser")]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("timeline")
    started = Service(work, {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
                             "SERVICE_DATABASE_URL": f"sqlite:///{work / 'timeline.db'}"}, "timeline").start()
    try:
        yield started
    finally:
        started.stop()


def timeline_tree(log: Path) -> list[dict[str, Any]]:
    return [
        {"id": "tl-root", "name": "release", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "tl-flaky"}, {"id": "tl-approve"}]},
        {"id": "tl-prep", "name": "prep", "parent_id": "tl-root", "schemas": {"method": "noop_executor"}},
        {"id": "tl-flaky", "name": "flaky", "parent_id": "tl-root", "schemas": {"method": "command_executor"},
         "inputs": {"command": ["sh", "-c", FLAKY, "sh", str(log), "3"]}, "retry": policy(3, base=0.3),
         "dependencies": [{"id": "tl-prep"}]},
        {"id": "tl-approve", "name": "approve", "parent_id": "tl-root", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Ship it?"}, "dependencies": [{"id": "tl-prep"}]},
    ]


def bars(page: Page, task_id: str, testid: str = "attempt-bar") -> Any:
    return page.locator(f'[data-testid=timeline-row][data-task-id="{task_id}"] [data-testid={testid}]')


def test_the_timeline_shows_retries_a_wait_and_the_slowest_path(service: Service, page: Page,
                                                                tmp_path: Path) -> None:
    rpc(service, "tasks.create", {"tasks": timeline_tree(tmp_path / "flaky.log")})
    assert wait_status(service, "tl-flaky", ("completed", "failed"))["status"] == "completed"
    wait_status(service, "tl-approve", ("in_progress",))
    page.goto(f"{service.url}/ui#/tree/tl-root")
    timeline = page.get_by_test_id("timeline")
    expect(timeline.get_by_test_id("timeline-row")).to_have_count(4, timeout=WAIT_MS)
    # flaky: three attempts, two failed and retried after a delay, the last completed
    flaky = bars(page, "tl-flaky")
    expect(flaky).to_have_count(3, timeout=WAIT_MS)
    assert [flaky.nth(i).get_attribute("data-kind") for i in range(3)] == ["retry", "retry", "completed"]
    assert [flaky.nth(i).get_attribute("data-attempt") for i in range(3)] == ["1", "2", "3"]
    delays = bars(page, "tl-flaky", "attempt-gap").and_(page.locator("[data-kind=retry-delay]"))
    expect(delays).to_have_count(2)
    # approve: parked on its wait, drawn as a waiting attempt and the wait after it
    expect(bars(page, "tl-approve")).to_have_attribute("data-kind", "waiting", timeout=WAIT_MS)
    expect(bars(page, "tl-approve", "attempt-gap").and_(page.locator("[data-kind=wait]"))).to_have_count(1)
    expect(bars(page, "tl-root")).to_have_count(0)  # not started yet
    # the task detail lists the attempts with their durations
    page.locator('[data-testid=timeline-row][data-task-id="tl-flaky"] .label').click()
    attempts = page.get_by_test_id("attempts")
    expect(attempts.locator("tbody tr")).to_have_count(3, timeout=WAIT_MS)
    expect(attempts.locator("tbody tr").nth(0)).to_contain_text("retry")
    expect(attempts.locator("tbody tr").nth(2)).to_contain_text("completed")
    expect(attempts.locator('[data-field="ran_ms"]').nth(2)).to_have_text(re.compile(r"^\d+ ms$"))

    # The answer: the page follows over /ws, and the slowest path is the branch that waited.
    rpc(service, "tasks.respond", {"task_id": "tl-approve", "value": "yes"})
    expect(bars(page, "tl-root")).to_have_attribute("data-kind", "completed", timeout=WAIT_MS)
    approve = bars(page, "tl-approve")
    expect(approve).to_have_count(2)
    assert [approve.nth(i).get_attribute("data-kind") for i in range(2)] == ["waiting", "completed"]
    caption = page.get_by_test_id("slowest-path")
    expect(caption).to_have_attribute("data-path", "tl-prep tl-approve tl-root", timeout=WAIT_MS)
    expect(caption).to_contain_text("prep → approve → release")
    slowest = timeline.locator("[data-testid=timeline-row][data-slowest=true]")
    expect(slowest).to_have_count(3)
    assert sorted(slowest.nth(i).get_attribute("data-task-id") for i in range(3)) == ["tl-approve", "tl-prep",
                                                                                       "tl-root"]


def test_a_schedules_page_lists_its_past_runs_with_durations(service: Service, page: Page) -> None:
    rpc(service, "tasks.create", {"tasks": [{"id": "tl-tmpl", "name": "nightly",
                                             "schemas": {"method": "noop_executor"}}]})
    schedule = rpc(service, "schedules.create", {"task_id": "tl-tmpl", "cron": "0 3 * * *"})
    runs = [rpc(service, "schedules.trigger", {"schedule_id": schedule["id"]})["root_task_id"] for _ in range(2)]
    for run in runs:
        wait_status(service, run, ("completed",))
    ended = rpc(service, "schedules.runs", {"schedule_id": schedule["id"]})
    page.goto(f"{service.url}/ui#/schedules")
    row = page.locator(f'[data-testid=schedule-row][data-schedule-id="{schedule["id"]}"]')
    row.get_by_test_id("show-runs").click()
    listed = page.locator(f'[data-testid=schedule-runs][data-schedule-id="{schedule["id"]}"] '
                          "[data-testid=schedule-run]")
    expect(listed).to_have_count(2, timeout=WAIT_MS)
    assert [listed.nth(i).get_attribute("data-task-id") for i in range(2)] == runs[::-1]
    for i, run in enumerate(ended):
        if run["duration_ms"] is not None:
            expect(listed.nth(i).locator('[data-field="duration"]')).to_have_text(
                f"{run['duration_ms'] / 1000:.3f} s")
    expect(listed.nth(0).get_by_role("link")).to_have_text(runs[1])
