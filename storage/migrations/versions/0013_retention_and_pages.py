"""retention and pages that stay fast: list indexes by user and of roots, executions by tree

Revision ID: 0013
Revises: 0012

`tasks.list` by user, newest first, read the user's rows through (user_id) and sorted them: the
index becomes (user_id, created_at, id), which answers the page in order, by offset or by cursor,
and still serves every lookup by user. Root-only pages (one row per tree: the dashboard's tree
list) get two partial indexes, and the list of everything (created_at, id) instead of (created_at) holding roots only, newest first overall and per user; none of these
columns changes after the insert, so a status change writes none of them. Retention deletes a tree's
executions by tree id (ix_executions_task_tree_id). The parent index holds children only (a root's
NULL parent_id is never looked up there): without it a planner with no statistics (SQLite's, always)
took `parent_id IS NULL` as a search of the parent index and sorted every root for one page.
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ROOTS = "parent_id IS NULL"
CHILDREN = "parent_id IS NOT NULL"


def upgrade() -> None:
    op.drop_index("ix_tasks_created_at", "tasks")
    op.create_index("ix_tasks_created_at", "tasks", ["created_at", "id"])
    op.drop_index("ix_tasks_parent_id", "tasks")
    op.create_index("ix_tasks_parent_id", "tasks", ["parent_id"], sqlite_where=sa.text(CHILDREN),
                    postgresql_where=sa.text(CHILDREN))
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
    op.drop_index("ix_tasks_parent_id", "tasks")
    op.create_index("ix_tasks_parent_id", "tasks", ["parent_id"])
    op.drop_index("ix_tasks_created_at", "tasks")
    op.create_index("ix_tasks_created_at", "tasks", ["created_at"])
