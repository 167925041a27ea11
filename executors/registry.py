"""Finds executors through the `taskgrove.executors` entry-point group.

Built-ins register themselves in our own pyproject.toml, third-party packages in theirs, so there
is one discovery path for both. `SERVICE_EXTENSIONS` narrows the set to the listed extensions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from taskgrove.executors.base import Executor

ENTRY_POINT_GROUP = "taskgrove.executors"
log = logging.getLogger(__name__)


class ExecutorRegistry:
    def __init__(
        self,
        executors: Iterable[type[Executor]],
        extensions: Iterable[str] | None = None,
    ) -> None:
        self.restricted = extensions is not None
        allowed = set(extensions) if extensions is not None else None
        self._by_id: dict[str, type[Executor]] = {}
        for cls in executors:
            if allowed is None or cls.extension in allowed:
                self._by_id[cls.id] = cls

    @classmethod
    def discover(cls, extensions: Iterable[str] | None = None) -> "ExecutorRegistry":
        found: list[type[Executor]] = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken plug-in must not stop the service
                log.warning("executor entry point %s failed to load: %s", ep.name, exc)
                continue
            if isinstance(loaded, type) and issubclass(loaded, Executor) and loaded.id:
                found.append(loaded)
        found.sort(key=lambda c: c.id)
        return cls(found, extensions)

    def get(self, executor_id: str) -> type[Executor] | None:
        return self._by_id.get(executor_id)

    def resolve(self, task: Mapping[str, Any]) -> type[Executor] | None:
        """`params.executor_id` wins over `schemas.method`; `schemas.type` is the fallback."""
        params = task.get("params") or {}
        schemas = task.get("schemas") or {}
        for key in (params.get("executor_id"), schemas.get("method")):
            if isinstance(key, str) and key in self._by_id:
                return self._by_id[key]
        wanted_type = schemas.get("type")
        if isinstance(wanted_type, str):
            for cls in self._by_id.values():
                if cls.type == wanted_type or cls.extension == wanted_type:
                    return cls
        return None

    @staticmethod
    def wanted(task: Mapping[str, Any]) -> str | None:
        """The executor a task asks for, as it wrote it (for messages)."""
        params = task.get("params") or {}
        schemas = task.get("schemas") or {}
        return params.get("executor_id") or schemas.get("method") or schemas.get("type")

    def ids(self) -> list[str]:
        return list(self._by_id)

    def descriptors(self) -> list[dict[str, Any]]:
        return [cls.descriptor() for cls in self._by_id.values()]

    def all(self) -> list[type[Executor]]:
        return list(self._by_id.values())
