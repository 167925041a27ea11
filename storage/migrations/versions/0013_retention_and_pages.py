"""retention and pages that stay fast: list indexes by user and of roots, executions by tree

Revision ID: 0013
Revises: 0008

`tasks.list` by user, newest first, read the user's rows through (user_id) and sorted them: the
index becomes (user_id, created_at, id), which answers the page in order, by offset or by cursor,
and still serves every lookup by user. Root-only pages (one row per tree: the dashboard's tree
list) get two partial indexes holding roots only, newest first overall and per user; none of these
columns changes after the insert, so a status change writes none of them. Retention deletes a tree's
executions by tree id (ix_executions_task_tree_id).
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0008"
branch_labels = None
depends_on = None

ROOTS = "parent_id IS NULL"


def upgrade() -> None:
    op.drop_index("ix_tasks_user_id", "tasks")
    op.create_index("ix_tasks_user_created", "tasks", ["user_id", "created_at", "id"])
    op.create_index("ix_tasks_roots_created", "tasks", ["created_at", "id"], sqlite_where=sa.text(ROOTS),
                    postgresql_where=sa.text(ROOTS))
    op.create_index("ix_tasks_roots_user", "tasks", ["user_id", "created_at", "id"], sqlite_where=sa.text(ROOTS),
                    postgresql_where=sa.text(ROOTS))
    op.create_index("ix_executions_task_tree_id", "executions", ["task_tree_id"])


def downgrade() -> None:
    op.drop_index("ix_executions_task_tree_id", "executions")
    op.drop_index("ix_tasks_roots_user", "tasks")
    op.drop_index("ix_tasks_roots_created", "tasks")
    op.drop_index("ix_tasks_user_created", "tasks")
    op.create_index("ix_tasks_user_id", "tasks", ["user_id"])
