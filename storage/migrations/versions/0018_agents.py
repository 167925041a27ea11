"""agents: the directory of A2A agents (docs/agents.md)

Revision ID: 0018
Revises: 0017

One row per agent a tree may delegate to by name or skill: its card as last fetched (skills,
interfaces, version), the conditional-request validators of that fetch, a change seen and not
followed, encrypted credential headers, the health of real calls and the breaker. The columns are
storage/agent_models.py's.
"""
import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("shared", sa.Boolean, nullable=False),
        sa.Column("card_url", sa.String(2048), nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("card_name", sa.String(1024), nullable=True),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("version", sa.String(255), nullable=True),
        sa.Column("protocol_version", sa.String(32), nullable=True),
        sa.Column("skills", sa.JSON, nullable=False),
        sa.Column("interfaces", sa.JSON, nullable=False),
        sa.Column("etag", sa.String(1024), nullable=True),
        sa.Column("last_modified", sa.String(255), nullable=True),
        sa.Column("fetched_at", sa.String(40), nullable=True),
        sa.Column("refresh_due_at", sa.String(40), nullable=True),
        sa.Column("refresh_error", sa.Text, nullable=True),
        sa.Column("changed", sa.JSON, nullable=True),
        sa.Column("credentials", sa.LargeBinary, nullable=True),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("health", sa.JSON, nullable=False),
        sa.Column("breaker", sa.String(16), nullable=False),
        sa.Column("breaker_until", sa.String(40), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )
    op.create_index("ux_agents_name", "agents", ["name"], unique=True)
    op.create_index("ix_agents_user_id", "agents", ["user_id"])
    op.create_index("ix_agents_refresh_due", "agents", ["refresh_due_at"])


def downgrade() -> None:
    op.drop_table("agents")
