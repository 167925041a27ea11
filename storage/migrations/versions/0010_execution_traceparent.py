"""execution traceparent: the W3C trace context an execution's spans belong to

Revision ID: 0010
Revises: 0009

`executions.traceparent` holds the caller's `traceparent` header (or, for an execution started
without one while traces are on, a fresh trace id with a zero parent id): every instance that
drives the execution, the one that started it or one that took it over, parents its spans on it,
so a resumed or taken-over execution continues the same trace (agent/foundations/tracing.py). SQL NULL when
the caller sent none and traces were off.
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("executions", sa.Column("traceparent", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("traceparent")
