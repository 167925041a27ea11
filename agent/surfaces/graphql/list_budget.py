"""The total number of list items one GraphQL request may return (SERVICE_GRAPHQL_MAX_LIST_ITEMS).

Why: depth, alias and token limits bound the document, not the answer: 100 aliased
`tasks(limit: 1000)` fit in a few kilobytes of query and ask for 100,000 tasks. Every list resolver
spends from one budget per request (kept on the GraphQL context), before it reads when it knows
how much it asks for, and after, by what it got.
"""

from __future__ import annotations

from typing import Any

from taskgrove.agent.foundations.errors import INVALID_PARAMS, RpcError
from taskgrove.agent.surfaces.graphql.graphql_errors import from_rpc


class ListBudget:
    """List items left for one request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def check(self, wanted: int) -> None:
        """Refuse before reading when `wanted` more items would pass the limit."""
        if self.used + wanted > self.limit:
            detail = (f"This request asks for more than {self.limit} list items in total (the limit is "
                      "SERVICE_GRAPHQL_MAX_LIST_ITEMS); ask for fewer (a smaller limit, fewer aliases) "
                      "or split the request")
            raise from_rpc(RpcError(INVALID_PARAMS, detail, detail))

    def spend(self, count: int) -> None:
        self.check(count)
        self.used += count


def budget_of(info: Any) -> ListBudget:
    """The request's budget (created on first use, so any context object works)."""
    context = info.context
    budget = getattr(context, "list_budget", None)
    if budget is None:
        settings = context.services.settings
        budget = ListBudget(settings.graphql_max_list_items)
        context.list_budget = budget
    return budget
