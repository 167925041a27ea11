#!/usr/bin/env python3
"""Run both A2A TCK branches against a real `taskgrove serve` and compare with the known differences.

What it does (`make tck`, and a step of `.ci/run`):
1. copies `../shared/a2a-tck/{1.0-dev,0.3.x}` (or --tck-dir) into a work directory and gives each a
   venv with its requirements (pip, from the package index; reused while the copy is unchanged);
2. starts the fake LLM server (`tests/fakellm.py --default "[[tree:valid]]"`: every plain-language
   request plans into a valid three-task tree, nothing leaves the machine) and `taskgrove serve` on
   free loopback ports with a fresh SQLite file, `SERVICE_ALLOW_PRIVATE_URLS=true` (the TCKs' webhook
   receivers listen on loopback), `SERVICE_GRPC_PORT` (the gRPC transport on) and
   `SERVICE_LLM_BASE_URL` pointing at the fake;
3. runs the 1.0-dev kit on its three transports (`--transport jsonrpc,http_json,grpc`) and the 0.3.x
   kit (`--category all --transports jsonrpc`), reads their machine reports (JUnit XML;
   pytest-json-report per category);
4. compares every test that failed or errored with `.ci/tck-expected.txt`, the committed list of
   known differences (each explained in docs/tck.md). A failure or error that is not listed
   fails the step; a listed test that now passes is reported so that the list can shrink
   (`--strict` fails on those too), except entries marked `flaky` (they pass or fail by timing).
   Skips are counted and printed, not compared.

Run time: about 40 s for both kits on a laptop (1.0-dev ~12 s, 0.3.x ~25 s) after the venvs exist;
the first run adds the two `pip install`s (~1 min).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BAD = ("failed", "error")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and ".venv" not in p.parts and "reports" not in p.parts):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def prepare(source: Path, target: Path, extra: list[str]) -> Path:
    """A writable copy of one TCK with its venv; reinstalled only when the source changed."""
    stamp = target / ".tck-stamp"
    digest = tree_digest(source)
    if not (stamp.exists() and stamp.read_text() == digest):
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
        subprocess.run([sys.executable, "-m", "venv", str(target / ".venv")], check=True)
        subprocess.run([str(target / ".venv/bin/pip"), "install", "-q", "-e", ".", *extra], cwd=target, check=True)
        stamp.write_text(digest)
    reports = target / "reports"
    if reports.exists():
        shutil.rmtree(reports)
    return target / ".venv/bin/python"


def wait_for(url: str, timeout: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"tck: {url} did not answer (exit code {process.poll()})")
            time.sleep(0.2)


def stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def junit_outcomes(path: Path) -> dict[str, str]:
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds:
            outcome = "failed"
        elif "error" in kinds:
            outcome = "error"
        elif "skipped" in kinds:
            outcome = "xfailed" if kinds["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        outcomes[test_id] = outcome
    return outcomes


KIT_TIMEOUT = 900  # seconds; a kit that hangs (a stream never closed) must not hold CI for ever


def run_kit(command: list[str], kit: Path) -> None:
    """One kit run; its console output goes to `run.log` beside its reports."""
    with open(kit / "run.log", "w") as log:
        try:
            subprocess.run(command, cwd=kit, stdout=log, stderr=subprocess.STDOUT, check=False, timeout=KIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"tck: {kit.name} did not finish within {KIT_TIMEOUT} s; see {kit / 'run.log'}")


def run_10(python: Path, kit: Path, url: str) -> dict[str, str]:
    run_kit([str(python), "run_tck.py", "--sut-host", url, "--transport", "jsonrpc,http_json,grpc"], kit)
    outcomes = {f"1.0-dev::{k}": v for k, v in junit_outcomes(kit / "reports/junitreport.xml").items()}
    levels = json.loads((kit / "reports/compatibility.json").read_text())
    counts = collections.Counter((r["level"], r["status"]) for r in levels["per_requirement"].values())
    print("tck 1.0-dev requirements:", ", ".join(f"{lvl} {st}: {n}" for (lvl, st), n in sorted(counts.items())))
    print("tck 1.0-dev summary:", json.dumps(levels["summary"]))
    return outcomes


CATEGORIES_03 = ("mandatory", "capabilities", "transport-equivalence", "quality", "features")


def run_03(python: Path, kit: Path, url: str) -> dict[str, str]:
    run_kit([str(python), "run_tck.py", "--sut-url", url, "--category", "all", "--transports", "jsonrpc",
             "--compliance-report", "compliance.json"], kit)
    outcomes = {}
    for category in CATEGORIES_03:
        path = kit / "reports" / f"{category}_jsonrpc_results.json"
        if not path.exists():
            path = kit / "reports" / f"{category}_results.json"
        if not path.exists():
            print(f"tck 0.3.x {category}: no report written")
            continue
        for test in json.loads(path.read_text()).get("tests", []):
            outcome = test["outcome"]
            if outcome == "failed" and any(test.get(s, {}).get("outcome") == "failed" for s in ("setup", "teardown")):
                outcome = "error"
            outcomes[f"0.3.x::{category}::{test['nodeid']}"] = outcome
    by_category = collections.defaultdict(collections.Counter)
    for test_id, outcome in outcomes.items():
        by_category[test_id.split("::")[1]][outcome] += 1
    for category, counts in by_category.items():
        print(f"tck 0.3.x {category}:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return outcomes


def read_expected(path: Path) -> dict[str, str]:
    expected = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            outcome, test_id = line.split(None, 1)
            expected[test_id.strip()] = outcome
    return expected


def _default_tck_dir() -> Path:
    """`../shared/a2a-tck` beside the checkout; a clone elsewhere on this machine (CI's clean
    checkout) finds the workplace's copy, or TASKGROVE_TCK_DIR."""
    for candidate in (os.environ.get("TASKGROVE_TCK_DIR"), REPO.parent / "shared" / "a2a-tck",
                      Path("/work/shared/a2a-tck")):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return REPO.parent / "shared" / "a2a-tck"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tck-dir", type=Path, default=_default_tck_dir())
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "taskgrove-tck")
    parser.add_argument("--expected", type=Path, default=REPO / ".ci" / "tck-expected.txt")
    parser.add_argument("--strict", action="store_true", help="also fail when a listed test passes now")
    parser.add_argument("--write-expected", action="store_true", help="rewrite the list from this run")
    args = parser.parse_args()
    if not args.tck_dir.is_dir():
        print(f"tck: {args.tck_dir} not found; nothing to run", file=sys.stderr)
        return 1
    args.work.mkdir(parents=True, exist_ok=True)
    py10 = prepare(args.tck_dir / "1.0-dev", args.work / "1.0-dev", [])
    py03 = prepare(args.tck_dir / "0.3.x", args.work / "0.3.x", ["pytest-html"])

    llm = server = None
    started = time.monotonic()
    try:
        llm = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakellm.py"), "--default", "[[tree:valid]]"],
                               stdout=subprocess.PIPE, text=True)
        assert llm.stdout is not None
        llm_url = llm.stdout.readline().strip()
        if not llm_url.startswith("http://"):
            raise SystemExit(f"tck: the fake LLM server did not start (exit code {llm.poll()})")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        database = args.work / "tck.db"
        database.unlink(missing_ok=True)
        env = dict(os.environ, SERVICE_API_HOST="127.0.0.1", SERVICE_API_PORT=str(port), SERVICE_PUBLIC_URL=url,
                   SERVICE_DATABASE_URL=f"sqlite:///{database}", SERVICE_ALLOW_PRIVATE_URLS="true",
                   SERVICE_GRPC_PORT=str(free_port()),
                   SERVICE_LLM_BASE_URL=llm_url, SERVICE_LLM_MAX_RETRIES="0")
        log = open(args.work / "serve.log", "w")  # noqa: SIM115 (closed with the process)
        server = subprocess.Popen([str(Path(sys.executable).parent / "taskgrove"), "serve"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, cwd=args.work)
        wait_for(f"{url}/.well-known/agent-card.json", 60, server)
        outcomes = {**run_10(py10, args.work / "1.0-dev", url), **run_03(py03, args.work / "0.3.x", url)}
    finally:
        stop(server)
        stop(llm)
    print(f"tck: both kits ran in {time.monotonic() - started:.0f} s; reports in {args.work}/*/reports")

    bad = {k: v for k, v in outcomes.items() if v in BAD}
    if args.write_expected:
        lines = [f"{v} {k}" for k, v in sorted(bad.items())]
        args.expected.write_text("# written by .ci/tck.py --write-expected; each entry is explained in docs/tck.md\n"
                                 + "\n".join(lines) + "\n")
        print(f"tck: wrote {len(lines)} entries to {args.expected}")
        return 0
    expected = read_expected(args.expected)
    new = sorted(k for k in bad if k not in expected)
    # "flaky" entries pass or fail by timing (docs/tck.md says why): never reported as fixed.
    fixed = sorted(k for k, v in expected.items() if outcomes.get(k) not in BAD and v != "flaky")
    skipped = collections.Counter(k.split("::")[0] for k, v in outcomes.items() if v == "skipped")
    print(f"tck: {len(bad)} failed or errored, all but {len(new)} known; skipped: {dict(skipped)}")
    for test_id in new:
        print(f"NEW {bad[test_id]}: {test_id}")
    for test_id in fixed:
        print(f"now {outcomes.get(test_id, 'not run')}: {test_id} (listed in {args.expected.name}; remove it)")
    return 1 if new or (args.strict and fixed) else 0


if __name__ == "__main__":
    sys.exit(main())
