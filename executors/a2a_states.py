"""The one mapping of A2A task states to their names: `working`, `input-required`, `canceled`, ...

The A2A 0.3 spelling SPEC.md uses, for a state given as the 1.0 protobuf enum (`TaskState`). Used
by the A2A executor (executors/a2a_remote.py: what a remote agent's task is doing) and by the A2A
surface (agent/surfaces/a2a/wire.py: push bodies, a follow-up's plan state). It lives here, in the
lowest layer that speaks A2A, because executors may not import the agent. A state the enum does
not know, and `TASK_STATE_UNSPECIFIED`, is `unknown`, as 0.3 names it.
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import TaskState

_NAMES: dict[int, str] = {
    value: name.removeprefix("TASK_STATE_").lower().replace("_", "-")
    for name, value in TaskState.items() if value != TaskState.TASK_STATE_UNSPECIFIED
}


def state_name(state: int) -> str:
    """`completed`, `working`, `input-required`, ...; `unknown` for a state without a name."""
    return _NAMES.get(state, "unknown")
