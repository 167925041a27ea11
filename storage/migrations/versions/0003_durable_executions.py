"""durable executions: retry state, timeouts, checkpoints, fencing tokens, executions table

Revision ID: 0003
Revises: 0002

Tasks gain their retry policy and attempt bookkeeping, a per-task timeout, the latest checkpoint,
a lease epoch (with lease_owner, the fencing token every engine write compares against) and the
id of the execution that wants them run. `executions` records each execution request (which tree,
which target, its webhooks, which instance drives it and until when its lease runs), so that a
restarted or surviving instance can continue it. `idempotency_keys` keeps the first answer to a
request sent with an Idempotency-Key header.
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("retry", sa.JSON, nullable=True))
        batch.add_column(sa.Column("timeout_seconds", sa.Float, nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("next_attempt_at", sa.String(40), nullable=True))
        batch.add_column(sa.Column("checkpoint", sa.JSON, nullable=True))
        batch.add_column(sa.Column("lease_epoch", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("execution_id", sa.String(64), nullable=True))
    op.create_index("ix_tasks_execution_id", "tasks", ["execution_id"])
    op.create_table(
        "executions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task_tree_id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("final_status", sa.String(16), nullable=True),
        sa.Column("webhooks", sa.JSON, nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", sa.String(40), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
        sa.Column("ended_at", sa.String(40), nullable=True),
    )
    op.create_index("ix_executions_status_lease", "executions", ["status", "lease_expires_at"])
    # At most one running execution per tree: a second request joins it instead.
    op.create_index("ux_executions_running_tree", "executions", ["task_tree_id"], unique=True,
                    sqlite_where=sa.text("status = 'running'"), postgresql_where=sa.text("status = 'running'"))


    op.create_table(
        "idempotency_keys",
        sa.Column("owner", sa.String(255), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("answer", sa.JSON, nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_table("executions")
    op.drop_index("ix_tasks_execution_id", "tasks")
    with op.batch_alter_table("tasks") as batch:
        for column in ("execution_id", "lease_epoch", "checkpoint", "next_attempt_at", "attempt",
                       "timeout_seconds", "retry"):
            batch.drop_column(column)
