"""The dashboard in a real browser: Debian's chromium driven by Playwright against real
`taskgrove serve` processes (one without JWT, one with), one browser for the module.

Every wait is for a condition on the page (Playwright's `expect` retries until its deadline) or on
the service (Service.wait_status polls): nothing is read right after an action and assumed done.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.deadlines import EVENT_WAIT
from tests.processes import Service, plain_and_guarded


# One worker runs this module (make test's --dist loadgroup): its module-scoped services and browser are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_ui_browser")

CHROMIUM = "/usr/bin/chromium"
SECRET = "ui-test-secret-with-enough-bytes-for-hs256"
WAIT_MS = 20_000  # generous: the CI machine is slow and loaded
XSS = "<img src=x onerror=alert(1)>"


def _chromium() -> str:
    """Debian's chromium; `make test` installs it where it is missing (never a downloaded browser)."""
    path = shutil.which("chromium") or CHROMIUM
    assert Path(path).exists(), "chromium is missing: run `make test` (it installs it with apt-get)"
    return path


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    with plain_and_guarded(tmp_path_factory.mktemp("ui"), SECRET) as started:
        yield started


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
    opened.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))  # alert(1) = XSS
    yield opened
    context.close()
    assert not errors, errors


# Playwright's sync API keeps an event loop on this thread: plain synchronous HTTP here.
def rpc(service: Service, method: str, params: Any) -> Any:
    headers = {"Authorization": f"Bearer {service.token}"} if service.token else {}
    answer = httpx.post(f"{service.url}/tasks", headers=headers, timeout=60,
                        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()
    assert "error" not in answer, answer
    return answer["result"]


def wait_status(service: Service, task_id: str, statuses: tuple[str, ...], timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task = rpc(service, "tasks.get", {"task_id": task_id})
        if task and task["status"] in statuses:
            return task
        assert time.monotonic() < deadline, f"task {task_id} stuck in {task and task['status']}"
        time.sleep(0.05)


def sleeping_tree(prefix: str, seconds: float = 600) -> list[dict[str, Any]]:
    """A root that depends on a long sleep: running until the test moves it on."""
    return [
        {"id": f"{prefix}-root", "name": f"{prefix} root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"{prefix}-sleep"}]},
        {"id": f"{prefix}-sleep", "name": f"{prefix} sleep", "parent_id": f"{prefix}-root",
         "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": seconds}},
    ]


def start_sleeping_tree(service: Service, prefix: str) -> None:
    """sleeping_tree(prefix) created, and its sleep running."""
    rpc(service, "tasks.create", {"tasks": sleeping_tree(prefix)})
    wait_status(service, f"{prefix}-sleep", ("in_progress",), 20)


def open_running_tree(page: Page, service: Service, prefix: str) -> None:
    """The tree page of a started sleeping_tree, once it shows the sleep running."""
    page.goto(f"{service.url}/ui#/tree/{prefix}-root")
    expect(node(page, f"{prefix}-sleep")).to_have_attribute("data-status", "in_progress", timeout=WAIT_MS)


def node(page: Page, task_id: str) -> Any:
    return page.locator(f'g.node[data-task-id="{task_id}"]')


def test_list_shows_a_created_tree_with_its_name_as_text(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [
        {"id": "xss-root", "name": XSS, "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "xss-leaf"}]},
        {"id": "xss-leaf", "name": "leaf", "parent_id": "xss-root", "schemas": {"method": "noop_executor"}},
    ]})
    wait_status(service, "xss-root", ("completed",), 20)
    page.goto(f"{service.url}/ui")
    row = page.locator('[data-testid=tree-row][data-task-id="xss-root"]')
    expect(row).to_be_visible(timeout=WAIT_MS)
    expect(row.get_by_role("link")).to_have_text(XSS)  # shown as text ...
    expect(page.locator("main img")).to_have_count(0)  # ... never as markup
    expect(row).to_contain_text("2 completed")  # the tree's counts by status
    # Search by id and by name; a status filter that excludes it.
    page.goto(f"{service.url}/ui#/?search=xss-r")
    expect(page.locator('[data-testid=tree-row][data-task-id="xss-root"]')).to_be_visible(timeout=WAIT_MS)
    page.goto(f"{service.url}/ui#/?status=failed")
    expect(page.locator("[data-testid=trees]")).to_contain_text("No trees match", timeout=WAIT_MS)
    # The tree page draws the name as text too, and the detail shows the result.
    row_link = f"{service.url}/ui#/tree/xss-root"
    page.goto(row_link)
    expect(node(page, "xss-root")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    node(page, "xss-leaf").click()
    expect(page.locator('[data-field="result"]')).to_contain_text('"ok": true', timeout=WAIT_MS)
    for field in ("inputs", "params", "schemas", "error", "created_at", "started_at", "completed_at",
                  "attempt", "retry"):
        expect(page.locator(f'[data-field="{field}"]')).to_have_count(1)
    expect(page.locator("main img")).to_have_count(0)


def test_create_from_pasted_json_opens_the_running_tree(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    page.goto(f"{service.url}/ui")
    page.get_by_test_id("create-json").fill('[{"id": "pasted", "name": "pasted", "schemas": {"method": "noop_executor"}}]')
    page.get_by_test_id("create").click()
    expect(node(page, "pasted")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    assert page.url.endswith("#/tree/pasted")


def test_tree_page_shows_statuses_change_without_reload(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    start_sleeping_tree(service, "live")
    open_running_tree(page, service, "live")
    expect(node(page, "live-root")).to_have_attribute("data-status", "pending")
    expect(page.get_by_test_id("live")).to_have_text("live", timeout=WAIT_MS)
    # Finish the sleep by hand: the root then runs; the page follows over /ws, no reload.
    rpc(service, "tasks.update", {"task_id": "live-sleep", "status": "completed", "progress": 1.0})
    expect(node(page, "live-sleep")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(node(page, "live-root")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(page.get_by_test_id("summary")).to_contain_text("2 completed", timeout=WAIT_MS)


def test_the_detail_says_why_a_pending_task_waits(services: dict[str, Service], page: Page) -> None:
    """Two tasks on one concurrency key of limit 1: the second one's detail names the key (issue 26)."""
    service = services["plain"]
    key = {"key": "ui-key", "limit": 1}
    rpc(service, "tasks.create", {"tasks": [
        {"id": "key-root", "name": "key root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "key-a"}, {"id": "key-b"}]},
        {"id": "key-a", "name": "key a", "parent_id": "key-root", "schemas": {"method": "sleep_executor"},
         "inputs": {"seconds": 600}, "concurrency": key},
        {"id": "key-b", "name": "key b", "parent_id": "key-root", "schemas": {"method": "sleep_executor"},
         "inputs": {"seconds": 600}, "concurrency": key, "priority": 3},
    ]})
    wait_status(service, "key-a", ("in_progress",), 20)
    page.goto(f"{service.url}/ui#/tree/key-root")
    expect(node(page, "key-a")).to_have_attribute("data-status", "in_progress", timeout=WAIT_MS)
    node(page, "key-b").click()
    expect(page.locator('[data-field="waiting_for"]')).to_have_text("concurrency key ui-key (1/1)", timeout=WAIT_MS)
    expect(page.locator('[data-field="concurrency"]')).to_contain_text('"ui-key"')
    rpc(service, "tasks.cancel", {"task_id": "key-root"})


def test_cancel_from_the_page_cancels_the_running_task(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    start_sleeping_tree(service, "stop")
    open_running_tree(page, service, "stop")
    node(page, "stop-sleep").click()
    page.get_by_test_id("cancel").click()
    expect(node(page, "stop-sleep")).to_have_attribute("data-status", "cancelled", timeout=WAIT_MS)
    assert wait_status(service, "stop-sleep", ("cancelled",), 20)["status"] == "cancelled"
    expect(page.locator('[data-field="status"]')).to_have_text("cancelled", timeout=WAIT_MS)


def test_jwt_page_explains_a_missing_token_and_works_with_one(services: dict[str, Service], page: Page) -> None:
    service = services["jwt"]
    token = jwt.encode({"user_id": "alice"}, SECRET, algorithm="HS256")
    service.token = token
    start_sleeping_tree(service, "guarded")
    page.goto(f"{service.url}/ui")
    expect(page.locator("#notice")).to_contain_text("requires a token", timeout=WAIT_MS)
    expect(page.get_by_test_id("auth-needed")).to_be_visible()
    page.locator("#token").fill(token)
    page.locator("#token-form button[type=submit]").click()
    expect(page.locator('[data-testid=tree-row][data-task-id="guarded-root"]')).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("sessionStorage.getItem('taskgrove.token')") == token
    open_running_tree(page, service, "guarded")
    expect(page.get_by_test_id("live")).to_have_text("live", timeout=WAIT_MS)
    rpc(service, "tasks.cancel", {"task_ids": ["guarded-sleep"]})  # /ws carried the token: events arrive
    expect(node(page, "guarded-sleep")).to_have_attribute("data-status", "cancelled", timeout=WAIT_MS)
    # A wrong token is explained too.
    page.locator("#token").fill("not-a-token")
    page.locator("#token-form button[type=submit]").click()
    expect(page.locator("#notice")).to_contain_text("refused the token", timeout=WAIT_MS)


def test_a_thousand_task_tree_renders_and_stays_responsive(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    tasks: list[dict[str, Any]] = [{"id": "big", "name": "big", "schemas": {"method": "aggregate_results_executor"},
                                    "dependencies": [{"id": f"big-{i}"} for i in range(0, 999, 10)]}]
    for i in range(999):
        task: dict[str, Any] = {"id": f"big-{i}", "name": f"task {i}", "parent_id": "big",
                                "schemas": {"method": "noop_executor"}}
        if i % 10:
            task["dependencies"] = [{"id": f"big-{i - 1}"}]
        tasks.append(task)
    rpc(service, "tasks.create", {"tasks": tasks})
    wait_status(service, "big", ("completed",), 60)
    page.goto(f"{service.url}/ui#/tree/big")
    expect(page.locator("body[data-render-ms]")).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator("g.node")).to_have_count(1000)
    print(f"\n1000-task tree drawn in {float(page.locator('body').get_attribute('data-render-ms')):.0f} ms")
    expect(page.get_by_test_id("live")).to_have_text("live", timeout=WAIT_MS)
    node(page, "big-998").click()  # responsive: a click is answered with the task's detail
    expect(page.locator('[data-field="id"]')).to_have_text("big-998", timeout=WAIT_MS)



def test_examples_init_and_the_executors_page(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    page.goto(f"{service.url}/ui")
    page.get_by_test_id("examples-init").click()
    expect(page.locator("#notice")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("[data-testid=tree-row][data-task-id^='ex-']").first).to_be_visible(timeout=WAIT_MS)
    page.get_by_role("link", name="Executors and health").click()
    executors = page.get_by_test_id("executors")
    expect(executors).to_contain_text("noop_executor", timeout=WAIT_MS)
    expect(executors).to_contain_text("sleep_executor")
    expect(page.get_by_test_id("health")).to_contain_text("healthy")


def test_copy_then_execute_from_the_page(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [
        {"id": "orig", "name": "orig", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "orig-leaf"}]},
        {"id": "orig-leaf", "name": "orig leaf", "parent_id": "orig", "schemas": {"method": "noop_executor"}},
    ]})
    wait_status(service, "orig", ("completed",), 20)
    page.goto(f"{service.url}/ui#/tree/orig")
    node(page, "orig").click()
    page.get_by_test_id("copy").click()
    # The copy's page: new ids, both tasks pending.
    expect(page.locator('g.node[data-status="pending"]')).to_have_count(2, timeout=WAIT_MS)
    assert "#/tree/orig" not in page.url
    copy_id = page.url.rsplit("/", 1)[-1]
    assert rpc(service, "tasks.get", {"task_id": copy_id})["original_task_id"] == "orig"
    page.locator(f'g.node[data-task-id="{copy_id}"]').click()
    page.get_by_test_id("execute").click()
    expect(page.locator('g.node[data-status="completed"]')).to_have_count(2, timeout=WAIT_MS)


def test_the_list_pages_twenty_trees_at_a_time(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    for i in range(21):
        rpc(service, "tasks.create", {"tasks": [{"id": f"paged-{i:02d}", "name": f"paged {i}",
                                                 "schemas": {"method": "noop_executor"}}]})
    page.goto(f"{service.url}/ui#/?search=paged-")
    rows = page.locator("[data-testid=tree-row]")
    expect(rows).to_have_count(20, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-task-id", "paged-20")  # newest first
    page.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-task-id", "paged-00")
    page.get_by_role("link", name="← newer").click()
    expect(rows).to_have_count(20, timeout=WAIT_MS)


def test_the_schedules_page_lists_runs_now_and_disables(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [{"id": "sched-tmpl", "name": "sched <i>tmpl</i>",
                                             "schemas": {"method": "noop_executor"}}]})
    schedule = rpc(service, "schedules.create", {"task_id": "sched-tmpl", "cron": "0 3 * * *",
                                                 "timezone": "Europe/Berlin"})
    page.goto(f"{service.url}/ui")
    page.get_by_role("link", name="Schedules").click()
    row = page.locator(f'[data-testid=schedule-row][data-schedule-id="{schedule["id"]}"]')
    expect(row).to_contain_text("cron 0 3 * * * (Europe/Berlin)", timeout=WAIT_MS)
    expect(row).to_contain_text(schedule["next_run_at"])

    row.get_by_test_id("trigger").click()  # the run's tree opens: a copy of the template
    expect(page.locator("g.node")).to_have_count(1, timeout=WAIT_MS)
    run_id = page.url.rsplit("/", 1)[-1]
    assert rpc(service, "tasks.get", {"task_id": run_id})["original_task_id"] == "sched-tmpl"
    assert rpc(service, "schedules.get", {"schedule_id": schedule["id"]})["runs"] == 1

    page.get_by_role("link", name="Schedules").click()
    row.get_by_test_id("toggle").click()
    expect(row).to_contain_text("disabled", timeout=WAIT_MS)
    assert rpc(service, "schedules.get", {"schedule_id": schedule["id"]})["enabled"] is False


# --- durable waits (docs/waits.md): the answer form ----------------------------------------------

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}


def wait_parked(service: Service, task_id: str, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (task := rpc(service, "tasks.get", {"task_id": task_id})).get("waiting"):
        assert time.monotonic() < deadline, f"task {task_id} never waited: {task}"
        time.sleep(0.05)
    return task


def test_a_waiting_task_is_answered_from_its_form(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [
        {"id": "ask", "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "ask-approve"}]},
        {"id": "ask-approve", "name": "approve", "parent_id": "ask", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": f"Approve {XSS}?", "schema": APPROVAL}}]})
    wait_parked(service, "ask-approve")
    page.goto(f"{service.url}/ui#/tree/ask")
    expect(node(page, "ask-approve")).to_have_attribute("data-waiting", "input", timeout=WAIT_MS)
    expect(node(page, "ask-approve")).to_contain_text("waits for input")
    node(page, "ask-approve").click()
    form = page.get_by_test_id("answer-form")
    expect(page.get_by_test_id("answer-prompt")).to_have_text(f"Approve {XSS}?", timeout=WAIT_MS)  # text, not markup
    expect(page.locator("main img")).to_have_count(0)
    value = form.get_by_test_id("answer-value")
    expect(value).to_have_js_property("tagName", "TEXTAREA")  # an object: JSON

    value.fill("{approved: true}")  # not JSON: said before anything is sent
    form.get_by_test_id("answer-send").click()
    expect(page.get_by_test_id("answer-error")).to_contain_text("not valid JSON", timeout=WAIT_MS)
    value.fill('{"approved": "yes"}')  # JSON the schema refuses: the service's -32602, shown
    form.get_by_test_id("answer-send").click()
    expect(page.get_by_test_id("answer-error")).to_contain_text("approved", timeout=WAIT_MS)
    expect(page.get_by_test_id("answer-error")).not_to_contain_text("not valid JSON")
    assert rpc(service, "tasks.get", {"task_id": "ask-approve"})["waiting"] is not None

    value.fill('{"approved": true}')
    form.get_by_test_id("answer-send").click()
    expect(node(page, "ask-approve")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(node(page, "ask")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(node(page, "ask-approve")).not_to_have_attribute("data-waiting", "input")
    expect(page.get_by_test_id("answer-form")).to_have_count(0, timeout=WAIT_MS)
    assert rpc(service, "tasks.get", {"task_id": "ask-approve"})["result"] == {"approved": True}


def test_typing_into_the_form_keeps_its_focus_while_the_detail_fills_in(services: dict[str, Service],
                                                                        page: Page) -> None:
    """The detail draws at once and adds the attempts table when tasks.attempts answers. That answer
    is held here until the person has begun typing: adding the table must not move the form, or the
    field loses its focus and the rest of what they type goes nowhere (the form then sends null)."""
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [
        {"id": "typing", "name": "typing", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "give a ratio", "schema": {"type": "number"}}}]})
    wait_parked(service, "typing")
    held: list[Any] = []

    def hold_its_attempts(route: Any) -> None:
        body = json.loads(route.request.post_data or "{}")
        if body.get("method") == "tasks.attempts" and body.get("params") == {"task_id": "typing"}:
            held.append(route)
        else:
            route.continue_()

    page.route("**/tasks", hold_its_attempts)
    page.goto(f"{service.url}/ui#/tree/typing")
    node(page, "typing").click()
    expect(page.get_by_test_id("answer-prompt")).to_have_text("give a ratio", timeout=WAIT_MS)
    value = page.get_by_test_id("answer-value")
    value.click()
    page.keyboard.type("0.2")
    deadline = time.monotonic() + WAIT_MS / 1000
    while not held:  # the detail's request for the attempts table, held since the detail was drawn
        assert time.monotonic() < deadline, "the detail never asked for its attempts"
        page.wait_for_timeout(50)
    for route in held:
        route.continue_()
    # Requests on /tasks go straight out from here on. A route's handler runs in this thread, and
    # only while a Playwright call is under way: left in place, it would hold the form's
    # tasks.respond through the plain HTTP polling of wait_status below.
    page.unroute("**/tasks", hold_its_attempts)
    expect(page.get_by_test_id("attempts")).to_be_visible(timeout=WAIT_MS)
    page.keyboard.type("5")
    expect(value).to_have_value("0.25")
    expect(value).to_be_focused()
    page.get_by_test_id("answer-send").click()
    expect_node_status(page, service, "typing", "completed")
    assert wait_status(service, "typing", ("completed",))["result"] == 0.25


def expect_node_status(page: Page, service: Service, task_id: str, status: str) -> None:
    """Wait until the task's node shows `status`; when it never does, fail with what the page shows
    (the node, the form's error line) beside what the service stored, so that a failure says
    whether the page missed an event or the task itself is stuck."""
    try:
        expect(node(page, task_id)).to_have_attribute("data-status", status, timeout=WAIT_MS)
    except AssertionError as exc:
        stored = rpc(service, "tasks.get", {"task_id": task_id})
        shown = node(page, task_id)
        problem = page.get_by_test_id("answer-error")
        raise AssertionError(
            f"{exc}\nnode: data-status={shown.get_attribute('data-status')} "
            f"data-waiting={shown.get_attribute('data-waiting')}; form error: "
            f"{problem.inner_text() if problem.count() and problem.is_visible() else None}\nstored: "
            f"{ {k: stored.get(k) for k in ('status', 'waiting', 'attempt', 'result', 'error', 'updated_at')} }"
        ) from None


def test_the_form_follows_the_schema(services: dict[str, Service], page: Page) -> None:
    service = services["plain"]
    schemas: dict[str, Any] = {
        "text": {"type": "string"}, "count": {"type": "integer", "minimum": 1}, "ratio": {"type": "number"},
        "flag": {"type": "boolean"}, "plan": {"enum": ["a", "b", {"c": 1}]}, "free": None,
    }
    tasks: list[dict[str, Any]] = [{"id": "form", "name": "form"}]
    for name, schema in schemas.items():
        inputs: dict[str, Any] = {"prompt": f"give {name}"}
        if schema is not None:
            inputs["schema"] = schema
        tasks.append({"id": f"form-{name}", "name": name, "parent_id": "form",
                      "schemas": {"method": "human_input_executor"}, "inputs": inputs})
    rpc(service, "tasks.create", {"tasks": tasks})
    for name in schemas:
        wait_parked(service, f"form-{name}")
    page.goto(f"{service.url}/ui#/tree/form")

    def open_form(name: str) -> Any:
        node(page, f"form-{name}").click()
        expect(page.get_by_test_id("answer-prompt")).to_have_text(f"give {name}", timeout=WAIT_MS)
        return page.get_by_test_id("answer-form")

    def answer(form: Any, name: str | None = None) -> None:
        """Send the form; with `name`, an answer the service takes: wait until its node shows the task
        completed (the page follows /ws) before the next form is opened."""
        form.get_by_test_id("answer-send").click()
        if name is not None:
            expect_node_status(page, service, f"form-{name}", "completed")

    form = open_form("text")
    expect(form.get_by_test_id("answer-value")).to_have_attribute("type", "text")
    form.get_by_test_id("answer-value").fill("hello")
    answer(form, "text")
    form = open_form("count")
    expect(form.get_by_test_id("answer-value")).to_have_attribute("type", "number")
    answer(form)  # empty: null, refused by the service (-32602), said on the form
    expect(page.get_by_test_id("answer-error")).to_be_visible(timeout=WAIT_MS)
    form.get_by_test_id("answer-value").fill("0")  # below the minimum
    answer(form)
    expect(page.get_by_test_id("answer-error")).to_contain_text("minimum", timeout=WAIT_MS)
    form.get_by_test_id("answer-value").fill("7")
    answer(form, "count")
    form = open_form("ratio")
    form.get_by_test_id("answer-value").fill("0.25")
    answer(form, "ratio")
    form = open_form("flag")
    expect(form.get_by_test_id("answer-value")).to_have_attribute("type", "checkbox")
    form.get_by_test_id("answer-value").check()
    answer(form, "flag")
    form = open_form("plan")
    expect(form.get_by_test_id("answer-value")).to_have_js_property("tagName", "SELECT")
    form.get_by_test_id("answer-value").select_option(label='{"c":1}')
    answer(form, "plan")
    form = open_form("free")
    expect(form.get_by_test_id("answer-value")).to_have_js_property("tagName", "TEXTAREA")
    form.get_by_test_id("answer-value").fill('[1, "two", null]')
    answer(form, "free")

    for name in schemas:
        expect(node(page, f"form-{name}")).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    results = {name: wait_status(service, f"form-{name}", ("completed",))["result"] for name in schemas}
    assert results == {"text": "hello", "count": 7, "ratio": 0.25, "flag": True, "plan": {"c": 1},
                       "free": [1, "two", None]}


def test_the_tree_list_pages_by_cursor_and_back(services: dict[str, Service], page: Page) -> None:
    """Twenty trees a page: "older" follows next_cursor, "newer" returns to the page before."""
    service = services["plain"]
    for n in range(25):
        rpc(service, "tasks.create", {"tasks": [{"id": f"pager-{n:02}", "name": f"pager {n}",
                                                 "schemas": {"method": "noop_executor"}}]})
    rows = page.locator("[data-testid=tree-row]")
    page.goto(f"{service.url}/ui#/?search=pager-")
    expect(rows).to_have_count(20, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-task-id", "pager-24")
    page.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(5, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-task-id", "pager-04")
    expect(page.get_by_role("link", name="older →")).to_have_count(0)
    page.get_by_role("link", name="← newer").click()
    expect(rows).to_have_count(20, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-task-id", "pager-24")
    expect(page.get_by_role("link", name="← newer")).to_have_count(0)


def test_the_detail_shows_a_budget_and_what_the_tree_used(services: dict[str, Service], page: Page) -> None:
    """Costs and budgets (docs/costs.md): a root's budget, what it leaves and the tree's usage."""
    service = services["plain"]
    rpc(service, "tasks.create", {"tasks": [
        {"id": "cost-root", "name": "cost root", "budget": {"max_tokens": 1000}},
        {"id": "cost-a", "name": "cost a", "parent_id": "cost-root", "schemas": {"method": "noop_executor"}},
    ]})
    wait_status(service, "cost-root", ("completed",), 20)
    page.goto(f"{service.url}/ui#/tree/cost-root")
    node(page, "cost-root").click()
    expect(page.locator('[data-field="budget_remaining"]')).to_contain_text('"tokens": 1000', timeout=WAIT_MS)
    expect(page.locator('[data-field="tree_usage"]')).to_contain_text('"calls": 0')
    expect(page.locator('[data-field="budget"]')).to_contain_text('"max_tokens": 1000')
