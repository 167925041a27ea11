"""Prometheus metrics of one service: what the engine does and what HTTP clients ask.

One `Metrics` per app, on a registry of its own (a test process builds many apps; the default
global registry would refuse the second). The engine reports into it; the HTTP middleware below
counts every request by surface, method and status code; `/metrics` (agent/surfaces/operations.py) renders
it, after refreshing the gauges that are read from the database at scrape time.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401 - re-exported for the route

from taskgrove.storage.status import TASK_STATUSES

# The label sets are closed: an unknown executor id or path never creates a new time series.
SURFACES = {"tasks": "tasks", "system": "system", "graphql": "graphql", "ws": "ws", "a2a": "a2a",
            "": "a2a", ".well-known": "card", "metrics": "operations", "healthz": "operations",
            "readyz": "operations"}
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
REFUSAL_REASONS = ("pending", "rate")
RETENTION_KINDS = ("trees", "tasks", "events", "idempotency_records", "trigger_events")
MAX_LLM_MODELS = 50  # models named in the taskgrove_llm_* series; later ones are counted as `other`
TOP_USERS = 20  # users named in taskgrove_user_tasks; the rest are summed as `other`
# (path, method, status) triples whose HTTP series are remembered (Metrics.http_series): the
# paths a service answers are few, and a flood of distinct ones only stops the remembering.
MAX_HTTP_KEYS = 1_000


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tasks = Gauge("taskgrove_tasks", "Stored tasks by status (read at scrape time)", ["status"], registry=r)
        self.started = Counter("taskgrove_executions_started", "Attempts started, by executor",
                               ["executor"], registry=r)
        self.finished = Counter("taskgrove_executions_finished",
                                "Attempts ended, by executor and outcome (completed, failed, retry, "
                                "cancelled, interrupted, parked)", ["executor", "outcome"], registry=r)
        self.duration = Histogram("taskgrove_execution_duration_seconds", "How long attempts ran, by executor",
                                  ["executor"], registry=r,
                                  buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800))
        self.retries = Counter("taskgrove_retries", "Failed attempts that will be tried again, by executor",
                               ["executor"], registry=r)
        self.queue = Gauge("taskgrove_runnable_queue_depth", "Tasks runnable here, waiting for a free slot",
                           registry=r)
        self.running = Gauge("taskgrove_running_tasks", "Attempts running in this instance", registry=r)
        self.passes = Histogram("taskgrove_engine_pass_seconds", "Duration of one engine pass (writes and claims)",
                                registry=r, buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1, 5))
        self.requests = Counter("taskgrove_http_requests", "HTTP requests, by surface, method and status code",
                                ["surface", "method", "code"], registry=r)
        self.latency = Histogram("taskgrove_http_request_duration_seconds", "HTTP request latency",
                                 ["surface", "method"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))
        self.deferrals = Counter("taskgrove_deferrals", "Runnable tasks held back without a slot, by reason "
                                 "(key: a concurrency key at its limit, rate: a rate limit)", ["reason"], registry=r)
        self.refusals = Counter("taskgrove_admission_refusals", "Requests refused by a per-user quota (HTTP 429), "
                                "by reason (pending: SERVICE_MAX_PENDING_PER_USER, rate: "
                                "SERVICE_RATE_LIMIT_PER_USER)", ["reason"], registry=r)
        for reason in REFUSAL_REASONS:  # both series exist from the start, at 0
            self.refusals.labels(reason)
        self.user_tasks = Gauge("taskgrove_user_tasks", "Tasks of this instance's executions per user: running, "
                                "or runnable and waiting for a slot, its key or its rate (the "
                                f"{TOP_USERS} busiest users by name, the rest as `other`; no user as `none`)",
                                ["user", "state"], registry=r)
        self.parked = Gauge("taskgrove_parked_tasks", "Tasks parked on a durable wait in this instance's "
                            "executions, by kind of wait (input, event, timer); they hold no slot",
                            ["kind"], registry=r)
        # JSON-RPC calls by method (a name of the endpoint's method table, else `other`: the label
        # set stays closed) and outcome (ok: a result, error: a JSON-RPC error), on every surface.
        # One histogram, not a counter beside it: its `_count` is the count of calls, and every
        # call then costs one observation (about 2 us), not two.
        self.rpc_latency = Histogram("taskgrove_rpc_request_duration_seconds",
                                     "JSON-RPC call latency, by method and outcome (ok, error); _count counts calls",
                                     ["method", "outcome"], registry=r,
                                     buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))
        self.queue_wait = Histogram("taskgrove_queue_wait_seconds", "How long attempts waited from runnable "
                                    "(created, dependencies done, retry due, wait answered) to started",
                                    registry=r, buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800))
        self.retention = Counter("taskgrove_retention_deleted", "What retention deleted (SERVICE_RETENTION, "
                                 "tasks.purge), by kind: trees, tasks, events, idempotency_records, trigger_events", ["kind"],
                                 registry=r)
        for kind in RETENTION_KINDS:  # every series exists from the start, at 0
            self.retention.labels(kind)
        self.llm_tokens = Counter("taskgrove_llm_tokens", "LLM tokens used, by provider, model (the first "
                                  f"{MAX_LLM_MODELS} models seen by name, the rest as `other`) and kind "
                                  "(prompt, completion)", ["provider", "model", "kind"], registry=r)
        self.llm_cost = Counter("taskgrove_llm_cost_usd", "LLM cost in US dollars from litellm's price table "
                                "(calls of models without a price add nothing), by provider and model",
                                ["provider", "model"], registry=r)
        self.llm_calls = Counter("taskgrove_llm_calls", "LLM calls, by provider, model and whether litellm "
                                 "has a price for the model (priced: yes, no)", ["provider", "model", "priced"],
                                 registry=r)
        self._llm_models: set[str] = set()
        self._known_executors: frozenset[str] = frozenset()
        # The children of the labelled series, looked up once (labels() takes a lock every call).
        self._children: dict[tuple[Any, ...], Any] = {}
        # The two series of HTTP requests by (path, method, status): see http_series.
        self._http: dict[tuple[str, str, int], tuple[Callable[[float], None], Callable[[float], None]]] = {}
        # The engine's per-attempt and per-pass series as plain functions (see _counting, _observing).
        self._adders: dict[tuple[Any, ...], Callable[[float], None]] = {}
        self._observe_queue_wait = _observing(self.queue_wait)
        self._observe_pass = _observing(self.passes)

    def know_executors(self, ids: list[str]) -> None:
        self._known_executors = frozenset(ids)

    def _executor(self, executor_id: str | None) -> str:
        if not executor_id:
            return "none"  # a grouping task
        return executor_id if executor_id in self._known_executors else "unknown"

    # --- the engine reports ---------------------------------------------------------------

    def child(self, metric: Any, *labels: str) -> Any:
        child = self._children.get((metric, *labels))
        if child is None:
            child = self._children[(metric, *labels)] = metric.labels(*labels)
        return child

    def _adder(self, metric: Any, *labels: str) -> Callable[[float], None]:
        """The child's inc (a counter) or observe (a histogram) as a plain function, made once."""
        add = self._adders.get((metric, *labels))
        if add is None:
            child = self.child(metric, *labels)
            add = self._adders[(metric, *labels)] = \
                _observing(child) if isinstance(metric, Histogram) else _counting(child)
        return add

    def attempt_started(self, executor_id: str | None) -> None:
        self._adder(self.started, self._executor(executor_id))(1)

    def attempt_ended(self, executor_id: str | None, outcome: str, seconds: float | None) -> None:
        executor = self._executor(executor_id)
        self._adder(self.finished, executor, outcome)(1)
        if outcome == "retry":
            self._adder(self.retries, executor)(1)
        if seconds is not None:
            self._adder(self.duration, executor)(seconds)

    def deferred(self, reason: str) -> None:
        self.child(self.deferrals, reason).inc()

    def refused(self, reason: str) -> None:
        """A quota refusal (agent/services/admission.py); `reason` is `pending` or `rate`, nothing else."""
        self.child(self.refusals, reason).inc()

    def queue_waited(self, seconds: float | None) -> None:
        """An attempt started `seconds` after its task became runnable (engine/history.py)."""
        if seconds is not None:
            self._observe_queue_wait(seconds)

    def rpc_call(self, method: str, outcome: str, seconds: float) -> None:
        """One JSON-RPC call answered (agent/surfaces/jsonrpc.py call_one): `method` is already
        bounded (a known name or `other`), `outcome` is `ok` or `error`."""
        self._adder(self.rpc_latency, method, outcome)(seconds)

    def http_series(self, path: str, method: str, status: int) -> tuple[Callable[[float], None],
                                                                          Callable[[float], None]]:
        """How an HTTP request is counted (HttpMetrics): the `inc` of its request counter and the
        `observe` of its latency histogram, as the plain functions of _adder: its surface from the
        path's first segment (SURFACES, else `other`), its method (HTTP_METHODS, else `other`)
        and status code. Remembered per (path, method, status), up to MAX_HTTP_KEYS: every
        request would otherwise cut its path up and look up two children again."""
        series = self._http.get((path, method, status))
        if series is None:
            surface = SURFACES.get(path.strip("/").split("/", 1)[0], "other")
            verb = method if method in HTTP_METHODS else "other"
            series = (self._adder(self.requests, surface, verb, str(status)), self._adder(self.latency, surface, verb))
            if len(self._http) < MAX_HTTP_KEYS:
                self._http[(path, method, status)] = series
        return series

    def retention_deleted(self, trees: int, tasks: int) -> None:
        """One retention batch deleted `trees` trees holding `tasks` tasks (agent/services/retention_service.py)."""
        if trees:
            self.child(self.retention, "trees").inc(trees)
            self.child(self.retention, "tasks").inc(tasks)

    def retention_deleted_records(self, kind: str, count: int) -> None:
        """One retention batch deleted `count` rows of `kind`: `events` (stored events),
        `idempotency_records` or `trigger_events` (handled inbox rows of triggers)
        (agent/services/retention_service.py)."""
        if count:
            self.child(self.retention, kind).inc(count)

    def llm_call(self, provider: str, model: str, prompt_tokens: int, completion_tokens: int,
                 cost_usd: float | None) -> None:
        """One LLM call (llm/usage.py CallUsage); the model label is bounded (MAX_LLM_MODELS)."""
        model = model[:64]
        if model not in self._llm_models:
            if len(self._llm_models) < MAX_LLM_MODELS:
                self._llm_models.add(model)
            else:
                model = "other"
        self.child(self.llm_tokens, provider, model, "prompt").inc(prompt_tokens)
        self.child(self.llm_tokens, provider, model, "completion").inc(completion_tokens)
        self.child(self.llm_calls, provider, model, "no" if cost_usd is None else "yes").inc()
        if cost_usd is not None:
            self.child(self.llm_cost, provider, model).inc(cost_usd)

    def engine_pass(self, seconds: float) -> None:
        self._observe_pass(seconds)

    # --- scrape ---------------------------------------------------------------------------

    def render(self, by_status: Mapping[str, int], queue_depth: int, running: int,
               per_user: Mapping[Any, Mapping[str, int]] | None = None,
               parked: Mapping[str, int] | None = None) -> bytes:
        for status in TASK_STATUSES:
            self.tasks.labels(status).set(by_status.get(status, 0))
        self.queue.set(queue_depth)
        self.running.set(running)
        self._set_user_tasks(per_user or {})
        for kind, count in (parked or {}).items():
            self.parked.labels(kind).set(count)
        return generate_latest(self.registry)

    def _set_user_tasks(self, per_user: Mapping[Any, Mapping[str, int]]) -> None:
        """The busiest users by name, the rest summed as `other`: the label set stays bounded
        however many users the service has."""
        self.user_tasks.clear()
        ranked = sorted(per_user.items(), key=lambda item: -sum(item[1].values()))
        other: dict[str, int] = {"running": 0, "runnable": 0}
        for index, (user, counts) in enumerate(ranked):
            if index >= TOP_USERS:
                for state in other:
                    other[state] += counts.get(state, 0)
                continue
            for state in other:
                self.user_tasks.labels("none" if user is None else str(user)[:64], state).set(counts.get(state, 0))
        if len(ranked) > TOP_USERS:
            for state, value in other.items():
                self.user_tasks.labels("other", state).set(value)


