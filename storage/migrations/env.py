"""Alembic environment: always handed a live connection by storage.db.migrate."""

from alembic import context
from sqlalchemy import text

from taskgrove.storage.models import Base

connection = context.config.attributes["connection"]
if connection.dialect.name == "postgresql":
    # Several instances may start at once: one migrates, the others wait and find nothing to do.
    connection.execute(text("SELECT pg_advisory_xact_lock(74251)"))
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
context.run_migrations()
