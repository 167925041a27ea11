"""The remote command line (`taskgrove tasks ...`, `taskgrove run FILE --url`) as a person or a script
runs it: the real console script against real `taskgrove serve` processes (one without JWT, one with).

Waits are conditions: the service polled until a status holds (Service.wait_status), a watched
process read line by line until the line it must print; never a sleep and a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.processes import Service, plain_and_guarded


# One worker runs this module (make test's --dist loadgroup): its module-scoped services are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_cli_remote")

BIN = Path(sys.executable).parent / "taskgrove"
SECRET = "cli-test-secret-with-enough-bytes-for-hs256"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    with plain_and_guarded(tmp_path_factory.mktemp("remote"), SECRET) as started:
        yield started


def env_for(service: Service | None, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKGROVE_", "SERVICE_"))}
    if service is not None:
        env["TASKGROVE_URL"] = service.url
    if token is not None:
        env["TASKGROVE_TOKEN"] = token
    env["COLUMNS"] = "200"  # rich wraps at the terminal's width; keep rows on one line
    return env


def cli(args: list[str], service: Service | None = None, token: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], env=env_for(service, token), capture_output=True, text=True,
                          timeout=timeout)


def sleeping_tree(prefix: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}-root", "name": f"{prefix} root [red]markup[/red]",
         "schemas": {"method": "aggregate_results_executor"}, "dependencies": [{"id": f"{prefix}-sleep"}]},
        {"id": f"{prefix}-sleep", "name": f"{prefix} sleep", "parent_id": f"{prefix}-root",
         "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 600}},
    ]


def test_list_get_tree_for_people_and_scripts(services: dict[str, Service]) -> None:
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": sleeping_tree("read")}))
    asyncio.run(service.wait_status("read-sleep", ("in_progress",), 20))

    listed = cli(["tasks", "list", "--roots", "--search", "read", "--json"], service)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == ["read-root"]
    assert rows[0]["status_counts"] == {"pending": 1, "in_progress": 1}

    table = cli(["tasks", "list", "--roots"], service)
    assert table.returncode == 0 and "read-root" in table.stdout
    assert "[red]markup[/red]" in table.stdout  # a name is text, never styling
    assert table.stdout.rstrip().endswith("(last page)")  # a table pages by cursor

    asyncio.run(service.rpc("tasks.create", {"tasks": [{"id": "read-two", "name": "read two",
                                                         "schemas": {"method": "noop_executor"}}]}))
    first = cli(["tasks", "list", "--roots", "--search", "read", "--limit", "1", "--cursor", "", "--json"], service)
    page = json.loads(first.stdout)
    assert [r["id"] for r in page["tasks"]] == ["read-two"] and page["next_cursor"]
    following = cli(["tasks", "list", "--roots", "--search", "read", "--limit", "1", "--cursor", page["next_cursor"]],
                    service)
    assert following.returncode == 0 and "read-root" in following.stdout and "read-two" not in following.stdout
    assert following.stdout.rstrip().endswith("(last page)")

    got = cli(["tasks", "get", "read-sleep", "--json"], service)
    assert json.loads(got.stdout)["inputs"] == {"seconds": 600}
    missing = cli(["tasks", "get", "nope"], service)
    assert missing.returncode == 1 and "no task 'nope'" in missing.stderr

    tree = cli(["tasks", "tree", "read-sleep"], service)
    assert tree.returncode == 0, tree.stderr
    assert "read sleep" in tree.stdout and "in_progress" in tree.stdout and "after read-sleep" in tree.stdout
    nested = json.loads(cli(["tasks", "tree", "read-root", "--json"], service).stdout)
    assert nested["children"][0]["id"] == "read-sleep"

    bad = cli(["tasks", "list", "--limit", "0"], service)
    assert bad.returncode == 1 and "limit must be between" in bad.stderr and "Traceback" not in bad.stderr
    asyncio.run(service.rpc("tasks.cancel", {"task_ids": ["read-sleep"]}))


def test_watch_follows_a_running_tree_and_cancel_stops_it(services: dict[str, Service]) -> None:
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": sleeping_tree("watched")}))
    asyncio.run(service.wait_status("watched-sleep", ("in_progress",), 20))
    watch = subprocess.Popen([str(BIN), "tasks", "watch", "watched-root", "--json"], env=env_for(service),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: dict[str, str] = {}
        while seen.get("watched-sleep") != "in_progress":  # the snapshots arrive first
            line = watch.stdout.readline()  # type: ignore[union-attr]
            assert line, watch.stderr.read()  # type: ignore[union-attr]
            message = json.loads(line)
            seen[message["task_id"]] = message["data"]["status"]
        cancelled = cli(["tasks", "cancel", "watched-sleep"], service)
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stderr
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 1, err  # the watched tree failed: its task was cancelled
    lines = [json.loads(line) for line in out.splitlines()]
    # The event that settled the tree, then the outcome.
    assert (lines[-2]["task_id"], lines[-2]["data"]["status"]) == ("watched-sleep", "cancelled")
    assert lines[-1]["status"] == "failed" and lines[-1]["statuses"]["watched-sleep"] == "cancelled"

    again = cli(["tasks", "cancel", "watched-sleep"], service)
    assert again.returncode == 1 and "already cancelled" in again.stdout


def test_execute_and_delete_copies(services: dict[str, Service]) -> None:
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": [
        {"id": "src", "name": "src", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "src-leaf"}]},
        {"id": "src-leaf", "name": "leaf", "parent_id": "src", "schemas": {"method": "noop_executor"}},
    ]}))
    asyncio.run(service.wait_status("src", ("completed",), 20))
    first = asyncio.run(service.rpc("tasks.copy", {"task_id": "src", "children": True}))["id"]
    second = asyncio.run(service.rpc("tasks.copy", {"task_id": "src", "children": True}))["id"]

    ran = cli(["tasks", "execute", first, "--watch", "--json", "--timeout", "60"], service)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1])["status"] == "completed"

    deleted = cli(["tasks", "delete", second, "--json"], service)
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["deleted_count"] == 2
    refused = cli(["tasks", "delete", first], service)  # completed: not deletable, said in one line
    assert refused.returncode == 1 and "non-pending" in refused.stderr and "Traceback" not in refused.stderr


def test_run_file_on_a_remote_service(services: dict[str, Service], tmp_path: Path) -> None:
    service = services["plain"]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"tasks": [
        {"id": "ran", "name": "remote root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "ran-leaf"}]},
        {"id": "ran-leaf", "name": "remote leaf", "parent_id": "ran", "schemas": {"method": "noop_executor"}},
    ]}))
    done = cli(["run", str(good), "--url", service.url])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "remote leaf" in done.stdout and "tree ran: completed" in done.stdout
    assert asyncio.run(service.task("ran-leaf"))["status"] == "completed"  # on the service, not locally

    lone = tmp_path / "lone.json"
    lone.write_text(json.dumps([{"name": "no id", "schemas": {"method": "noop_executor"}}]))
    scripted = cli(["run", str(lone), "--url", service.url, "--json"])
    assert scripted.returncode == 0, scripted.stderr
    assert json.loads(scripted.stdout.splitlines()[-1])["status"] == "completed"

    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps([{"id": "nope", "name": "refused", "schemas": {"method": "command_executor"},
                                    "inputs": {"command": "ls"}}]))
    failed = cli(["run", str(failing), "--url", service.url, "--json"])
    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout.splitlines()[-1])["status"] == "failed"

    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps([{"id": "x"}]))
    refused = cli(["run", str(invalid), "--url", service.url])
    assert refused.returncode == 2 and "invalid tree" in refused.stderr and "Traceback" not in refused.stderr


def test_unreachable_service_is_one_clear_line() -> None:
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for args in (["tasks", "list", "--url", url], ["tasks", "watch", "x", "--url", url]):
        answer = cli(args)
        assert answer.returncode == 2, answer.stderr
        assert "cannot reach the service at" in answer.stderr and "Traceback" not in answer.stderr


def test_tokens_missing_refused_and_accepted(services: dict[str, Service]) -> None:
    service = services["jwt"]
    token = jwt.encode({"user_id": "carol"}, SECRET, algorithm="HS256")
    service.token = token
    asyncio.run(service.rpc("tasks.create", {"tasks": [{"id": "mine", "name": "mine",
                                                         "schemas": {"method": "noop_executor"}}]}))
    asyncio.run(service.wait_status("mine", ("completed",), 20))

    missing = cli(["tasks", "list"], service)
    assert missing.returncode == 3 and "needs a token" in missing.stderr and "Traceback" not in missing.stderr
    wrong = cli(["tasks", "list", "--token", "not-a-token"], service)
    assert wrong.returncode == 3 and "refused the token" in wrong.stderr and "Malformed token" in wrong.stderr
    listed = cli(["tasks", "list", "--json"], service, token=token)  # TASKGROVE_TOKEN
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["mine"]
    watched = cli(["tasks", "watch", "mine", "--json"], service, token=token)  # /ws with the token
    assert watched.returncode == 0, watched.stderr
    assert json.loads(watched.stdout.splitlines()[-1])["status"] == "completed"


def test_watch_a_tree_larger_than_one_connection(services: dict[str, Service]) -> None:
    """/ws takes at most 1000 subscriptions per connection: a larger tree is watched over several."""
    service = services["plain"]
    tasks: list[dict[str, Any]] = [{"id": "wide", "name": "wide", "schemas": {"method": "noop_executor"}}]
    tasks += [{"id": f"wide-{i}", "name": f"leaf {i}", "parent_id": "wide", "schemas": {"method": "noop_executor"}}
              for i in range(1100)]
    asyncio.run(service.rpc("tasks.create", {"tasks": tasks}))
    watched = cli(["tasks", "watch", "wide", "--json", "--timeout", "120"], service, timeout=150)
    assert watched.returncode == 0, watched.stderr
    outcome = json.loads(watched.stdout.splitlines()[-1])
    assert outcome["status"] == "completed" and len(outcome["statuses"]) == 1101


def test_schedules_list_for_people_and_scripts(services: dict[str, Service]) -> None:
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": [{"id": "tmpl-sched", "name": "nightly [b]x[/b]",
                                                        "schemas": {"method": "noop_executor"}}]}))
    created = asyncio.run(service.rpc("schedules.create", {"task_id": "tmpl-sched", "cron": "30 2 * * *",
                                                           "timezone": "Europe/Berlin"}))

    listed = cli(["schedules", "list", "--task-id", "tmpl-sched", "--json"], service)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == [created["id"]] and rows[0]["next_run_at"] == created["next_run_at"]

    table = cli(["schedules", "list"], service)
    assert table.returncode == 0, table.stderr
    assert created["id"] in table.stdout and "cron 30 2 * * * Europe/Berlin" in table.stdout
    assert "tmpl-sched" in table.stdout

    refused = cli(["schedules", "list"], services["jwt"])
    assert refused.returncode == 3 and "Traceback" not in refused.stderr


def test_triggers_create_list_get_runs_delete_for_people_and_scripts(services: dict[str, Service]) -> None:
    """`taskgrove triggers ...`: the triggers.* methods (docs/triggers.md); bad input is exit 2 before any call."""
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": [{"id": "tmpl-trig", "name": "on ticket [b]x[/b]",
                                                        "schemas": {"method": "noop_executor"}}]}))
    bad = cli(["triggers", "create", "tmpl-trig", "cli-ticket", "--match", "{queue: x}"], service)
    assert bad.returncode == 2 and "--match is not valid JSON" in bad.stderr
    lonely = cli(["triggers", "create", "tmpl-trig", "cli-ticket", "--max-wait", "5"], service)
    assert lonely.returncode == 2 and "--max-wait goes with --debounce" in lonely.stderr
    refused = cli(["triggers", "create", "tmpl-trig", "cli-ticket", "--debounce", "0"], service)
    assert refused.returncode == 1 and "debounce.seconds" in refused.stderr and "Traceback" not in refused.stderr

    made = cli(["triggers", "create", "tmpl-trig", "cli-ticket", "--id", "cli-trig", "--match", '{"queue": "support"}',
                "--key", "ticket_id", "--debounce", "0.2", "--max-wait", "5", "--singleton", "queue", "--json"], service)
    assert made.returncode == 0, made.stderr
    trigger = json.loads(made.stdout)
    assert trigger["id"] == "cli-trig" and trigger["match"] == {"queue": "support"}
    assert trigger["debounce"] == {"seconds": 0.2, "max_wait_seconds": 5.0} and trigger["singleton"] == "queue"
    plain = cli(["triggers", "create", "tmpl-trig", "cli-other"], service)
    assert plain.returncode == 0 and "event cli-other runs tmpl-trig (every event)" in plain.stdout, plain.stderr

    listed = cli(["triggers", "list", "--task-id", "tmpl-trig", "--event", "cli-ticket", "--json"], service)
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["cli-trig"]
    table = cli(["triggers", "list", "--task-id", "tmpl-trig"], service)
    assert table.returncode == 0, table.stderr
    assert "cli-trig" in table.stdout and "debounce 0.2s (max 5s), singleton queue, key ticket_id" in table.stdout

    emitted = cli(["events", "emit", "cli-ticket", "--payload", '{"queue": "support", "ticket_id": 7}', "--json"],
                  service)
    assert emitted.returncode == 0 and json.loads(emitted.stdout)["triggered"] == 1, emitted.stderr
    deadline = time.monotonic() + 30
    while not (runs := json.loads(cli(["triggers", "runs", "cli-trig", "--key", "7", "--json"], service).stdout)):
        assert time.monotonic() < deadline, "no run of the trigger within 30 s"
        time.sleep(0.1)
    asyncio.run(service.wait_status(runs[0]["root_task_id"], ("completed",), 20))
    shown = cli(["triggers", "runs", "cli-trig"], service)
    assert shown.returncode == 0 and runs[0]["root_task_id"] in shown.stdout, shown.stderr
    got = cli(["triggers", "get", "cli-trig", "--json"], service)
    assert got.returncode == 0, got.stderr
    assert {k: json.loads(got.stdout)[k] for k in ("matched", "runs", "waiting")} == {"matched": 1, "runs": 1,
                                                                                      "waiting": 0}
    detail = cli(["triggers", "get", "cli-trig"], service)
    assert detail.returncode == 0 and "cli-ticket" in detail.stdout and "last_root_task_id" in detail.stdout

    gone = cli(["triggers", "delete", "cli-trig"], service)
    assert gone.returncode == 0 and "deleted trigger cli-trig" in gone.stdout, gone.stderr
    for args in (["get", "cli-trig"], ["runs", "cli-trig"]):
        missing = cli(["triggers", *args], service)
        assert missing.returncode == 1 and "no trigger 'cli-trig'" in missing.stderr, (args, missing.stderr)
    again = cli(["triggers", "delete", "cli-trig"], service)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert cli(["triggers", "list"], services["jwt"]).returncode == 3


@contextlib.contextmanager
def watching(service: Service, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`taskgrove tasks watch ARGS` running while the block runs; killed if it has not ended."""
    watch = subprocess.Popen([str(BIN), "tasks", "watch", *args], env=env_for(service),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield watch
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def waits_for(service: Service, task_id: str) -> dict[str, Any]:
    """Poll the service until the task waits (it parks just after it starts)."""
    for _ in range(1000):
        task = asyncio.run(service.task(task_id))
        if task and task.get("waiting"):
            return task
        asyncio.run(asyncio.sleep(0.02))
    raise AssertionError(f"task {task_id} never waited")


def test_respond_to_a_waiting_task_that_watch_shows(services: dict[str, Service]) -> None:
    service = services["plain"]
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
    asyncio.run(service.rpc("tasks.create", {"tasks": [
        {"id": "cr", "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "cr-approve"}]},
        {"id": "cr-approve", "name": "approve", "parent_id": "cr", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Approve the [b]refund[/b]?", "schema": schema}}]}))
    waits_for(service, "cr-approve")

    got = cli(["tasks", "get", "cr-approve"], service)
    assert got.returncode == 0, got.stderr
    assert "waits for input: Approve the [b]refund[/b]?" in got.stdout  # a prompt is text, never styling
    assert "taskgrove tasks respond cr-approve --value JSON" in got.stdout
    tree = cli(["tasks", "tree", "cr"], service)
    assert "waits for input: Approve the [b]refund[/b]?" in tree.stdout
    assert json.loads(cli(["tasks", "get", "cr-approve", "--json"], service).stdout)["waiting"]["schema"] == schema

    with watching(service, "cr") as watch:
        while "waits for input" not in (line := watch.stdout.readline()):  # type: ignore[union-attr]
            assert line, watch.stderr.read()  # type: ignore[union-attr]
        assert "Approve the [b]refund[/b]?" in line

        bad_json = cli(["tasks", "respond", "cr-approve", "--value", "{approved: true}"], service)
        assert bad_json.returncode == 2 and "--value is not valid JSON" in bad_json.stderr
        assert "Traceback" not in bad_json.stderr
        refused = cli(["tasks", "respond", "cr-approve", "--value", '{"approved": "yes"}'], service)
        assert refused.returncode == 1 and "tasks.respond" in refused.stderr and "approved" in refused.stderr
        answered = cli(["tasks", "respond", "cr-approve", "--value", '{"approved": true}'], service)
        assert answered.returncode == 0, answered.stderr
        assert "answered cr-approve: resumed" in answered.stdout
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, out + err
    assert "tree cr: completed" in out
    assert asyncio.run(service.task("cr-approve"))["result"] == {"approved": True}
    again = cli(["tasks", "respond", "cr-approve", "--value", "true", "--json"], service)
    assert again.returncode == 1 and "not waiting for input" in again.stderr


def test_watch_json_carries_the_wait_and_events_emit_resumes(services: dict[str, Service]) -> None:
    service = services["plain"]
    asyncio.run(service.rpc("tasks.create", {"tasks": [
        {"id": "ce", "name": "deploy gate", "schemas": {"method": "event_wait_executor"},
         "inputs": {"event": "cli-deployed", "match": {"service": "api"}}}]}))
    waits_for(service, "ce")
    with watching(service, "ce", "--json") as watch:
        snapshot = json.loads(watch.stdout.readline())  # type: ignore[union-attr]
        assert snapshot["data"]["waiting"]["event"] == "cli-deployed"

        bad = cli(["events", "emit", "cli-deployed", "--payload", "{service: api}"], service)
        assert bad.returncode == 2 and "--payload is not valid JSON" in bad.stderr
        not_object = cli(["events", "emit", "cli-deployed", "--payload", "[1]"], service)
        assert not_object.returncode == 2 and "JSON object" in not_object.stderr
        other = cli(["events", "emit", "cli-deployed", "--payload", '{"service": "web"}'], service)
        assert other.returncode == 0 and "resumed 0 task(s)" in other.stdout, other.stderr
        emitted = cli(["events", "emit", "cli-deployed", "--payload", '{"service": "api"}', "--json"], service)
        assert emitted.returncode == 0, emitted.stderr
        answer = json.loads(emitted.stdout)
        assert answer["resumed"] == 1 and answer["task_ids"] == ["ce"]
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, out + err
    lines = [json.loads(line) for line in out.splitlines()]
    resumed = [m for m in lines if "waiting" in m.get("data", {}) and m["data"]["waiting"] is None]
    assert resumed and resumed[0]["data"]["status"] == "pending"
    assert lines[-1]["status"] == "completed"
    assert asyncio.run(service.task("ce"))["result"] == {"service": "api"}


def test_purge_for_admins_with_a_duration(services: dict[str, Service]) -> None:
    """`taskgrove tasks purge --older-than`: tasks.purge, admins only; its errors as one line."""
    service = services["jwt"]
    carol = jwt.encode({"user_id": "carol"}, SECRET, algorithm="HS256")
    admin = jwt.encode({"user_id": "root", "roles": ["admin"]}, SECRET, algorithm="HS256")
    service.token = carol
    asyncio.run(service.rpc("tasks.create", {"tasks": [{"id": "to-purge", "name": "old",
                                                         "schemas": {"method": "noop_executor"}}]}))
    asyncio.run(service.wait_status("to-purge", ("completed",), 20))

    denied = cli(["tasks", "purge", "--older-than", "1s"], service, token=carol)
    assert denied.returncode == 1 and "tasks.purge needs the admin role" in denied.stderr, denied.stderr
    for args in (["--older-than", "soon"], []):  # [] : SERVICE_RETENTION is off there, a duration is needed
        refused = cli(["tasks", "purge", *args], service, token=admin)
        assert refused.returncode == 1 and "older_than" in refused.stderr and "Traceback" not in refused.stderr
    kept = cli(["tasks", "purge", "--older-than", "30d"], service, token=admin)
    assert kept.returncode == 0 and "deleted 0 tree(s)" in kept.stdout, kept.stderr
    assert asyncio.run(service.task("to-purge")) is not None
    purged = cli(["tasks", "purge", "--older-than", "0.01", "--json"], service, token=admin)
    assert purged.returncode == 0, purged.stderr
    answer = json.loads(purged.stdout)
    assert answer["swept"] is True and answer["trees"] >= 1 and answer["older_than"] == 0.01
    assert asyncio.run(service.task("to-purge")) is None
