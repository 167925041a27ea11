"""`taskgrove serve` keeps freed memory (agent.cli.keep_freed_memory): a process that allocates
and frees the same 20 MB again and again, as a server answering large trees does, takes its
pages from the system once, not every time (each time is a page fault per 4 kB)."""

from __future__ import annotations

import subprocess
import sys

CHURN = """
import resource, sys
if sys.argv[1] == "keep":
    from taskgrove.agent.cli import keep_freed_memory
    keep_freed_memory()

def churn():
    blocks = [bytearray(200_000) for _ in range(100)]
    del blocks

churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_freed_memory_is_reused_without_page_faults() -> None:
    kept, default = _faults("keep"), _faults("default")
    assert kept < 1_000, (kept, default)  # 20 x 20 MB churned: ~100,000 faults when given back each time
    assert kept * 10 < default, (kept, default)
