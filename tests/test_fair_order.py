"""The fair order of engine/fair.py: across users by running tasks and weight, round-robin across a
user's trees, priority only within a user."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from taskgrove.agent.engine.fair import FairQueue


def take(queue: FairQueue, n: int, running: Counter[Any] | None = None) -> list[tuple[str, Any]]:
    """Take n tasks as the engine does in one pass: each taken task counts as running."""
    running = running if running is not None else Counter()
    out = []
    for _ in range(n):
        found = queue.pop(running)
        if found is None:
            break
        item, user = found
        running[user] += 1
        out.append((item[2], user))
    return out


def test_a_quiet_user_gets_the_next_slot_whatever_the_floods_backlog() -> None:
    queue = FairQueue()
    for i in range(2000):
        queue.push((0, f"{i:05}", f"flood-{i}", f"tree-{i % 20}"), "flood")
    queue.push((3, "99999", "quiet-1", "quiet-tree"), "quiet")  # low priority, created last
    # 16 slots, all busy with the flood's work; one frees up:
    assert take(queue, 1, Counter({"flood": 15})) == [("quiet-1", "quiet")]


def test_priority_orders_work_within_a_user_never_across_users() -> None:
    queue = FairQueue()
    for i in range(10):
        queue.push((0, f"{i:02}", f"urgent-{i}", "a"), "alice")
    for i in range(10):
        queue.push((3, f"{i:02}", f"low-{i}", "b"), "bob")
    taken = take(queue, 6)
    assert Counter(user for _, user in taken) == Counter({"alice": 3, "bob": 3})
    alice = [tid for tid, user in taken if user == "alice"]
    assert alice == ["urgent-0", "urgent-1", "urgent-2"]
    queue.push((0, "00", "bob-urgent", "b2"), "bob")
    assert take(queue, 2, Counter({"alice": 3, "bob": 3}))[:2] == [("urgent-3", "alice"), ("bob-urgent", "bob")]


def test_weights_give_proportional_shares() -> None:
    queue = FairQueue({"alice": 2.0})
    for i in range(100):
        queue.push((1, f"{i:03}", f"a{i}", "ta"), "alice")
        queue.push((1, f"{i:03}", f"b{i}", "tb"), "bob")
    assert Counter(user for _, user in take(queue, 30)) == Counter({"alice": 20, "bob": 10})


def test_a_users_trees_are_served_round_robin_and_a_late_tree_joins_the_round() -> None:
    queue = FairQueue()
    for tree in ("t1", "t2", "t3"):
        for i in range(10):
            queue.push((1, f"{tree}{i:02}", f"{tree}-{i}", tree), "u")
    first = [tid.split("-")[0] for tid, _ in take(queue, 9)]
    assert Counter(first) == Counter({"t1": 3, "t2": 3, "t3": 3})
    for i in range(10):
        queue.push((1, f"t4{i:02}", f"t4-{i}", "t4"), "u")
    # The late tree gets its turn in each round from now on, not ten turns in a row.
    later = [tid.split("-")[0] for tid, _ in take(queue, 8)]
    assert Counter(later) == Counter({"t1": 2, "t2": 2, "t3": 2, "t4": 2})


def test_one_tree_alone_keeps_priority_then_creation_order() -> None:
    queue = FairQueue()
    items = [(p, f"{i:04}", f"x{i}", "tree") for i, p in enumerate([2, 0, 1, 0, 3, 1] * 50)]
    for item in items:
        queue.push(item, None)
    assert [tid for tid, _ in take(queue, len(items))] == [item[2] for item in sorted(items)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c", None]), st.sampled_from("xyz")),
                max_size=60))
def test_every_task_pushed_is_taken_once(spec: list[tuple[int, Any, str]]) -> None:
    queue = FairQueue({"a": 3.0})
    for i, (priority, user, tree) in enumerate(spec):
        queue.push((priority, f"{i:03}", f"t{i}", f"{user}-{tree}"), user)
    assert len(queue) == len(spec)
    taken = take(queue, len(spec) + 5)
    assert sorted(tid for tid, _ in taken) == sorted(f"t{i}" for i in range(len(spec)))
    assert len(queue) == 0 and not queue
