"""tasks.list by status, and by user and status: a range of an index, in page order

Revision ID: 0017
Revises: 0016

SPEC.md's tasks.list takes a `status`. By status alone, a page read the whole status through
ix_tasks_status_user (status, user_id) and sorted it (SQLite: a temporary B-tree): every completed
task of the table for a page of 100 completed ones. By user and status it read
ix_tasks_user_created and filtered by status: for a status the user has few tasks in, the user's
whole history. (status, created_at, id) and (user_id, status, created_at, id) give both pages in
order, by offset or by cursor, whatever the table holds.

They replace ix_tasks_status_user: a count by status (/metrics) is a prefix of the first, a user's
unfinished tasks (the quota, on SQLite) two ranges of the second. A new task and a status change
now write two indexes that hold `status` instead of one (bench/README.md, eleventh round, gives
what that costs).
"""
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tasks_status_created", "tasks", ["status", "created_at", "id"])
    op.create_index("ix_tasks_user_status_created", "tasks", ["user_id", "status", "created_at", "id"])
    op.drop_index("ix_tasks_status_user", "tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_status_user", "tasks", ["status", "user_id"])
    op.drop_index("ix_tasks_user_status_created", "tasks")
    op.drop_index("ix_tasks_status_created", "tasks")
