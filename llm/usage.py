"""What LLM calls cost: tokens and US dollars, per call and summed (issue 31).

Why here: every LLM feature (the executors, tasks.generate, the plain-language planner) goes
through `llm.client.LLMClient`, which records one `CallUsage` per call; the engine stores the sum
on the task (`usage`), the service sums it per user and day, and /metrics by provider and model.

Prices come from litellm's own table (`litellm.cost_per_token` over `litellm.model_cost`, the
bundled copy: the service never fetches prices from the internet). A model without a price still
counts its tokens; its cost is unknown, and a sum that includes such a call says so with
`cost_usd: null` (a partial sum would look like a complete one). Such a sum also keeps what its
priced calls cost (`priced_cost`, stored under storage/usage_store.py's PRICED_COST and never shown):
a dollar budget is held to that, so one unpriced call never switches the budget off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgrove.storage.usage_store import PRICED_COST


@dataclass(frozen=True)
class CallUsage:
    """One LLM call: who served it, its tokens, and its price (None when the model has none)."""

    provider: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_usage(self) -> dict[str, Any]:
        """The call as a usage sum of one call."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "cost_usd": self.cost_usd, "calls": 1}


def empty() -> dict[str, Any]:
    """A usage sum of no calls (its cost is known: zero)."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost_usd": 0.0, "calls": 0}


def priced_cost(usage: Mapping[str, Any]) -> float:
    """The dollars of the sum's priced calls: its cost when known, else its PRICED_COST (0 for a
    sum stored before that key was kept: its priced part was lost to the unknown one)."""
    cost = usage.get("cost_usd")
    return float(cost if cost is not None else usage.get(PRICED_COST) or 0.0)


def add(total: Mapping[str, Any] | None, more: Mapping[str, Any] | None) -> dict[str, Any]:
    """A new sum of two usage sums; the cost is unknown (None) when either part's is, and then
    PRICED_COST keeps what the priced calls of both cost (a known cost needs no second number)."""
    out = dict(total) if total else empty()
    if not more:
        return out
    for key in ("prompt_tokens", "completion_tokens", "total_tokens", "calls"):
        out[key] = int(out.get(key) or 0) + int(more.get(key) or 0)
    known = out.get("cost_usd") is not None and (more.get("cost_usd") is not None or not more.get("calls"))
    priced = round(priced_cost(out) + priced_cost(more), 10)
    out.pop(PRICED_COST, None)
    if known:
        out["cost_usd"] = priced
    else:
        out["cost_usd"], out[PRICED_COST] = None, priced
    return out


def total_of(usages: Any) -> dict[str, Any] | None:
    """The sum of the usages given (None ones skipped); None when none was given."""
    found = [u for u in usages if u]
    if not found:
        return None
    total = empty()
    for usage in found:
        total = add(total, usage)
    return total


def price(litellm: Any, routed_model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """The call's cost in USD from litellm's price table, or None for a model it has no price for."""
    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=routed_model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    except Exception:  # litellm raises a plain Exception for an unmapped model
        return None
    return round(float(prompt_cost) + float(completion_cost), 10)


def reported(answer: Any) -> dict[str, int] | None:
    """The token counts a provider's answer (or a streamed chunk) reports, None when it reports
    none (the client then estimates them)."""
    usage = getattr(answer, "usage", None)
    if usage is None:
        return None
    get = usage.get if isinstance(usage, Mapping) else (lambda k: getattr(usage, k, None))
    prompt, completion, total = (int(get(k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if not (prompt or completion or total):
        return None
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total or prompt + completion}
