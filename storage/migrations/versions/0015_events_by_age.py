"""retention sweeps stored events: events by age

Revision ID: 0015
Revises: 0013 (on branch scale2; the lead sets "0014" if another branch's 0014 lands first)

Retention deletes stored events (`events.emit`) older than the cutoff that no parked wait can
still count (storage/retention.py `delete_events`). It walks the oldest events in (created_at, id)
order, a batch at a time; the only index on events was (user_id, name, created_at), which gives no
such order, so every batch would have read the whole table.
"""
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_created", "events", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_created", "events")
