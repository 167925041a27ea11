"""costs and budgets: a task's LLM usage and budget, usage per user and day, users' daily budgets

Revision ID: 0012
Revises: 0011

`tasks.usage` is what a task's LLM calls used over its attempts and `tasks.budget` the limit of
its subtree (JSON, SQL NULL for a task without LLM work, so such a task stores nothing more).
`llm_usage_daily` sums every call per user and UTC day; `user_budgets` holds the daily budgets an
admin set per user (config.budget.set). docs/costs.md.
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("usage", sa.JSON(), nullable=True))
    op.add_column("tasks", sa.Column("budget", sa.JSON(), nullable=True))
    op.create_table(
        "llm_usage_daily",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("unpriced_calls", sa.Integer(), nullable=False),
    )
    op.create_table(
        "user_budgets",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("max_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_cost_usd", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("user_budgets")
    op.drop_table("llm_usage_daily")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("budget")
        batch.drop_column("usage")
