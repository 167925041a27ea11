"""Log lines: one JSON object per line when asked, with the task whose execution logged it."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from taskgrove.agent.foundations.logconfig import JsonFormatter, TaskContext, TextFormatter, current_task


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(TaskContext())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test-logs-{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    return logger, stream


async def test_lines_logged_during_a_task_carry_it_and_others_do_not() -> None:
    logger, stream = _capture(JsonFormatter())

    async def executor(task_id: str) -> None:
        current_task.set((task_id, "root-1"))  # what the engine does for each attempt
        await asyncio.sleep(0)
        logger.warning("working on %s", task_id)

    await asyncio.gather(executor("a"), executor("b"))
    logger.error("outside any task")
    try:
        raise ValueError("kaput")
    except ValueError:
        logger.exception("with a traceback")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_message = {line["message"]: line for line in lines}
    assert by_message["working on a"]["task_id"] == "a" and by_message["working on a"]["root_task_id"] == "root-1"
    assert by_message["working on b"]["task_id"] == "b", "each asyncio task has its own context"
    assert "task_id" not in by_message["outside any task"]
    assert "ValueError: kaput" in by_message["with a traceback"]["exception"]
    assert all(line["level"] and line["logger"] and line["time"] for line in lines)


def test_text_lines_name_the_task_given_explicitly() -> None:
    logger, stream = _capture(TextFormatter("%(levelname)s %(message)s"))
    logger.warning("interrupted", extra={"task_id": "t9", "root_task_id": "r"})
    assert stream.getvalue().strip() == "WARNING interrupted [task t9]"
