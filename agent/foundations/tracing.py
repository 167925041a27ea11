"""OpenTelemetry traces: one trace per tree execution, one span per task attempt (docs/observability.md).

Off unless `OTEL_TRACES_EXPORTER` names an exporter (`otlp`: OTLP over HTTP, `console`):
`ENABLED` is then False, nothing of OpenTelemetry is imported, and the engine's only cost is
reading that flag once per attempt. The rest of the standard variables (`OTEL_SERVICE_NAME`,
`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, ...) are read by the SDK itself, as every OpenTelemetry
program reads them: the one exception to "the environment is read by agent/foundations/settings.py only".

Why the spans are made from stored state. An execution may be driven by several instances in
turn (a crash and a takeover, a restart): no instance can keep its execution span open from the
start to the end. So:

- the execution's `traceparent` is stored with it (`executions.traceparent`): the caller's, or,
  when the caller sent none, a fresh trace id with a zero parent id (the execution is the root);
- the execution span's id is derived from the execution id (`execution_span_id`), so every
  instance knows it without asking: attempt spans, interrupted attempts and retry waits are its
  children, whichever instance emits them;
- the execution span itself is emitted once, by the instance that ends the execution, with the
  stored start time (`created_at`) and that derived id;
- an attempt span's id is derived from its execution, task and claim (`attempt_span_id`): an
  attempt cut off mid-call is reported under the id its calls carried, by the instance that
  settles it, and never also by its own instance (which drops its span when it learns the attempt
  was settled: agent/engine/live_attempts.py), so the called service's spans keep their parent.

So a trace survives a kill -9: the attempt that died with its instance is reported by the
instance that settles it (`interrupted`), its re-run by the instance that takes the execution
over, and the execution span by whoever ends it, all in the caller's trace.

A malformed incoming `traceparent` is ignored (W3C: the receiver restarts the trace), never an
error. Span attributes carry ids, names of executors, numbers and outcomes, never a task's
inputs, results, errors, headers or keys.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from taskgrove.storage.status import TaskStatus

if TYPE_CHECKING:
    from taskgrove.agent.foundations.settings import Settings

log = logging.getLogger(__name__)

# Read once per attempt by the engine: True only after `setup` installed an exporter.
ENABLED = False

EXPORTERS = ("otlp", "console", "none")
SCOPE = "taskgrove"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_SPAN = "0" * 16

_tracer: Any = None
_provider: Any = None
# The ids the next span must take (the execution span's derived id, a root's stored trace id):
# read by _StoredIds, the SDK's id generator, set only around one start_span call.
_forced: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "taskgrove_forced_ids", default=(None, None))


# --- the W3C header, without OpenTelemetry -------------------------------------------------

def parse_traceparent(value: str | None) -> str | None:
    """`value` as a valid W3C traceparent (version 00 form, lower case), or None: a malformed
    header is ignored, as W3C Trace Context asks (the receiver starts a new trace)."""
    if not value or len(value) > 512:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or span_id == _ZERO_SPAN:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def stored_traceparent(incoming: str | None) -> str | None:
    """What a new execution stores: the caller's context; without one, while traces are on, a
    new trace whose root is the execution (zero parent id); otherwise nothing."""
    if incoming is not None:
        return incoming
    if not ENABLED:
        return None
    return f"00-{secrets.token_hex(16)}-{_ZERO_SPAN}-01"


def execution_span_id(execution_id: str) -> int:
    """The execution span's id, the same on every instance: 8 bytes of a hash of its id."""
    value = int.from_bytes(hashlib.sha256(execution_id.encode()).digest()[:8], "big")
    return value or 1


def attempt_span_id(execution_id: str, task_id: str, lease_epoch: int) -> int:
    """An attempt span's id, the same on every instance: a hash of its execution, task and claim
    (each claim has an epoch of its own). The calls an attempt makes carry it, so when its
    instance dies mid-call, the instance that settles it reports it under that id, and the
    called service's spans stay its children."""
    key = f"{execution_id}\n{task_id}\n{lease_epoch}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") or 1


