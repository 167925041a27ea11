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
from typing import Any

# One runnable task as the engine schedules it: (priority, created_at, task id, tree id).
Item = tuple[int, str, str, str]


class _Tree:
    """One tree's runnable tasks of one user. Only trees with tasks are kept."""

    __slots__ = ("tasks", "served")

    def __init__(self, item: Item, served: int) -> None:
        self.tasks: list[Item] = [item]  # heap by (priority, created_at, id)
        self.served = served  # turns this tree had in the user's round-robin


class _User:
    """One user's queued trees. Only users with tasks are kept."""

    __slots__ = ("trees", "order", "clock", "size", "last_served")

    def __init__(self) -> None:
        self.trees: dict[str, _Tree] = {}
        # Heap of (head priority, served, arrival, tree id), kept only while the user has two trees
        # or more (with one there is nothing to order). An entry is valid only while it matches the
        # tree's current head priority and turn count (stale entries are skipped when popped).
        self.order: list[tuple[int, int, int, str]] = []
        self.clock = 0  # the round the user's round-robin is in
        self.size = 0
        self.last_served = 0


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
        user.size += 1
        self._size += 1
        trees, tree_id = user.trees, item[3]
        tree = trees.get(tree_id)
        if tree is not None:
            head = tree.tasks[0]
            heapq.heappush(tree.tasks, item)
            if item < head and len(trees) > 1:  # a more urgent head: the tree's place in the order changes
                self._enter(user, tree_id, tree)
            return
        tree = _Tree(item, user.clock)  # a tree (re)joins at the round its user is in
        if not trees:
            trees[tree_id] = tree
            return
        if len(trees) == 1:  # a second tree: from now on the order matters
            self._reorder(user)
        trees[tree_id] = tree
        self._enter(user, tree_id, tree)

    def pop(self, running: Mapping[Any, int]) -> tuple[Item, Any] | None:
        """The next task in fair order and its user; `running` counts each user's running tasks
        (the caller adds the tasks it takes in the same pass)."""
        users = self._users
        if not users:
            return None
        if len(users) == 1:
            user_id, user = next(iter(users.items()))
        else:
            user_id = self._next_user(running)
            user = users[user_id]
        if len(user.trees) == 1:
            item = self._take_head(user, *next(iter(user.trees.items())))
        else:
            item = self._pop_ordered(user)
        user.last_served = next(self._picks)
        user.size -= 1
        self._size -= 1
        if user.size == 0:
            del users[user_id]
        return item, user_id

    def _next_user(self, running: Mapping[Any, int]) -> Any:
        """The user to serve next, among two or more; None is a user too (no user_id)."""
        best, best_key = None, None
        for user_id, user in self._users.items():
            key = (running.get(user_id, 0) / self.weights.get(user_id, 1.0), user.last_served)
            if best_key is None or key < best_key:
                best, best_key = user_id, key
        return best

    def _enter(self, user: _User, tree_id: str, tree: _Tree) -> None:
        heapq.heappush(user.order, (tree.tasks[0][0], tree.served, next(self._arrivals), tree_id))

    def _reorder(self, user: _User) -> None:
        """The user's order heap anew, from its trees' heads. Kept only while the user has two
        trees or more: with one there is nothing to order (the common case: one tree at a time)."""
        user.order = []
        for tree_id, tree in user.trees.items():  # only trees with tasks are kept
            self._enter(user, tree_id, tree)

    def _pop_ordered(self, user: _User) -> Item:
        """The head of the user's next tree in its round-robin (the user has two trees or more)."""
        while True:
            priority, served, _, tree_id = heapq.heappop(user.order)
            tree = user.trees.get(tree_id)
            if tree is None or not tree.tasks or tree.tasks[0][0] != priority or tree.served != served:
                continue  # stale: the tree changed since this entry was made
            item = self._take_head(user, tree_id, tree)
            if tree.tasks and len(user.trees) > 1:
                self._enter(user, tree_id, tree)
            return item

    def _take_head(self, user: _User, tree_id: str, tree: _Tree) -> Item:
        """The tree's most urgent task; the tree has had one more turn."""
        item = heapq.heappop(tree.tasks)
        user.clock = max(user.clock, tree.served)
        tree.served += 1
        if not tree.tasks:
            del user.trees[tree_id]
            if len(user.trees) == 1:
                user.order = []  # one tree left: no order to keep (rebuilt if another joins)
        return item
