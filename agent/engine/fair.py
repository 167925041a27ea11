"""The order in which one instance takes runnable tasks when its slots are scarce: fair share.

A shared service must not let one user's backlog hold everyone else's work back. So the next
free slot goes:

1. **across users** to the user with the fewest tasks running on this instance, divided by the
   user's weight (`SERVICE_USER_WEIGHTS`, default 1); ties go to the user served longest ago.
   A user with nothing running therefore gets the next slot that frees up, whatever the size of
   another user's backlog: a quiet user waits for at most about one task duration.
2. **within a user, across the user's trees**, round-robin: the tree whose head task has the most
   urgent priority first, and among equally urgent trees the one served fewest times in the
   current round (a tree that joins later starts at the round the user is in, it does not
   catch up on the turns it missed).
3. **within a tree**, by priority (0 urgent first), then creation order.

Priority therefore orders work *within* a user, never across users: a user who marks everything
priority 0 only reorders their own work. Everything is in memory and per instance; the database
still decides every claim (storage/executions.py). Each pick costs O(users + log n).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# One runnable task as the engine schedules it: (priority, created_at, task id, tree id).
Item = tuple[int, str, str, str]


@dataclass(slots=True)
class _Tree:
    tasks: list[Item] = field(default_factory=list)  # heap by (priority, created_at, id)
    served: int = 0  # turns this tree had in the user's round-robin


@dataclass(slots=True)
class _User:
    trees: dict[str, _Tree] = field(default_factory=dict)
    # Heap of (head priority, served, arrival, tree id); an entry is valid only while it matches
    # the tree's current head priority and turn count (stale entries are skipped when popped).
    order: list[tuple[int, int, int, str]] = field(default_factory=list)
    clock: int = 0  # the round the user's round-robin is in
    size: int = 0
    last_served: int = 0


class FairQueue:
    """Runnable tasks of many users, taken in fair order (module docstring)."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        self._users: dict[Any, _User] = {}
        self._arrivals = itertools.count()
        self._picks = itertools.count(1)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def users(self) -> int:
        """How many users have runnable tasks queued (one: the order across users is moot)."""
        return len(self._users)

    def __bool__(self) -> bool:
        return bool(self._users)

    def __iter__(self) -> Iterator[Item]:
        for user in self._users.values():
            for tree in user.trees.values():
                yield from tree.tasks

    def push(self, item: Item, user_id: Any) -> None:
        user = self._users.get(user_id)
        if user is None:
            user = self._users[user_id] = _User()
        tree = user.trees.get(item[3])
        if tree is None or not tree.tasks:
            tree = tree or _Tree()
            tree.served = max(tree.served, user.clock)  # joins the current round
            user.trees[item[3]] = tree
            heapq.heappush(tree.tasks, item)
            self._enter(user, item[3], tree)
        else:
            head = tree.tasks[0]
            heapq.heappush(tree.tasks, item)
            if item < head:  # a more urgent head: the tree's place in the order changes
                self._enter(user, item[3], tree)
        user.size += 1
        self._size += 1

    def pop(self, running: Mapping[Any, int]) -> tuple[Item, Any] | None:
        """The next task in fair order and its user; `running` counts each user's running tasks
        (the caller adds the tasks it takes in the same pass)."""
        if not self._users:
            return None
        user_id = self._next_user(running)
        user = self._users[user_id]
        item = self._pop_from(user)
        user.last_served = next(self._picks)
        user.size -= 1
        self._size -= 1
        if user.size == 0:
            del self._users[user_id]
        return item, user_id

    def _next_user(self, running: Mapping[Any, int]) -> Any:
        """The user to serve next (there is at least one); None is a user too (no user_id)."""
        if len(self._users) == 1:
            return next(iter(self._users))
        best, best_key = None, None
        for user_id, user in self._users.items():
            key = (running.get(user_id, 0) / self.weights.get(user_id, 1.0), user.last_served)
            if best_key is None or key < best_key:
                best, best_key = user_id, key
        return best

    def _enter(self, user: _User, tree_id: str, tree: _Tree) -> None:
        heapq.heappush(user.order, (tree.tasks[0][0], tree.served, next(self._arrivals), tree_id))

    def _pop_from(self, user: _User) -> Item:
        while True:
            priority, served, _, tree_id = heapq.heappop(user.order)
            tree = user.trees.get(tree_id)
            if tree is None or not tree.tasks or tree.tasks[0][0] != priority or tree.served != served:
                continue  # stale: the tree changed since this entry was made
            item = heapq.heappop(tree.tasks)
            user.clock = max(user.clock, tree.served)
            tree.served += 1
            if tree.tasks:
                self._enter(user, tree_id, tree)
            else:
                del user.trees[tree_id]
            return item
