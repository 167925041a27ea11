"""Every `curl` example of the docs runs, as written and in order, against one fresh `taskgrove serve`.

The examples are the shell blocks of README.md and of the pages in mkdocs.yml's nav, in that order:
each command that starts with `curl` or with `rpc` (the docs' own curl function, defined in
docs/jsonrpc.md). A command is run by bash exactly as printed; only the address of the service is
substituted (`localhost:8000`, and `localhost:9000`, the second service of the a2a_agent_executor
example). An example's answer must be JSON-RPC (or an SSE stream of it, or GraphQL) with no error,
unless the comment lines under the command show that error's code; a tree an example creates must
complete, unless the table below says why it cannot here.

The services run with what the pages start theirs with (`SERVICE_COMMAND_ALLOWLIST=df,git`,
`SERVICE_API_PROTOCOL=graphql` for `/graphql`, a `shop` connection for database_executor,
`SERVICE_ALLOW_PRIVATE_URLS=true` for the agent on this machine), plus the fake LLM
(tests/fakellm.py) for the LLM examples and `SERVICE_SECRET_KEY` for `config.llm_key.set`.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakellm import FakeLLMServer
from tests.processes import Service, start_together

REPO = Path(__file__).resolve().parent.parent
SHELL_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```$", re.S | re.M)
RPC_FUNCTION = re.compile(r"^rpc\(\) \{.*\}$", re.M)
SHOWN_CODE = re.compile(r'"code":\s*(-\d+)')

# Trees of docs/waits.md and docs/agents.md that stop on a wait which a later example answers (tasks.respond,
# events.emit): when created, each unfinished task of theirs waits, or is pending behind a wait.
ANSWERED_LATER = {"refund", "deploy-gate", "delegated-refund"}

# Trees of the docs that cannot complete on a machine without the outside world: the error they fail with.
CANNOT_COMPLETE = {
    "open-issue": "api.example.com",  # rest_executor calls https://api.example.com: no network here
    "gather": "All connection attempts failed",  # the ADK and pydantic-ai agents run under `make interop`
}


@dataclass
class Example:
    page: str
    command: str
    shown: list[str] = field(default_factory=list)  # the comment lines under it: the answer the docs show

    def complete(self) -> bool:
        try:
            shlex.split(self.command)
        except ValueError:  # an open quote: the JSON goes on on the next line
            return False
        return not self.command.endswith("\\")


def pages() -> list[Path]:
    """README.md, then the pages in the order of the site's navigation."""

    def walk(items: list[Any]) -> Iterator[str]:
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from (walk(value) if isinstance(value, list) else [value])

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    # A nav entry without its file fails `make docs` (mkdocs build --strict); here it has no examples.
    return [REPO / "README.md"] + [p for p in (REPO / "docs" / name for name in walk(nav) if name != "index.md")
                                   if p.exists()]


def examples(page: Path) -> Iterator[Example]:
    for block in SHELL_BLOCK.finditer(page.read_text()):
        current: Example | None = None
        for line in block.group(1).splitlines():
            if line.startswith(("curl ", "rpc ")):
                if current:
                    yield current
                current = Example(page.name, line)
            elif current and not current.complete():
                current.command += "\n" + line
            elif current and line.startswith("#"):
                current.shown.append(line)
            elif current:
                yield current
                current = None
        if current:
            yield current


def rpc_function() -> str:
    found = [m.group(0) for page in pages() for m in RPC_FUNCTION.finditer(page.read_text())]
    assert len(found) == 1, f"the docs define their rpc() function once: {found}"
    return found[0]


def answers(output: str) -> list[dict[str, Any]]:
    """The JSON documents of an answer: one, a batch's, or each `data:` line of an SSE stream."""
    text = output.strip()
    if text.startswith(("event:", "data:")):
        return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    body = json.loads(text)
    return body if isinstance(body, list) else [body]


def created_roots(example: Example, answer: dict[str, Any]) -> list[dict[str, Any]]:
    if '"tasks.create"' not in example.command or "result" not in answer:
        return []
    return [answer["result"]]


