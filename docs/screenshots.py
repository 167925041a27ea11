"""The screenshots of docs/dashboard.md (docs/screenshots/*.png), and the render time of a 1000-task
tree, taken with the tooling of the browser tests: a real `taskgrove serve`, Playwright driving
Debian's chromium. Run with `make screenshots`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, expect, sync_playwright

OUT = Path(__file__).resolve().parent / "screenshots"
BIN = Path(sys.executable).parent / "taskgrove"
WAIT_MS = 30_000


def rpc(base: str, method: str, params: Any, path: str = "/tasks") -> Any:
    answer = httpx.post(f"{base}{path}", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                        timeout=120).json()
    assert "error" not in answer, answer
    return answer["result"]


def demo_tree() -> list[dict[str, Any]]:
    """A report built from three fetches, one of which fails, and a slow step still running."""
    noop = {"method": "noop_executor"}
    return [
        {"id": "nightly", "name": "nightly report", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "merge"}, {"id": "publish"}]},
        {"id": "fetch", "name": "fetch sources", "parent_id": "nightly", "schemas": noop},
        {"id": "fetch-a", "name": "fetch orders", "parent_id": "fetch", "schemas": noop},
        {"id": "fetch-b", "name": "fetch refunds", "parent_id": "fetch", "schemas": noop},
        {"id": "fetch-c", "name": "fetch stock (remote)", "parent_id": "fetch",
         "schemas": {"method": "command_executor"}, "inputs": {"command": "curl stock"}},
        {"id": "merge", "name": "merge tables", "parent_id": "nightly", "schemas": {"method": "sleep_executor"},
         "inputs": {"seconds": 600}, "dependencies": [{"id": "fetch-a"}, {"id": "fetch-b"}]},
        {"id": "stock", "name": "stock summary", "parent_id": "nightly", "schemas": noop,
         "dependencies": [{"id": "fetch-c"}]},
        {"id": "publish", "name": "publish", "parent_id": "nightly", "schemas": noop,
         "dependencies": [{"id": "merge"}, {"id": "stock", "required": False}]},
    ]


def big_tree(size: int = 1000) -> list[dict[str, Any]]:
    """`size` tasks: chains of ten under one root that aggregates the chains' heads."""
    tasks: list[dict[str, Any]] = [{"id": "big", "name": "1000 tasks", "schemas": {"method": "aggregate_results_executor"},
                                    "dependencies": [{"id": f"big-{i}"} for i in range(9, size - 1, 10)]}]
    for i in range(size - 1):
        task: dict[str, Any] = {"id": f"big-{i}", "name": f"step {i}", "parent_id": "big",
                                "schemas": {"method": "noop_executor"}}
        if i % 10:
            task["dependencies"] = [{"id": f"big-{i - 1}"}]
        tasks.append(task)
    return tasks


def wait_status(base: str, task_id: str, status: str) -> None:
    deadline = time.monotonic() + 60
    while (rpc(base, "tasks.get", {"task_id": task_id}) or {}).get("status") != status:
        assert time.monotonic() < deadline, f"{task_id} never reached {status}"
        time.sleep(0.1)


def render_ms(page: Page, base: str, root: str) -> float:
    page.goto(f"{base}/ui#/")
    expect(page.get_by_test_id("trees")).to_be_visible(timeout=WAIT_MS)
    page.goto(f"{base}/ui#/tree/{root}")
    expect(page.locator("body[data-render-ms]")).to_have_count(1, timeout=WAIT_MS)
    return float(page.locator("body").get_attribute("data-render-ms") or "nan")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as work, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        env.update({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(port), "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                    "SERVICE_DATABASE_URL": f"sqlite:///{work}/shots.db", "SERVICE_SHUTDOWN_GRACE_SECONDS": "1"})
        server = subprocess.Popen([str(BIN), "serve"], env=env, cwd=work, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    rpc(base, "system.health", {}, "/system")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "taskgrove serve did not start"
                    time.sleep(0.1)
            rpc(base, "examples.init", {}, "/system")
            rpc(base, "tasks.create", {"tasks": big_tree()})
            rpc(base, "tasks.create", {"tasks": demo_tree()})
            wait_status(base, "big", "completed")
            wait_status(base, "merge", "in_progress")
            shoot(base)
        finally:
            server.terminate()
            server.wait(timeout=30)


def shoot(base: str) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 860})
        page.goto(f"{base}/ui")
        expect(page.locator('[data-testid=tree-row][data-task-id="nightly"]')).to_be_visible(timeout=WAIT_MS)
        page.screenshot(path=OUT / "trees.png")

        page.goto(f"{base}/ui#/tree/nightly")
        expect(page.locator('g.node[data-task-id="merge"]')).to_have_attribute("data-status", "in_progress",
                                                                               timeout=WAIT_MS)
        expect(page.locator('g.node[data-task-id="fetch-c"]')).to_have_attribute("data-status", "failed")
        page.locator('g.node[data-task-id="fetch-c"]').click()
        expect(page.locator('[data-field="error"]')).to_be_visible(timeout=WAIT_MS)
        page.screenshot(path=OUT / "tree.png")

        page.goto(f"{base}/ui#/system")
        expect(page.get_by_test_id("executors")).to_be_visible(timeout=WAIT_MS)
        page.screenshot(path=OUT / "executors.png")

        times = [render_ms(page, base, "big") for _ in range(5)]
        expect(page.get_by_test_id("live")).to_have_text("live", timeout=WAIT_MS)
        page.screenshot(path=OUT / "big-tree.png")
        clicks = []
        for task_id in ("big-500", "big-998", "big-3"):  # responsive: a click answered with the detail
            started = time.perf_counter()
            page.locator(f'g.node[data-task-id="{task_id}"]').click()
            expect(page.locator('[data-field="id"]')).to_have_text(task_id, timeout=WAIT_MS)
            clicks.append((time.perf_counter() - started) * 1000)
        print("1000-task tree, time to the first drawn frame (tasks.tree fetch, layout, DOM, paint), ms: "
              + ", ".join(f"{t:.0f}" for t in times) + f"; median {sorted(times)[len(times) // 2]:.0f}")
        print("click on a task to its detail shown (tasks.get included, measured from Python), ms: "
              + ", ".join(f"{t:.0f}" for t in clicks))
        browser.close()
    print(f"screenshots written to {OUT}")


if __name__ == "__main__":
    main()
