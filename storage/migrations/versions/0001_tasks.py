"""tasks and llm_keys

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(1024), nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column(
            "parent_id",
            sa.String(64),
            sa.ForeignKey("tasks.id", deferrable=True, initially="DEFERRED"),
            nullable=True,
        ),
        sa.Column("task_tree_id", sa.String(64), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("dependencies", sa.JSON, nullable=False),
        sa.Column("inputs", sa.JSON, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("schemas", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
        sa.Column("started_at", sa.String(40), nullable=True),
        sa.Column("completed_at", sa.String(40), nullable=True),
        sa.Column("product_id", sa.String(255), nullable=True),
        sa.Column("token_success", sa.Integer, nullable=False),
        sa.Column("token_failed", sa.Integer, nullable=False),
        sa.Column("original_task_id", sa.String(64), nullable=True),
        sa.Column("has_copy", sa.Boolean, nullable=False),
        sa.Column("has_references", sa.Boolean, nullable=False),
        sa.Column("origin_type", sa.String(16), nullable=False),
        sa.Column("extra", sa.JSON, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", sa.String(40), nullable=True),
    )
    for column in ("parent_id", "user_id", "status", "created_at", "task_tree_id"):
        op.create_index(f"ix_tasks_{column}", "tasks", [column])
    op.create_table(
        "llm_keys",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("provider", sa.String(64), primary_key=True),
        sa.Column("ciphertext", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llm_keys")
    op.drop_table("tasks")
