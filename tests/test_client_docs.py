"""Every Python example of docs/client.md runs, as written and in order, against one fresh
`taskgrove serve`, as a user's script would: each block in its own `python` process, with
TASKGROVE_URL naming the service (the examples say `Client()` and read it from there, or name
localhost:8000, which is substituted as tests/test_docs_examples.py does for the curl examples).

A `print(...)` line that shows its output in a comment (`print(x)  # completed 2`) must print
those words: the page shows what really comes out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import Service

PAGE = Path(__file__).resolve().parent.parent / "docs" / "client.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
SHOWN = re.compile(r"^\s*print\(.*\)\s+#\s*(.+)$")


def blocks() -> list[str]:
    return [match.group(1) for match in PYTHON_BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]


def shown_words(block: str) -> list[str]:
    """The words a block's print comments say it prints, without the punctuation around them."""
    words = []
    for line in block.splitlines():
        found = SHOWN.match(line)
        if found:
            words += [w.strip("[](){},'\"") for w in found.group(1).split()]
    return [w for w in words if w]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("client-docs")
    started = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work / 'docs.db'}"}, "client-docs").start()
    try:
        yield started
    finally:
        started.stop()


def test_every_python_example_of_the_client_page_runs(service: Service, tmp_path: Path) -> None:
    found = blocks()
    assert len(found) >= 8, "docs/client.md shows the client in Python blocks"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("TASKGROVE_", "SERVICE_"))},
           "TASKGROVE_URL": service.url}
    for number, block in enumerate(found, 1):
        code = block.replace("http://localhost:8000", service.url)
        script = tmp_path / f"example_{number}.py"
        script.write_text(code, encoding="utf-8")
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                             env=env, cwd=tmp_path)
        where = f"docs/client.md, Python example {number}:\n{block}"
        assert run.returncode == 0, f"{where}\nfailed:\n{run.stderr[-3000:]}"
        missing = [word for word in shown_words(block) if word not in run.stdout]
        assert not missing, f"{where}\nprinted:\n{run.stdout}\nbut not what its comments show: {missing}"
