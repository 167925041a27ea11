"""mypy on the package, at the strictness pyproject.toml's [tool.mypy] chose (it says why): any error fails.

The repository root is the package `taskgrove` (pyproject.toml's package-dir), but its folder is not
named so, and mypy finds packages by folder name: it is given a folder holding one link, `taskgrove`,
to the root. The cache lives in .mypy_cache/ at the root (ignored by git), so a second run checks only
what changed. `python -m tests.test_types` prints mypy's report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_mypy() -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="taskgrove-mypy-") as where:
        (Path(where) / "taskgrove").symlink_to(ROOT, target_is_directory=True)
        env = {**os.environ, "MYPYPATH": where}
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(ROOT / ".mypy_cache"), "--python-executable", sys.executable],
            cwd=where, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_passes_on_the_package() -> None:
    pytest.importorskip("mypy", reason="mypy comes with the `test` extra")
    done = run_mypy()
    assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"


if __name__ == "__main__":
    result = run_mypy()
    print(result.stdout + result.stderr, end="")
    sys.exit(result.returncode)