def _counting(child: Any) -> Callable[[float], None]:
    """A counter child's `inc` for the engine's amounts (never negative, no exemplar): its value's
    own inc. Why: `Counter.inc` first checks, in two more Python calls, that it is not a parent
    with labels, which a child never is; the engine counts several times per attempt, and a
    1000-task chain is 1000 attempts. Falls back to `inc` if the library keeps its value otherwise."""
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else child.inc


def _observing(histogram: Any) -> Callable[[float], None]:
    """A histogram (child)'s `observe` without an exemplar: its sum, then the first bucket whose
    bound is at least the amount (found by bisection, not a Python loop over the bounds), as
    `Histogram.observe` does them; a NaN goes into no bucket, as there. Why: as `_counting`.
    Falls back to `observe` if the library keeps its values otherwise."""
    total: Any = getattr(histogram, "_sum", None)
    bounds = list(getattr(histogram, "_upper_bounds", None) or ())
    buckets = getattr(histogram, "_buckets", None) or ()
    if not callable(getattr(total, "inc", None)) or not bounds or len(bounds) != len(buckets) \
            or bounds != sorted(bounds) or bounds[-1] != math.inf:
        return histogram.observe
    add_sum = total.inc
    add_to = [bucket.inc for bucket in buckets]

    def observe(amount: float) -> None:
        add_sum(amount)
        if amount <= math.inf:  # false only for NaN
            add_to[bisect_left(bounds, amount)](1)

    return observe


class HttpMetrics:
    """ASGI middleware: counts and times every HTTP request (WebSocket upgrades are not timed)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            count, observe = self.metrics.http_series(scope["path"], scope["method"], status)
            count(1)
            observe(time.perf_counter() - started)
