"""The a2a-sdk's task store and push-config store, living in our database under our table names.

The SDK's default table name for its tasks is `tasks`, which is ours. Its `table_name=` option
registers a fresh model on the SDK's process-wide metadata each time a store is built, so a second
app in the same process (tests, a restart) would fail. We therefore declare the two models once,
on a metadata of our own, and point the SDK stores at them. The tables are created by our Alembic
migration 0002 (never by the SDK's `create_table=True`, which would bypass migrations).
"""

from __future__ import annotations

from a2a.server.models import PushNotificationConfigMixin, TaskMixin
from a2a.server.tasks import DatabasePushNotificationConfigStore, DatabaseTaskStore
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase

TASKS_TABLE = "a2a_tasks"
PUSH_CONFIGS_TABLE = "a2a_push_configs"


class _SdkTables(DeclarativeBase):
    """Metadata of the SDK-shaped tables only; Alembic's target metadata stays storage.models."""


class A2ATaskModel(TaskMixin, _SdkTables):
    __tablename__ = TASKS_TABLE


class A2APushConfigModel(PushNotificationConfigMixin, _SdkTables):
    __tablename__ = PUSH_CONFIGS_TABLE


def task_store(engine: AsyncEngine) -> DatabaseTaskStore:
    """Agent tasks (execution instances) scoped by owner = the caller's user id."""
    store = DatabaseTaskStore(engine, create_table=False)
    store.task_model = A2ATaskModel
    return store


def push_config_store(engine: AsyncEngine, encryption_key: bytes | None) -> DatabasePushNotificationConfigStore:
    """Push configs (url, token, credentials), encrypted at rest when the service has a secret."""
    store = DatabasePushNotificationConfigStore(engine, create_table=False, encryption_key=encryption_key)
    store.config_model = A2APushConfigModel
    return store


def push_encryption_key(secret: str | None) -> bytes | None:
    """A Fernet key derived from SERVICE_SECRET_KEY; None keeps configs in plain JSON."""
    if not secret:
        return None
    import base64
    import hashlib

    digest = hashlib.sha256(b"taskgrove-a2a-push-configs:" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest)
