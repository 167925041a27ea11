"""PostgreSQL: a user's unfinished tasks in an index of their own

Revision ID: 0016
Revises: 0015

A create counts its owner's unfinished tasks first (SERVICE_MAX_PENDING_PER_USER, the `counted`
part of storage.statements.insert_tree). On SQLite that count is two ranges of
ix_tasks_status_user and stays bounded by the quota (0007). PostgreSQL's planner did not take
those ranges: on a table it has no statistics for (autovacuum off, or not yet run) it read the
user's whole history through ix_tasks_user_created and filtered it by status, and where it did
take ix_tasks_status_user, every status change had left a dead entry in the unfinished ranges for
the count to visit. Either way a create's count grew with every task the user ever ran: 5-task
trees from wrk fell from about 2,100 to 1,200 tasks/s within 12 seconds of a fresh database.

A partial index of the pending and in-progress tasks by user matches the count's condition, so
the planner takes it with or without statistics; it holds only unfinished tasks (dead entries are
cleared as its pages fill) and stayed at two pages under that load. SQLite does not get it:
there it would only be one more index written by every status change (0007 dropped the same
index for that reason). Plain CREATE INDEX: writes to `tasks` wait while it reads the table,
once, when the upgraded service first starts.
"""
import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UNFINISHED = "status IN ('pending', 'in_progress')"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_tasks_unfinished_user", "tasks", ["user_id"], postgresql_where=sa.text(UNFINISHED))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_tasks_unfinished_user", "tasks")
