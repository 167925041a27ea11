"""tasks.list `waiting`: the parked tasks in page order, overall and by user

Revision ID: 0020
Revises: 0019

`tasks.list` with `waiting: true` read ix_tasks_created_at (or, by user, ix_tasks_user_created)
and filtered by `waiting`: parked tasks are few, so a page of them read the whole table, or the
user's whole history (an empty page took 1.5 s at a million tasks on SQLite, 15.8 s from a cold
cache; issue 48). Both partial indexes below hold parked tasks only and give them newest first:
ix_tasks_waiting_created (created_at, id) overall, and ix_tasks_waiting_user, now (user_id,
created_at, id) instead of (user_id), by user; a lookup by user alone (events.emit's waits of
a user) reads its prefix as before.

What they cost: a task enters both when it parks and leaves both when it wakes; a task that
never waits is in neither (its insert evaluates the condition, nothing more), and no column of
either changes while a task runs, so no status change writes them.
"""
import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

PARKED = sa.text("waiting IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_tasks_waiting_user", "tasks")
    op.create_index("ix_tasks_waiting_user", "tasks", ["user_id", "created_at", "id"], sqlite_where=PARKED,
                    postgresql_where=PARKED)
    op.create_index("ix_tasks_waiting_created", "tasks", ["created_at", "id"], sqlite_where=PARKED,
                    postgresql_where=PARKED)


def downgrade() -> None:
    op.drop_index("ix_tasks_waiting_created", "tasks")
    op.drop_index("ix_tasks_waiting_user", "tasks")
    op.create_index("ix_tasks_waiting_user", "tasks", ["user_id"], sqlite_where=PARKED, postgresql_where=PARKED)
