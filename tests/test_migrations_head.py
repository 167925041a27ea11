"""storage.db.migrate skips Alembic when the database is at the newest migration: the newest
revision it reads from the files must be Alembic's head, and a skipped start must leave the same
schema as a migrated one."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from taskgrove.storage import db


def test_head_revision_is_alembics_head() -> None:
    config = db._alembic_config(None)  # type: ignore[arg-type]
    assert db.head_revision() == ScriptDirectory.from_config(config).get_current_head()


async def test_a_current_database_is_left_alone_and_an_older_one_upgraded(tmp_path: Any) -> None:
    engine = db.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
    try:
        async with engine.begin() as conn:  # a database an older version left at 0002
            await conn.run_sync(lambda c: command.upgrade(db._alembic_config(c), "0002"))
            assert not await conn.run_sync(db._is_current)
        await db.migrate(engine)  # upgraded by Alembic
        async with engine.connect() as conn:
            assert await conn.run_sync(db._is_current)
            assert "executions" in await conn.run_sync(lambda c: inspect(c).get_table_names())
            schema = await conn.run_sync(lambda c: c.exec_driver_sql("SELECT sql FROM sqlite_master").all())
        await db.migrate(engine)  # current: nothing to do, nothing changes
        async with engine.connect() as conn:
            assert await conn.run_sync(lambda c: c.exec_driver_sql("SELECT sql FROM sqlite_master").all()) == schema
        async with engine.begin() as conn:  # two rows, or an unknown revision: Alembic decides
            await conn.execute(text("UPDATE alembic_version SET version_num = 'zzzz'"))
            assert not await conn.run_sync(db._is_current)
    finally:
        await engine.dispose()
