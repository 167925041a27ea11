"""The issue's "done when", from a built wheel: in a fresh virtual environment that holds the wheel
(its dependencies are lent by the test's own environment, so nothing is downloaded), a user's script
(tests/client_example.py) builds a three-task tree, watches it to the end answering its
human_input_executor wait, and reads it back, typed, against a `taskgrove serve` started from that
same wheel; and `mypy --strict` passes on the script against the installed package (py.typed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import Service

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = Path(__file__).resolve().parent / "client_example.py"
SOURCES = ("pyproject.toml", "README.md", "__init__.py", "py.typed", "agent-card.json",
           "agent", "client", "executors", "llm", "storage")


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("client-wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:  # a copy: building writes build/ and *.egg-info beside the sources
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(work / "dist"), str(source)], check=True, capture_output=True, timeout=600)
    wheel = next((work / "dist").glob("taskgrove-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "taskgrove/client/py.typed" in names and "taskgrove/py.typed" in names, names
    assert "taskgrove/client/aio.py" in names and not any(n.startswith("tests/") for n in names)

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=600)
    # The dependencies: this environment's site-packages, added as a path (its own .pth files, among
    # them the editable install of the checkout, are not run from there), after the venv's own.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.fixture(scope="module")
def service(wheel_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("client-wheel-service")
    started = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work / 'wheel.db'}"}, "wheel")
    log = open(started.log_path, "a")  # noqa: SIM115 - closed with the process
    started.proc = subprocess.Popen([str(wheel_venv / "bin" / "taskgrove"), "serve"], env=started.env,
                                    stdout=log, stderr=subprocess.STDOUT, text=True, cwd=work)
    started.ready(60)
    try:
        yield started
    finally:
        started.stop()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKGROVE_", "SERVICE_", "PYTHON"))}
    return {**env, **extra}


def test_only_the_wheels_package_is_imported(wheel_venv: Path, tmp_path: Path) -> None:
    found = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                            "import taskgrove, taskgrove.client, sys; print(taskgrove.__file__); "
                            "print('pydantic' in sys.modules)"],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=True)
    where, _ = found.stdout.splitlines()
    assert where.startswith(str(wheel_venv)), where  # the installed wheel, not the checkout


def test_a_users_script_runs_from_the_wheel(wheel_venv: Path, service: Service, tmp_path: Path) -> None:
    script = tmp_path / "release.py"
    shutil.copy2(EXAMPLE, script)
    run = subprocess.run([str(wheel_venv / "bin" / "python"), str(script), "wheel"], cwd=tmp_path,
                         env=clean_env(TASKGROVE_URL=service.url), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:] + "\n" + service.log()[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["status"] == "completed" and seen["all_completed"] and seen["tasks"] == 3, seen
    assert seen["answer"] == {"ship": True} and seen["sync_read"] == "completed", seen
    assert any(e.startswith("answered:") and e.endswith("Ship 1.2.0?") for e in seen["events"]), seen
    assert seen["events"][-1] == "final:wheel-release", seen


def test_mypy_strict_passes_on_the_script_against_the_installed_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the `test` extra")
    script = tmp_path / "release.py"
    shutil.copy2(EXAMPLE, script)
    (tmp_path / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file",
                           str(tmp_path / "mypy.ini"), "--python-executable", str(wheel_venv / "bin" / "python"),
                           str(script)], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
