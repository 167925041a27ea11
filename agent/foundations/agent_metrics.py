"""/metrics of the directory of agents: calls, failures and latency per agent (docs/agents.md).

Registered on the service's own registry (agent/foundations/metrics.py `Metrics.registry`), so
/metrics renders them with the rest; a module of its own so the general metrics stay short. The
agent label set is bounded: past MAX_AGENTS names, calls are counted as `other`.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from taskgrove.agent.foundations.metrics import Metrics

MAX_AGENTS = 200


class AgentMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.calls = Counter("taskgrove_agent_calls", "Calls to directory agents, by agent and outcome (ok, failed)",
                             ["agent", "outcome"], registry=r)
        self.seconds = Histogram("taskgrove_agent_call_seconds", "How long calls to directory agents took, by agent",
                                 ["agent"], registry=r, buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))
        self._names: set[str] = set()

    def call(self, agent: str, ok: bool, seconds: float) -> None:
        if agent not in self._names:
            if len(self._names) >= MAX_AGENTS:
                agent = "other"
            else:
                self._names.add(agent)
        self.calls.labels(agent, "ok" if ok else "failed").inc()
        self.seconds.labels(agent).observe(max(0.0, seconds))
