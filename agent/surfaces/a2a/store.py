"""The a2a-sdk's task store and push-config store, living in our database under our table names.

The SDK's default table name for its tasks is `tasks`, which is ours. Its `table_name=` option
registers a fresh model on the SDK's process-wide metadata each time a store is built, so a second
app in the same process (tests, a restart) would fail. We therefore declare the two models once,
on a metadata of our own, and point the SDK stores at them. The tables are created by our Alembic
migration 0002 (never by the SDK's `create_table=True`, which would bypass migrations).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from a2a.server.context import ServerCallContext
from a2a.server.models import PushNotificationConfigMixin, TaskMixin
from a2a.server.tasks import DatabasePushNotificationConfigStore, DatabaseTaskStore
from a2a.types.a2a_pb2 import Task
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


Settle = Callable[[Task, ServerCallContext | None], Awaitable[Task]]


class SettlingTaskStore(DatabaseTaskStore):
    """The SDK's store, with one addition: an agent task read while no instance follows its tree
    any more (the service restarted, or the instance that followed it died while another one
    finished the tree) is brought up to the tree's stored outcome on the way out (`settle`)."""

    settle: Settle | None = None

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        task = await super().get(task_id, context)  # type: ignore[arg-type]  # None: no owner filter, as before
        if task is not None and self.settle is not None:
            task = await self.settle(task, context)
        return task


def task_store(engine: AsyncEngine) -> SettlingTaskStore:
    """Agent tasks (execution instances) scoped by owner = the caller's user id."""
    store = SettlingTaskStore(engine, create_table=False)
    store.task_model = A2ATaskModel  # type: ignore[assignment]  # the SDK's columns under our table's name
    return store


def push_config_store(engine: AsyncEngine, encryption_key: bytes | None) -> DatabasePushNotificationConfigStore:
    """Push configs (url, token, credentials), encrypted at rest when the service has a secret."""
    store = DatabasePushNotificationConfigStore(engine, create_table=False, encryption_key=encryption_key)
    store.config_model = A2APushConfigModel  # type: ignore[assignment]  # the SDK's columns under our table's name
    return store


def push_encryption_key(secret: str | None) -> bytes | None:
    """A Fernet key derived from SERVICE_SECRET_KEY; None keeps configs in plain JSON."""
    if not secret:
        return None
    import base64
    import hashlib

    digest = hashlib.sha256(b"taskgrove-a2a-push-configs:" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest)