def resting_on_waits(root: dict[str, Any]) -> bool:
    """Every unfinished task waits (docs/waits.md) or is pending behind one, and one waits."""
    stack, waits = [root], 0
    while stack:
        node = stack.pop()
        waits += bool(node.get("waiting"))
        if node["status"] not in ("completed", "pending") and not node.get("waiting"):
            return False
        stack.extend(node.get("children") or [])
    return waits > 0


def unfinished(root: dict[str, Any]) -> list[str]:
    stack, left = [root], []
    while stack:
        node = stack.pop()
        if node["status"] != "completed":
            left.append(f"{node['id']}: {node['status']} {node.get('error')}")
        stack.extend(node.get("children") or [])
    return left


def check(example: Example, output: str) -> None:
    allowed = {int(code) for line in example.shown for code in SHOWN_CODE.findall(line)}
    documents = answers(output)
    assert documents, "no answer"
    for document in documents:
        if "errors" in document or "data" in document and "jsonrpc" not in document:  # GraphQL
            assert not document.get("errors"), document
            continue
        if "jsonrpc" not in document:  # an SSE event after the JSON-RPC result: the tree's own events
            assert document.get("type") != "final" or document["status"] == "completed", document
            continue
        error = document.get("error")
        assert error is None or error["code"] in allowed, f"an error the docs do not show: {error}"
        assert error is not None or "result" in document, document
        for root in created_roots(example, document):
            if root["id"] in ANSWERED_LATER:
                assert resting_on_waits(root), unfinished(root)
            elif root["id"] in CANNOT_COMPLETE:
                assert any(CANNOT_COMPLETE[root["id"]] in line for line in unfinished(root)), unfinished(root)
            else:
                assert not unfinished(root), unfinished(root)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    work = tmp_path_factory.mktemp("docs-examples")
    shop = work / "shop.db"
    with sqlite3.connect(shop) as db:  # what docs/executors.md's `shop` query reads
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL, created_at TEXT)")
        db.execute("INSERT INTO orders VALUES (42, 'ACME', 1250.0, '2025-03-01')")
    fake = FakeLLMServer(default_marker="[[tree:valid]]").start()
    remote = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work}/remote.db"}, name="remote")
    service = Service(work, {
        "SERVICE_DATABASE_URL": f"sqlite:///{work}/taskgrove.db",
        "SERVICE_API_PROTOCOL": "graphql",
        "SERVICE_COMMAND_ALLOWLIST": "df,git",
        "SERVICE_DB_CONNECTIONS": json.dumps({"shop": {"url": f"sqlite:///{shop}"}}),
        "SERVICE_LLM_BASE_URL": fake.base_url,
        "SERVICE_SECRET_KEY": "docs-examples-secret-key-of-some-length",
    })
    try:
        yield start_together(service, remote)
    finally:
        service.stop()
        remote.stop()
        fake.stop()


def test_every_curl_example_of_the_docs_runs_in_order(services: tuple[Service, Service]) -> None:
    service, remote = services
    assert shutil.which("curl"), "the examples are curl commands: install curl (Debian's package)"
    prelude = rpc_function() + "\n"
    found = [example for page in pages() for example in examples(page)]
    assert len(found) >= 40 and {e.page for e in found} >= {"README.md", "jsonrpc.md", "executors.md"}, found
    for example in found:
        command = (prelude + example.command).replace("localhost:8000", service.url.removeprefix("http://"))
        command = command.replace("localhost:9000", remote.url.removeprefix("http://"))
        run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                             env={**service.env, "OPENAI_API_KEY": "sk-docs-example"})
        where = f"{example.page}: {example.command[:160]}"
        assert run.returncode == 0, f"{where}\n{run.stderr}"
        try:
            check(example, run.stdout)
        except (AssertionError, ValueError) as problem:
            raise AssertionError(f"{where}\nanswered: {run.stdout[:2000]}\n{problem}") from None
