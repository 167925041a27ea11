"""The total number of list items one GraphQL request may return (SERVICE_GRAPHQL_MAX_LIST_ITEMS).

Why: depth, alias and token limits bound the document, not the answer: 100 aliased
`tasks(limit: 1000)` fit in a few kilobytes of query and ask for 100,000 tasks. Every list resolver
spends from one budget per request (kept on the GraphQL context), before it reads when it knows
how much it asks for, and after, by what it got.

The budget also gives the request's lists their turns (`ListBudget.turn`): one list resolver of a
request reads and builds its items at a time, each starting in an event-loop iteration of its own.
Why: the aliases of a query are resolved concurrently, and a read of the SQLite reader runs on the
event loop without suspending, so the 30 aliases of `tasks(limit: 1000)` (30,000 rows read,
decoded and completed) ran back to back in one loop iteration, and every other request of every
client (a `system.health`) waited for all of them. Taking turns, the loop serves others between
two lists: a request holds it for one list at most (at most a page, `limit` <= 1000).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from taskgrove.agent.foundations.errors import INVALID_PARAMS, RpcError
from taskgrove.agent.surfaces.graphql.graphql_errors import from_rpc


class ListBudget:
    """List items left for one request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._turn = asyncio.Lock()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Read and build one list while no other list of this request does (see the module's
        docstring). The loop is yielded to on entry, so that a list begins in an iteration of its
        own even when nothing else holds the turn, and on exit, so that the reading and building
        and what follows the resolver (GraphQL completes the list's objects, about as much work
        again) are two iterations, not one."""
        async with self._turn:
            await asyncio.sleep(0)
            yield
            await asyncio.sleep(0)

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
