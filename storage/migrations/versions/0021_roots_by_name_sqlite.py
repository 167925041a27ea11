"""SQLite: the roots' indexes hold the name, so a search of the tree list reads no table row it does not show

Revision ID: 0021
Revises: 0020

The dashboard's search (tasks.list `root_only` and `search`) examines a window of roots newest
first (storage/repository.py, SEARCH_WINDOW) and keeps those whose name holds the words. With
(created_at, id) alone, SQLite looked up every root's row to read its name: one random table page
per tree, 2.4-15 ms for a window of 2,000 roots at a million tasks. With `name` in the index it
tests the name on the index entry and looks up only the rows it answers (0.4 ms; bench/README.md,
issue 48). The columns before it are unchanged, so every page, cursor and the retention walk
read them as before; a new tree writes the same two entries, each longer by its root's name.

SQLite only: PostgreSQL's index scans test such a condition on the table row whatever the index
holds, and its B-tree entries are limited to about 2,700 bytes, which a long name in several
bytes a character could pass.
"""
import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

ROOTS = sa.text("parent_id IS NULL")


def _roots(with_name: bool) -> None:
    name = ["name"] if with_name else []
    op.drop_index("ix_tasks_roots_created", "tasks")
    op.drop_index("ix_tasks_roots_user", "tasks")
    op.create_index("ix_tasks_roots_created", "tasks", ["created_at", "id", *name], sqlite_where=ROOTS)
    op.create_index("ix_tasks_roots_user", "tasks", ["user_id", "created_at", "id", *name], sqlite_where=ROOTS)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _roots(with_name=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _roots(with_name=False)
