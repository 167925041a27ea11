"""The `agents` table: the directory of A2A agents this deployment may delegate to (docs/agents.md).

Its own module, beside storage/models.py, on the same metadata: the directory is a concern of its
own (storage/agents.py holds its statements) and the table shares nothing with tasks.

One row per agent, read by every instance: what its card says (name, description, version,
skills, interfaces), where the card was fetched and how to ask for it again cheaply (`etag`,
`last_modified`), a change of URL or interfaces seen on a refresh (`changed`, never followed by
itself), the credential headers encrypted (`credentials`, storage/agent_secrets.py), and the
health of real calls with the breaker's state. `refresh_due_at` is the compare-and-set that lets
one instance refresh a card at a time.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import JSON, Boolean, Index, Integer, LargeBinary, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from taskgrove.storage.models import Base


class DirectoryAgent(Base):
    """One agent of the directory (storage/agents.py)."""

    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The directory name delegation uses (`inputs.agent`); unique across the deployment.
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)  # who added it
    shared: Mapped[bool] = mapped_column(Boolean, default=False)  # every user sees it (admins add these)
    card_url: Mapped[str] = mapped_column(String(2048))
    tags: Mapped[list] = mapped_column(JSON, default=list)
    card_name: Mapped[str | None] = mapped_column(String(1024), nullable=True)  # the card's own name
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    version: Mapped[str | None] = mapped_column(String(255), nullable=True)
    protocol_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    skills: Mapped[list] = mapped_column(JSON, default=list)
    interfaces: Mapped[list] = mapped_column(JSON, default=list)
    etag: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    last_modified: Mapped[str | None] = mapped_column(String(255), nullable=True)
    fetched_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    refresh_due_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    refresh_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    changed: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    credentials: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)  # overrides SERVICE_AGENT_CONCURRENCY
    health: Mapped[dict] = mapped_column(JSON, default=dict)
    breaker: Mapped[str] = mapped_column(String(16), default="closed")  # closed | open | probing
    breaker_until: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))

    __table_args__ = (
        Index("ux_agents_name", "name", unique=True),
        Index("ix_agents_user_id", "user_id"),
        Index("ix_agents_refresh_due", "refresh_due_at"),
    )


agents_table = cast(Table, DirectoryAgent.__table__)  # a Table, as storage/models.py says why
