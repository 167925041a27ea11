"""Executors with no outside effects: collecting dependency results, no-ops, sleeps and waits.

They are always safe to enable, so demos, benchmarks and concurrency tests can build trees
from them without configuring anything.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from taskgrove.executors.base import ABSENT, ExecutionContext, Executor


class AggregateResultsExecutor(Executor):
    """Gathers the results of the task's dependencies into one result.

    The usual root of a fan-in tree: its dependencies do the work, it presents the answers
    together, keyed by dependency task id.
    """

    id = "aggregate_results_executor"
    pure = True  # no await, no side effect: may complete inline (agent/engine/inline.py)
    name = "Aggregate results"
    extension = "core"
    description = "Collects the results of this task's dependencies: {results: {task_id: result}, count}."
    input_schema = {"type": "object"}

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        results = dict(context.dependency_results)
        return {"results": results, "count": len(results)}


class NoopExecutor(Executor):
    """Does nothing and answers at once: measures the engine's own overhead in benchmarks."""

    id = "noop_executor"
    pure = True  # no await, no side effect: may complete inline (agent/engine/inline.py)
    name = "No-op"
    extension = "core"
    description = "Does nothing; returns {ok: true, inputs} at once. For benchmarks and tests."
    input_schema = {"type": "object"}

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        return {"ok": True, "inputs": inputs}


class SleepExecutor(Executor):
    """Waits a given time, reporting progress: a stand-in for slow work in demos and tests."""

    id = "sleep_executor"
    name = "Sleep"
    extension = "core"
    description = ("Sleeps inputs.seconds (0..3600, default 0.1), reporting progress; cancellable. Sleeps of at "
                   "least SERVICE_PARK_SLEEP_SECONDS (default 5) are durable timers: the task holds no slot and "
                   "survives restarts; shorter ones sleep in process, which costs less.")
    input_schema = {
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "maximum": 3600, "default": 0.1},
        },
    }

    # Progress is published at most this many times per run, and at least every second.
    PROGRESS_STEPS = 10
    # Seconds between two stored checkpoints (each is a database write).
    CHECKPOINT_EVERY = 0.5

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._started: float | None = None

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        seconds = float(inputs.get("seconds", 0.1))
        if seconds >= getattr(context.settings, "park_sleep_seconds", float("inf")):
            await context.sleep(seconds)  # parks; runs again once the time is up, and returns at once
            return {"slept": seconds}
        # A later attempt (after a crash or a timeout) sleeps only what the last one had left.
        slept_before = float((context.last_checkpoint or {}).get("slept", 0.0))
        self._started = time.monotonic() - slept_before
        deadline = self._started + seconds
        step = min(1.0, seconds / self.PROGRESS_STEPS) if seconds > 0 else 0.0
        saved = time.monotonic()
        while (remaining := deadline - time.monotonic()) > 0:
            # asyncio.sleep is a cancellation point: the engine's cancel stops us here.
            await asyncio.sleep(min(step, remaining))
            slept = min(seconds, time.monotonic() - self._started)
            done = slept / seconds
            if time.monotonic() - saved >= self.CHECKPOINT_EVERY and slept < seconds:
                await context.checkpoint({"slept": round(slept, 3)})  # how far we got, for a later attempt
                saved = time.monotonic()
            await context.report_progress(done, f"slept {done * seconds:.2f}s of {seconds:g}s")
        return {"slept": seconds, **({"resumed_after": slept_before} if slept_before else {})}

    async def cancel(self) -> dict[str, Any] | None:
        if self._started is None:
            return None
        return {"result": {"slept": round(time.monotonic() - self._started, 3), "cancelled": True}}


_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": 31_536_000}


class HumanInputExecutor(Executor):
    """Asks a person (or an agent) for an answer and waits for it without holding a slot."""

    id = "human_input_executor"
    name = "Human input"
    extension = "core"
    description = ("Waits for an answer to inputs.prompt, given through tasks.respond and valid against "
                   "inputs.schema (a JSON Schema, optional); the answer is the result. Holds no slot while it "
                   "waits. After inputs.timeout_seconds: inputs.default if given, else the task fails.")
    input_schema = {
        "type": "object",
        "properties": {"prompt": {"type": "string", "minLength": 1, "maxLength": 10_000},
                       "schema": {"type": "object"}, "timeout_seconds": _TIMEOUT, "default": {}},
        "required": ["prompt"],
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        return await context.wait_for_input(inputs["prompt"], inputs.get("schema"), inputs.get("timeout_seconds"),
                                            inputs.get("default", ABSENT))


class EventWaitExecutor(Executor):
    """Waits for an event (events.emit) of the task's user, without holding a slot."""

    id = "event_wait_executor"
    name = "Wait for an event"
    extension = "core"
    description = ("Waits for an event named inputs.event, emitted by the task's user (events.emit) after the "
                   "wait began, whose payload has every key of inputs.match with the same value; the payload is "
                   "the result. Holds no slot while it waits. After inputs.timeout_seconds: inputs.default if "
                   "given, else the task fails.")
    input_schema = {
        "type": "object",
        "properties": {"event": {"type": "string", "minLength": 1, "maxLength": 255},
                       "match": {"type": "object"}, "timeout_seconds": _TIMEOUT, "default": {}},
        "required": ["event"],
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        return await context.wait_for_event(inputs["event"], inputs.get("match"), inputs.get("timeout_seconds"),
                                            inputs.get("default", ABSENT))
