"""The dashboard's Agents page (#/agents, issue 45 item 6) in Debian's chromium, driven by Playwright
against real `taskgrove serve` processes.

The local service's directory holds two agents: `helper`, a second taskgrove that answers (one
delegated task completes through it), and `deadend`, whose card (served here, its description a
script tag) sends messages to a port nobody listens on, so its one call fails and, with
SERVICE_AGENT_BREAKER_FAILURES=1, opens its breaker for ten minutes. The page shows each agent's
skills, health (successes, failures, p50/p95, last error), breaker and recent calls; the health
filter narrows the list; a card's words are shown as text, never run.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.processes import Service
from tests.test_ui_browser import WAIT_MS, XSS, _chromium, rpc, wait_status

pytestmark = pytest.mark.xdist_group("test_ui_agents_browser")

DEAD_CARD = {"name": "Dead End", "description": f"Never answers {XSS}", "version": "1.0.0",
             "protocolVersion": "0.3.0", "url": "http://127.0.0.1:1/a2a", "preferredTransport": "JSONRPC",
             "capabilities": {}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
             "skills": [{"id": "nothing", "name": "Nothing", "description": "Does nothing", "tags": ["void"],
                         "examples": ["Do nothing"]}]}


class _Card(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        body = json.dumps(DEAD_CARD).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def card_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Card)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    tmp: Path = tmp_path_factory.mktemp("ui-agents")
    remote = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}"}, "remote").launch()
    local = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'local.db'}",
                          "SERVICE_AGENT_BREAKER_FAILURES": "1", "SERVICE_AGENT_BREAKER_COOLDOWN_SECONDS": "600",
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
        opened = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        errors: list[str] = []
        opened.on("pageerror", lambda exc: errors.append(str(exc)))
        opened.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))  # alert(1) = XSS
        try:
            yield opened
        finally:
            browser.close()
        assert not errors, errors


def delegate(service: Service, agent: str) -> str:
    task_id = f"ask-{agent}-{uuid.uuid4().hex[:6]}"
    rpc(service, "tasks.create", {"tasks": [
        {"id": task_id, "name": f"ask {agent}", "schemas": {"method": "a2a_agent_executor"},
         "inputs": {"agent": agent, "poll_interval": 0.1, "timeout": 30, "data": {"tasks": [
             {"id": f"{task_id}-remote", "name": "remote noop", "schemas": {"method": "noop_executor"}}]}}}]})
    return task_id


def test_the_agents_page_shows_skills_health_breaker_and_recent_calls(
        pair: tuple[Service, Service], card_url: str, page: Page) -> None:
    remote, local = pair
    rpc(local, "agents.add", {"card_url": remote.url, "name": "helper", "tags": ["tests"]})
    rpc(local, "agents.add", {"card_url": card_url, "name": "deadend"})
    assert wait_status(local, delegate(local, "helper"), ("completed", "failed"), timeout=60)["status"] == "completed"
    assert wait_status(local, delegate(local, "deadend"), ("completed", "failed"), timeout=60)["status"] == "failed"
    assert rpc(local, "agents.get", {"name": "deadend"})["breaker"] == "open"

    page.goto(f"{local.url}/ui#/agents")
    rows = page.get_by_test_id("agent-row")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    helper = page.locator('[data-testid=agent-row][data-agent="helper"]')
    dead = page.locator('[data-testid=agent-row][data-agent="deadend"]')

    # skills from the card, health from the real calls
    expect(helper.get_by_test_id("agent-skill").filter(has_text="tasks.execute")).to_have_count(1)
    expect(helper).to_have_attribute("data-health", "healthy")
    expect(helper.locator("[data-field=calls]")).to_contain_text("1 ok · 0 failed")
    expect(helper.locator("[data-field=latency]")).to_contain_text(" ms / ")
    expect(helper.locator("[data-field=breaker]")).to_have_text("closed")
    expect(helper.locator("[data-field=last-error]")).to_have_text("—")

    # the failing agent: its failure, its last error, its open breaker
    expect(dead).to_have_attribute("data-health", "open")
    expect(dead.get_by_test_id("agent-skill")).to_contain_text("nothing")
    expect(dead.locator("[data-field=calls]")).to_contain_text("0 ok · 1 failed")
    expect(dead.locator("[data-field=last-error]")).not_to_have_text("—")
    expect(dead.locator("[data-field=breaker]")).to_contain_text("open until ")
    expect(dead.locator("[data-field=description]")).to_have_text(f"Never answers {XSS}")  # text, not markup
    expect(page.locator("main img")).to_have_count(0)

    # recent calls, on demand, under the agent's row
    dead.get_by_test_id("show-calls").click()
    calls = page.locator('[data-testid=agent-calls][data-agent="deadend"]').get_by_test_id("agent-call")
    expect(calls).to_have_count(1, timeout=WAIT_MS)
    expect(calls.first).to_have_attribute("data-ok", "false")
    helper.get_by_test_id("show-calls").click()
    helper_calls = page.locator('[data-testid=agent-calls][data-agent="helper"]').get_by_test_id("agent-call")
    expect(helper_calls).to_have_count(1, timeout=WAIT_MS)
    expect(helper_calls.first).to_have_attribute("data-ok", "true")

    # the health filter (agents.list's `health`)
    page.get_by_test_id("agents-health").select_option("open")
    expect(page.get_by_test_id("agent-row")).to_have_count(1, timeout=WAIT_MS)
    expect(page.get_by_test_id("agent-row")).to_have_attribute("data-agent", "deadend")
    page.get_by_test_id("agents-health").select_option("failing")
    expect(page.get_by_test_id("no-agents")).to_be_visible(timeout=WAIT_MS)

    # the nav link, and a refresh from the page (agents.refresh)
    page.get_by_test_id("nav-agents").click()
    expect(page.get_by_test_id("agent-row")).to_have_count(2, timeout=WAIT_MS)
    before = rpc(local, "agents.get", {"name": "helper"})["fetched_at"]
    page.locator('[data-testid=agent-row][data-agent="helper"]').get_by_test_id("refresh-agent").click()
    expect(page.locator("#notice")).to_contain_text("Agent helper: card refreshed", timeout=WAIT_MS)
    assert rpc(local, "agents.get", {"name": "helper"})["fetched_at"] >= before
