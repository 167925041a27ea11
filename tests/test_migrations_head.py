"""storage.db.migrate skips Alembic when the database is at the newest migration: the newest
revision it reads from the files must be Alembic's head, and a skipped start must leave the same
schema as a migrated one. A new SQLite database is created from storage/sqlite_schema.py without
Alembic: it must be exactly the schema the migrations give."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from taskgrove.storage import db, sqlite_schema


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


# -- a new SQLite database: the newest schema without Alembic ---------------------------------------

SCHEMA_MODULE = Path(__file__).resolve().parents[1] / "storage" / "sqlite_schema.py"


def _master(path: Path) -> list[tuple[Any, ...]]:
    """Everything SQLite knows of a schema (but the pages it lives on), in creation order."""
    with sqlite3.connect(path) as con:
        return con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid").fetchall()


def migrated_with_alembic(path: Path) -> None:
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            command.upgrade(db._alembic_config(conn), "head")
    finally:
        engine.dispose()


def render_schema_module(path: Path) -> str:
    """storage/sqlite_schema.py for the database at `path` (migrated by Alembic): one string per
    statement, split into literals at its line breaks so the file reads like the SQL."""
    with sqlite3.connect(path) as con:
        revision = con.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    statements = [sql for _type, _name, _table, sql in _master(path) if sql is not None]
    head, _, _ = SCHEMA_MODULE.read_text().partition("\nREVISION = ")
    lines = [head, f"REVISION = {revision!r}", "", "STATEMENTS: tuple[str, ...] = ("]
    for sql in statements:
        pieces = [piece for piece in re.split(r"(?<=\n)|(?<=, )(?=\w)", sql) if piece]
        # one literal per line of SQL, long lines (columns added by ALTER TABLE) cut after a comma
        literals, current = [], ""
        for piece in pieces:
            if current and (current.endswith("\n") or len(current) + len(piece) > 90):
                literals.append(current)
                current = ""
            current += piece
        literals.append(current)
        body = "\n     ".join(repr(literal) for literal in literals)
        lines.append(f"    ({body}),")
    lines.append(")")
    return "\n".join(lines) + "\n"


def test_the_sqlite_snapshot_is_the_migrated_schema(tmp_path: Path) -> None:
    migrated_with_alembic(tmp_path / "alembic.db")
    expected = render_schema_module(tmp_path / "alembic.db")
    assert SCHEMA_MODULE.read_text() == expected, (
        "storage/sqlite_schema.py is not the schema the migrations give: after adding a migration, "
        "run `python -m tests.test_migrations_head` to write it again")
    assert sqlite_schema.REVISION == db.head_revision()


async def test_a_new_sqlite_database_gets_exactly_the_migrated_schema(tmp_path: Path) -> None:
    migrated_with_alembic(tmp_path / "alembic.db")
    engine = db.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'new.db'}")
    try:
        await db.migrate(engine)  # empty: created from the snapshot
        async with engine.connect() as conn:
            assert await conn.run_sync(db._is_current)
    finally:
        await engine.dispose()
    # Tables, columns, types, defaults, keys, constraints and indexes, down to the text of each.
    assert _master(tmp_path / "new.db") == _master(tmp_path / "alembic.db")
    with sqlite3.connect(tmp_path / "new.db") as con, sqlite3.connect(tmp_path / "alembic.db") as ref:
        for (table,) in ref.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for pragma in ("table_xinfo", "index_list", "foreign_key_list"):
                query = f"PRAGMA {pragma}({table})"
                assert con.execute(query).fetchall() == ref.execute(query).fetchall(), (pragma, table)
        assert con.execute("SELECT * FROM alembic_version").fetchall() == [(db.head_revision(),)]


async def test_a_new_database_does_not_load_alembic(tmp_path: Path) -> None:
    code = ("import asyncio, sys; from taskgrove.storage import db; "
            "engine = db.create_engine(sys.argv[1]); asyncio.run(db.migrate(engine)); "
            "print('alembic' in sys.modules)")
    url = f"sqlite+aiosqlite:///{tmp_path / 'new.db'}"
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


async def test_a_database_that_is_not_empty_is_left_to_alembic(tmp_path: Path) -> None:
    engine = db.create_engine(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
    try:
        async with engine.begin() as conn:  # something of an older version, without a version row
            await conn.execute(text("CREATE TABLE unrelated (x INTEGER)"))
            assert not await conn.run_sync(db._create_new_sqlite)
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: inspect(c).get_table_names())
        assert names == ["unrelated"]  # nothing created, nothing half-done
    finally:
        await engine.dispose()


if __name__ == "__main__":  # writes storage/sqlite_schema.py from the migrations
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        migrated_with_alembic(Path(scratch) / "alembic.db")
        SCHEMA_MODULE.write_text(render_schema_module(Path(scratch) / "alembic.db"))
