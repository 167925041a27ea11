"""Ids of new rows: tasks a client gave no id, copies and clones (executions and events make
their own with uuid4().hex, a shorter text of the same kind)."""

from __future__ import annotations

import uuid


def new_id() -> str:
    return str(uuid.uuid4())
