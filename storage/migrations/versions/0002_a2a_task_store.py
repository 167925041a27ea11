"""a2a-sdk task store and push-config store tables

Revision ID: 0002
Revises: 0001

Column names and types follow a2a.server.models (TaskMixin, PushNotificationConfigMixin) of
a2a-sdk 1.3, so the SDK's DatabaseTaskStore and DatabasePushNotificationConfigStore work on them
unchanged (agent/surfaces/a2a/store.py). Ids are 64 wide instead of the SDK's 36: an agent task's
context id is our root task id, and ours may be up to 64 characters.
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "a2a_tasks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("context_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("last_updated", sa.DateTime, nullable=True),
        sa.Column("status", sa.JSON, nullable=False),
        sa.Column("artifacts", sa.JSON, nullable=True),
        sa.Column("history", sa.JSON, nullable=True),
        sa.Column("protocol_version", sa.String(16), nullable=True),
        sa.Column("metadata", sa.JSON, nullable=True),
    )
    op.create_index("ix_a2a_tasks_id", "a2a_tasks", ["id"])
    op.create_index("ix_a2a_tasks_context_id", "a2a_tasks", ["context_id"])
    op.create_index("idx_a2a_tasks_owner_last_updated", "a2a_tasks", ["owner", "last_updated"])
    op.create_table(
        "a2a_push_configs",
        sa.Column("task_id", sa.String(64), primary_key=True),
        sa.Column("config_id", sa.String(255), primary_key=True),
        sa.Column("config_data", sa.LargeBinary, nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("protocol_version", sa.String(16), nullable=True),
    )
    op.create_index("ix_a2a_push_configs_owner", "a2a_push_configs", ["owner"])


def downgrade() -> None:
    op.drop_table("a2a_push_configs")
    op.drop_table("a2a_tasks")
