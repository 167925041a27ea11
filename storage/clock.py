"""The clock of stored times: every time written to the database is UTC text of one shape.

Timestamp columns hold `datetime.isoformat(timespec="microseconds")` text, so they sort and
compare as text (in SQL too) and every instance writes the same width. `now_iso` makes them
without a datetime object per call (every write and event carries one); `iso_in` and
`seconds_until` go from and to a delay (leases, retries, deadlines, idempotency rows,
retention's cut-off). No I/O.
"""

from __future__ import annotations

import functools
import time
from datetime import datetime, timezone


def now_iso(offset_us: int = 0) -> str:
    """UTC now (+ offset) as `datetime.isoformat(timespec="microseconds")` writes it. Every event
    and write carries one, so the date part is formatted once per second, not once per call."""
    second, micro = divmod(time.time_ns() // 1000 + offset_us, 1_000_000)
    return f"{_second_text(second)}.{micro:06d}+00:00"


@functools.lru_cache(maxsize=8)  # now, and the moments a lease or a retry delay ends
def _second_text(second: int) -> str:
    return datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def iso_in(seconds: float) -> str:
    """The stored form of a moment `seconds` from now (the width of the timestamp columns)."""
    return now_iso(round(seconds * 1_000_000))


def seconds_until(stamp: str | None) -> float:
    """Seconds from now until the stored moment `stamp` (negative when past; 0 for none or bad text)."""
    if not stamp:
        return 0.0
    try:
        return (datetime.fromisoformat(stamp) - datetime.now(timezone.utc)).total_seconds()
    except ValueError:
        return 0.0
