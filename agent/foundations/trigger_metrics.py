"""The /metrics counters of event triggers (docs/triggers.md), on the app's own registry.

Beside agent/foundations/metrics.py rather than in it: triggers are a concern of their own, and the
counters are only what this instance did (the trigger's row holds the totals across instances).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

# What the counter `taskgrove_trigger_events` counts, by `outcome` (a closed set of labels).
OUTCOMES = ("matched", "debounced", "batched", "skipped")


class TriggerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter("taskgrove_trigger_events", "Events of triggers, by outcome: matched (taken in by "
                              "a trigger), debounced (folded into a later event's run), batched (went into a "
                              "batch's run), skipped (singleton skip, or dropped by a cancel_on)", ["outcome"],
                              registry=registry)
        for outcome in OUTCOMES:
            self.events.labels(outcome)
        self.runs = Counter("taskgrove_trigger_runs_started", "Runs started by triggers", registry=registry)
        self.cancelled = Counter("taskgrove_trigger_runs_cancelled", "Runs a trigger cancelled (cancel_on, "
                                 "singleton replace)", registry=registry)

    def counted(self, outcome: str, amount: int = 1) -> None:
        if amount > 0:
            self.events.labels(outcome).inc(amount)
