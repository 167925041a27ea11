"""Admission: the per-user quotas every surface asks before it does anything (docs/sharing.md, "Quotas and 429").

Two rules, one module:

- **Request rate** (`SERVICE_RATE_LIMIT_PER_USER` requests a second, bursts of
  `SERVICE_RATE_LIMIT_BURST`): each surface calls `admit_request` once per HTTP request, after
  authentication and before the request is read further. Counted in this process's memory (a GCRA
  token bucket: one float per user), so with several instances each allows the rate on its own.
- **Unfinished tasks** (`SERVICE_MAX_PENDING_PER_USER` tasks `pending` or `in_progress`): every
  service operation that stores new tasks asks `quota_for`, and the count is made in the database
  (an index range, so it holds across instances, up to what requests in flight at the same moment
  add): by `tasks.create` inside its own insert (storage/executions.py `insert_tree`), by the
  others through `admit_tasks` just before they write.

Who "the user" is: the token's user with JWT on; with JWT off the `user_id` a request names (the
first `"user_id"` / `"userId"` member of its JSON body), else its client address. Tasks are counted
by their owner (`user_id`; tasks without one are one anonymous owner). Callers with the `admin`
role are exempt while `SERVICE_QUOTA_EXEMPT_ADMINS` is on. A refusal is a QuotaExceeded (-32029,
HTTP 429 with Retry-After), counted in /metrics as taskgrove_admission_refusals_total{reason}.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.errors import QuotaExceeded, invalid_params
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.tree_insert import Quota

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.storage.repository import TaskRepository

# Users whose rate this process remembers at most; past it, users idle long enough to have a full
# bucket again are forgotten first (forgetting them changes nothing), then the least throttled.
MAX_TRACKED_USERS = 10_000
# When to try again after the pending-task quota refused: the service cannot know when the
# caller's own tasks end, so this is a polling interval, not a promise.
PENDING_RETRY_SECONDS = 5
# With JWT off: the user a request names, looked for in the first bytes of its body only.
CLAIM_SCAN_BYTES = 64 * 1024
_CLAIM = re.compile(rb'"(?:user_id|userId)"\s*:\s*"((?:[^"\\]|\\.){1,255})"')


class RequestRate:
    """Per key, at most `per_second` on average and `burst` at once: GCRA (the token bucket kept
    as one "theoretical arrival time" per key). A key whose time has passed is a full bucket,
    the same as a key never seen, which is why idle keys can be forgotten at any moment.

    Hand-written because the libraries at hand (limits, aiolimiter) either wait instead of
    refusing or keep windows of counters per key; this is the whole algorithm."""

    def __init__(self, per_second: float, burst: int, max_keys: int = MAX_TRACKED_USERS) -> None:
        self.interval = 1.0 / per_second
        self.window = burst * self.interval
        self.max_keys = max_keys
        self._due: dict[Hashable, float] = {}

    def take(self, key: Hashable, now: float) -> float:
        """0.0 when one request of `key` may go now (and counts it), else the seconds to wait."""
        due = max(self._due.get(key, now), now)
        # (due - now) first: 0.0 exactly for a key with a full bucket, so its request is never
        # refused by rounding (now + interval - now can come out a hair above interval).
        wait = (due - now) + self.interval - self.window
        if wait > 0:
            return wait
        self._due[key] = due + self.interval
        if len(self._due) > self.max_keys:
            self._forget(now)
        return 0.0

    def __len__(self) -> int:
        return len(self._due)

    def _forget(self, now: float) -> None:
        """Bound the memory: drop every idle key; if most are still busy, keep the most throttled half."""
        self._due = {key: due for key, due in self._due.items() if due > now}
        if len(self._due) > self.max_keys * 3 // 4:
            busiest = sorted(self._due.items(), key=lambda item: item[1], reverse=True)
            self._due = dict(busiest[: self.max_keys // 2])


def claimed_user(body: bytes | None) -> str | None:
    """The `user_id` a request names in its JSON body (JWT off only: nothing is verified then)."""
    if not body:
        return None
    match = _CLAIM.search(body, 0, CLAIM_SCAN_BYTES)
    return match.group(1).decode("utf-8", "replace") if match else None


class Admission:
    def __init__(self, settings: Settings, repo: "TaskRepository", metrics: Metrics) -> None:
        self.settings = settings
        self.repo = repo
        self.metrics = metrics
        self.rate = RequestRate(settings.rate_limit_per_user, settings.rate_limit_burst) \
            if settings.rate_limit_per_user > 0 else None

    def exempt(self, caller: Caller) -> bool:
        return caller.is_admin and self.settings.quota_exempt_admins

    def admit_request(self, ctx: CallContext, body: bytes | None = None,
                      address: str | None = None) -> QuotaExceeded | None:
        """The rate check of one request: None to go on, else the refusal to answer (429).
        `address`: the client's, where the call has no HTTP request (gRPC)."""
        if self.rate is None or self.exempt(ctx.caller):
            return None
        key = requester(ctx, body, self.settings.jwt_enabled, address)
        wait = self.rate.take(key, time.monotonic())
        if not wait:
            return None
        retry_after = max(1, math.ceil(wait))
        who = f"user '{key[1]}'" if key[0] == "user" else f"client {key[1]} (no user named)"
        settings = self.settings
        return self._refused(QuotaExceeded(
            "rate", "SERVICE_RATE_LIMIT_PER_USER", retry_after,
            f"Too many requests: {who} sent more than {settings.rate_limit_per_user:g} requests a second "
            f"(bursts of {settings.rate_limit_burst}; SERVICE_RATE_LIMIT_PER_USER, SERVICE_RATE_LIMIT_BURST). "
            f"Nothing was done; retry after {retry_after} s"))

    def quota_for(self, caller: Caller, owner: str | None, adding: int) -> Quota | None:
        """The pending-task quota storing `adding` new tasks of `owner` must respect (None: none
        applies). The count itself is the storage's, inside the write (tree_insert.insert_tree) or
        just before it (admit_tasks)."""
        limit = self.settings.max_pending_per_user
        if not limit or adding <= 0 or self.exempt(caller):
            return None
        if adding > limit:  # waiting would never help: the request itself is too large
            raise invalid_params(f"The request would store {adding} tasks at once; a user may have at most "
                                 f"{limit} pending or in progress (SERVICE_MAX_PENDING_PER_USER): split it")
        return Quota(owner, limit, adding)

    async def admit_tasks(self, caller: Caller, owner: str | None, adding: int) -> None:
        """Raise QuotaExceeded when storing `adding` new tasks of `owner` would leave the owner
        more than SERVICE_MAX_PENDING_PER_USER tasks pending or in progress."""
        quota = self.quota_for(caller, owner, adding)
        if quota is not None and (unfinished := await self.repo.unfinished_count(owner, quota.limit)) \
                + adding > quota.limit:
            raise self.over_quota(quota, unfinished)

    def over_quota(self, quota: Quota, unfinished: int) -> QuotaExceeded:
        """The refusal of a request whose `quota` had no room: `unfinished` counted up to its limit."""
        limit, owner = quota.limit, quota.owner
        who = f"user '{owner}'" if owner is not None else "the anonymous owner (tasks without a user_id)"
        have = f"at least {limit}" if unfinished >= limit else str(unfinished)
        return self._refused(QuotaExceeded(
            "pending", "SERVICE_MAX_PENDING_PER_USER", PENDING_RETRY_SECONDS,
            f"Over quota: {who} already has {have} tasks pending or in progress, and this request would add "
            f"{quota.adding}; the most is {limit} (SERVICE_MAX_PENDING_PER_USER). Nothing was stored; retry after "
            f"{PENDING_RETRY_SECONDS} s, or once some of those tasks have finished"))

    def _refused(self, refusal: QuotaExceeded) -> QuotaExceeded:
        self.metrics.refused(refusal.reason)
        return refusal


def requester(ctx: CallContext, body: bytes | None, jwt_enabled: bool,
              address: str | None = None) -> tuple[str, str]:
    """Whose rate a request counts against: ("user", name) or ("address", client address). A name
    in the body counts only with JWT off: with JWT on it would let anyone spend another's rate."""
    caller = ctx.caller
    if caller.authenticated and caller.user_id is not None:
        return "user", caller.user_id
    if not jwt_enabled:
        claimed = claimed_user(body)
        if claimed is not None:
            return "user", claimed
    client = ctx.request.client if ctx.request is not None else None
    return "address", client.host if client is not None else address or "unknown"
