"""`mypy --strict` passes on a user's script that uses the client (tests/client_example.py): the
client's types are what its users' type checkers see (py.typed, generics of events and watches).

mypy finds packages by folder name, and the package `taskgrove` is the repository root: it is given
a folder holding one link, `taskgrove`, to the root (as tests/test_types.py does). The repository's
own [tool.mypy] is not read (the script is checked as a user would check it: plain --strict).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = Path(__file__).resolve().parent / "client_example.py"


def _plain_config(where: str) -> Path:
    config = Path(where) / "mypy.ini"
    config.write_text("[mypy]\n", encoding="utf-8")
    return config


def test_mypy_strict_passes_on_a_script_that_uses_the_client() -> None:
    pytest.importorskip("mypy", reason="mypy comes with the `test` extra")
    with tempfile.TemporaryDirectory(prefix="taskgrove-client-mypy-") as where:
        (Path(where) / "taskgrove").symlink_to(ROOT, target_is_directory=True)
        script = Path(where) / "user_script.py"
        script.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                               "--config-file", str(_plain_config(where)), str(script)],
                              cwd=where, env={**os.environ, "MYPYPATH": where}, capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 0, f"mypy --strict on the example:\n{done.stdout}{done.stderr}"


def test_a_type_error_in_a_users_script_is_found() -> None:
    """Guard against a vacuous pass: a script that misuses the client fails under --strict."""
    pytest.importorskip("mypy", reason="mypy comes with the `test` extra")
    wrong = ("from taskgrove import Client\n"
             "with Client() as client:\n"
             "    tree = client.tree('x')\n"
             "    tree.status.upper(1)\n"
             "    print(tree.children[0].progress + 'a')\n")
    with tempfile.TemporaryDirectory(prefix="taskgrove-client-mypy-") as where:
        (Path(where) / "taskgrove").symlink_to(ROOT, target_is_directory=True)
        (Path(where) / "wrong.py").write_text(wrong, encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                               "--config-file", str(_plain_config(where)), "wrong.py"],
                              cwd=where, env={**os.environ, "MYPYPATH": where}, capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 1 and 'Unsupported operand types for + ("float" and "str")' in done.stdout, done.stdout
