"""Property tests for every new input of the directory of agents (issue 45 part A), and the bound of
the planner's prompt with 500 registered agents.

- agents.add, agents.get/refresh/remove and agents.list params: any JSON value gives the typed
  request or a -32602 naming a field, never another exception; a header value never appears in
  an error message;
- a2a_agent_executor's `agent` / `skill` in a generated plan: any value gives a list of problems
  (the repair round's), never an exception;
- the health arithmetic: counts add up, p50 <= p95, the kept lists stay bounded;
- a directory of 500 agents: the planner is told of at most 20, and the size of that part of the
  prompt is printed and bounded (docs/agents.md states it).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from taskgrove.agent.foundations.errors import INVALID_PARAMS, RpcError
from taskgrove.agent.foundations.requests_agents import AddAgent, AgentRef, ListAgents
from taskgrove.agent.services.agent_lookup import PLAN_AT_MOST, DirectoryLookup
from taskgrove.llm.agent_prompt import agents_section, delegation_problems
from taskgrove.storage.agents import LATENCIES_KEPT, RECENT_KEPT, empty_health, next_health

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
KEYS = st.sampled_from(["card_url", "url", "name", "tags", "headers", "credential", "shared", "concurrency",
                        "agent_id", "agent", "accept", "skill", "tag", "health", "limit", "cursor"])
PARAMS = st.dictionaries(KEYS, JSON | st.sampled_from(["http://127.0.0.1:1/", "helper", "healthy", "x" * 70]),
                         max_size=6) | JSON


@settings(max_examples=300, deadline=None)
@given(PARAMS)
def test_every_params_value_is_read_or_refused_with_minus_32602(params: Any) -> None:
    for read in (AddAgent.from_params, AgentRef.from_params, ListAgents.from_params):
        try:
            read(params)
        except RpcError as exc:
            assert exc.code == INVALID_PARAMS


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.sampled_from(["headers", "credential"]))
def test_a_header_value_never_appears_in_an_error(secret: str, field: str) -> None:
    value = {"X-Key": secret + "\x01"} if field == "headers" else 12
    try:
        AddAgent.from_params({"card_url": "http://127.0.0.1:1/", field: value})
    except RpcError as exc:
        assert (secret + "\x01") not in exc.message


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["id", "name", "inputs"]), JSON, max_size=3), max_size=5),
       st.lists(st.fixed_dictionaries({"name": st.text(min_size=1, max_size=10),
                                       "skills": st.lists(st.fixed_dictionaries(
                                           {"id": st.text(max_size=8), "tags": st.lists(st.text(max_size=8), max_size=3)}),
                                           max_size=3)}), max_size=4))
def test_a_plans_delegations_give_problems_never_an_exception(tasks: list[Any], agents: list[Any]) -> None:
    plan = [dict(t, name="a2a_agent_executor") if i % 2 else t for i, t in enumerate(tasks)]
    for task in plan:  # inputs as a plan holds them: an object
        if not isinstance(task.get("inputs"), dict):
            task["inputs"] = {"agent": task.get("inputs")}
    problems = delegation_problems(plan, agents)
    assert all(isinstance(p, str) for p in problems)
    agents_section(agents)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(min_value=0, max_value=1e6), st.text(max_size=600)),
                max_size=150))
def test_health_counts_add_up(calls: list[tuple[bool, float, str]]) -> None:
    health = empty_health()
    run = 0
    for ok, ms, error in calls:
        health = next_health(health, ok, ms, error, "2026-11-29T00:00:00.000000+00:00")
        run = 0 if ok else run + 1
    assert health["calls"] == len(calls) == health["successes"] + health["failures"]
    assert health["consecutive_failures"] == run
    assert len(health["latencies_ms"]) <= LATENCIES_KEPT and len(health["recent"]) <= RECENT_KEPT
    if calls:
        assert health["p50_ms"] <= health["p95_ms"]
        assert len(health["last_error"] or "") <= 500


# --- 500 agents: the planner's prompt stays bounded -------------------------------------------------

class _Store:
    """The one read for_plan makes, over rows in memory."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    async def visible(self, user_id: Any, everyone: bool = False, at_most: int = 5000) -> list[dict[str, Any]]:
        return self.rows


def _agent(n: int) -> dict[str, Any]:
    topic = ["invoices", "refunds", "weather", "translation", "summaries", "images", "search", "calendars",
             "shipping", "payroll"][n % 10]
    return {"name": f"agent-{n:03d}", "description": f"Handles {topic} for region {n}", "tags": [topic],
            "health": empty_health(), "breaker": "closed",
            "skills": [{"id": f"{topic}-{n}", "name": f"{topic} skill", "description": f"Does {topic} work well",
                        "tags": [topic, "region"], "examples": [f"Handle the {topic} of customer {n}",
                                                                f"Check {topic} for order {n}"]}]}


def test_the_planner_hears_of_at_most_20_of_500_agents_and_the_best_matching_ones() -> None:
    lookup = DirectoryLookup(_Store([_agent(n) for n in range(500)]), None, None, None)  # type: ignore[arg-type]
    chosen = asyncio.run(lookup.for_plan(None, "Process the refunds of last week and email a summary"))
    assert len(chosen) == PLAN_AT_MOST
    assert all("refunds" in a["description"] or "summaries" in a["description"] for a in chosen)
    section = agents_section(chosen)
    everything = agents_section([_agent(n) for n in range(500)])
    print(f"\nplanner prompt, agents part: {len(section)} characters for 20 of 500 agents "
          f"(all 500 would be {len(everything)})")
    assert len(section) < 8_000 < len(everything)
    assert json.dumps(chosen)  # what the planner gets is plain JSON