def execution_header(traceparent: str | None, execution_id: str) -> str | None:
    """The `traceparent` that makes a call a child of the execution span (webhooks, pushes)."""
    if not ENABLED or not traceparent:
        return None
    _, trace_id, _, flags = traceparent.split("-")[:4]
    return f"00-{trace_id}-{execution_span_id(execution_id):016x}-{flags}"


def header_of(span: Any) -> str:
    """The `traceparent` that makes a call a child of `span` (what executors send)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# --- setup ----------------------------------------------------------------------------------

def setup(settings: Settings) -> None:
    """Install the exporters `settings.traces_exporter` names (none: stay off)."""
    global ENABLED, _tracer, _provider
    names = [n for n in settings.traces_exporter if n != "none"]
    if not names or ENABLED:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": settings.traces_service_name}),
                              id_generator=_id_generator(), shutdown_on_exit=False)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    _provider, _tracer, ENABLED = provider, provider.get_tracer(SCOPE), True


def shutdown() -> None:
    """Flush and stop the exporters (the service's stop: a drained SIGTERM loses no span)."""
    global ENABLED, _tracer, _provider
    if _provider is None:
        return
    provider, _provider, _tracer, ENABLED = _provider, None, None, False
    try:
        provider.shutdown()
    except Exception as exc:  # an unreachable collector must not fail the shutdown
        log.warning("flushing traces failed: %s", exc)


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # The standard output of now: the SDK's default is the one of when it was first imported.
        return ConsoleSpanExporter(out=sys.stdout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


@contextmanager
def _ids(trace_id: int | None, span_id: int) -> Iterator[None]:
    """Spans started inside take these ids (a trace id None: their parent's), see _id_generator."""
    token = _forced.set((trace_id, span_id))
    try:
        yield
    finally:
        _forced.reset(token)


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _StoredIds(RandomIdGenerator):
        """Random ids, except where a span must take a stored or derived one (see the module)."""

        def generate_span_id(self) -> int:
            return _forced.get()[1] or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _forced.get()[0] or super().generate_trace_id()

    return _StoredIds()


# --- spans ----------------------------------------------------------------------------------

def _ns(stamp: str | None) -> int | None:
    if not stamp:
        return None
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1e9)
    except ValueError:
        return None


def _parent(traceparent: str | None, execution_id: str) -> Any:
    """The context whose span is the execution span (for attempts and their waits)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, flags = _trace_of(traceparent, execution_id)
    ctx = SpanContext(trace_id, execution_span_id(execution_id), is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _trace_of(traceparent: str | None, execution_id: str) -> tuple[int, int]:
    """(trace id, flags) of a stored traceparent; an execution stored without one (traces were
    off when it began) gets a trace id derived from its id, the same on every instance."""
    if not traceparent:
        return int.from_bytes(hashlib.sha256(execution_id.encode()).digest()[8:24], "big") or 1, 1
    _, trace_id, _, flags = traceparent.split("-")[:4]
    return int(trace_id, 16), int(flags, 16)


def start_attempt(task: Mapping[str, Any], execution_id: str, traceparent: str | None, executor: str | None,
                  ready_since: str | None) -> Any:
    """The span of an attempt that starts now, a child of its execution's span."""
    now = time.time_ns()
    waited = _ns(ready_since)
    attributes = {
        "taskgrove.task_id": task["id"], "taskgrove.root_task_id": task["task_tree_id"],
        "taskgrove.execution_id": execution_id, "taskgrove.executor": executor or "",
        "taskgrove.attempt": int(task.get("attempt") or 1),
        "taskgrove.wait_seconds": max(0.0, (now - waited) / 1e9) if waited else 0.0,
    }
    with _ids(None, attempt_span_id(execution_id, task["id"], int(task.get("lease_epoch") or 0))):
        return _tracer.start_span("taskgrove attempt", context=_parent(traceparent, execution_id),
                                  attributes=attributes, start_time=now)


def end_attempt(span: Any, outcome: Mapping[str, Any] | None, cancelled: bool) -> None:
    """End an attempt's span with its outcome; a retry's delay becomes a `retry wait` span."""
    from opentelemetry.trace import Status, StatusCode

    if outcome is None:
        word = "cancelled" if cancelled else "stopped"
    elif "wait" in outcome:
        word = "waiting"
    else:
        word = "retrying" if "delay" in outcome else outcome["values"].get("status", "failed")
    span.set_attribute("taskgrove.outcome", word)
    if word in ("failed", "retrying"):
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    if outcome is not None and "delay" in outcome:
        _retry_wait(span, outcome)


def _retry_wait(attempt_span: Any, outcome: Mapping[str, Any]) -> None:
    """The wait before the next attempt: from now until its `next_attempt_at`."""
    from opentelemetry import trace

    parent = getattr(attempt_span, "parent", None)
    if parent is None:  # the attempt was not sampled (the caller's flags): neither is its wait
        return
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    attributes = dict(attempt_span.attributes or {})
    attributes.pop("taskgrove.outcome", None)
    attributes["taskgrove.retry_delay_seconds"] = float(outcome["delay"])
    span = _tracer.start_span("taskgrove retry wait", context=context, attributes=attributes)
    span.end(end_time=_ns(outcome["values"].get("next_attempt_at")) or time.time_ns())


def interrupted(task: Mapping[str, Any], traceparent: str | None, executor: str | None, outcome: str) -> None:
    """An attempt whose instance stopped renewing its lease (a crash, a pause): reported by the
    instance that settles it, from the attempt's stored start to now."""
    from opentelemetry.trace import Status, StatusCode

    attributes = {
        "taskgrove.task_id": task["id"], "taskgrove.root_task_id": task["task_tree_id"],
        "taskgrove.execution_id": task.get("execution_id") or "", "taskgrove.executor": executor or "",
        "taskgrove.attempt": int(task.get("attempt") or 1), "taskgrove.outcome": outcome,
        "taskgrove.lease_owner": task.get("lease_owner") or "",
    }
    # The id the attempt had, and its calls carried (attempt_span_id).
    with _ids(None, attempt_span_id(task["execution_id"], task["id"], int(task.get("lease_epoch") or 0))):
        span = _tracer.start_span("taskgrove interrupted attempt", context=_parent(traceparent, task["execution_id"]),
                                  attributes=attributes, start_time=_ns(task.get("started_at")))
    span.set_status(Status(StatusCode.ERROR))
    span.end()


def end_execution(execution_id: str, traceparent: str | None, root_task_id: str, started_at: str | None,
                  status: str) -> None:
    """Emit the execution's span, now that it ended: stored start, derived id, the caller's
    span (or none) as parent."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

    trace_id, flags = _trace_of(traceparent, execution_id)
    caller = traceparent.split("-")[2] if traceparent else _ZERO_SPAN
    if caller == _ZERO_SPAN:
        context: Any = Context()
    else:
        remote = SpanContext(trace_id, int(caller, 16), is_remote=True, trace_flags=TraceFlags(flags))
        context = trace.set_span_in_context(NonRecordingSpan(remote))
    with _ids(trace_id, execution_span_id(execution_id)):
        span = _tracer.start_span("taskgrove execution", context=context, kind=trace.SpanKind.SERVER,
                                  start_time=_ns(started_at), attributes={
                                      "taskgrove.execution_id": execution_id, "taskgrove.root_task_id": root_task_id,
                                      "taskgrove.outcome": status})
    if status != TaskStatus.COMPLETED:
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def ready_since(row: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]], execution_started: str) -> str:
    """When the task could have started: the latest of its execution's start, its retry's due
    time and its dependencies' ends (ISO stamps compare as text)."""
    stamps = [execution_started, row.get("next_attempt_at") or ""]
    for dep in row.get("dependencies") or ():
        found = rows.get(dep["id"])
        if found is not None:
            stamps.append(found.get("completed_at") or "")
    return max(stamps)
