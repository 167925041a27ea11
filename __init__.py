"""taskgrove: the one import name of the installed distribution.

The repository root is the package `taskgrove` (pyproject.toml maps it with setuptools `package-dir`),
so agent/, executors/, storage/ and llm/ import as `taskgrove.agent`, `taskgrove.executors`, ...
and agent-card.json beside this file is package data (read through importlib.resources).
"""

# `from taskgrove import Client, AsyncClient`: the Python client (client/, docs/client.md). Loaded on
# first use, so `import taskgrove` (and `taskgrove serve`) does not pay for httpx and pydantic.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ below imports on first use
    from taskgrove.client import AsyncClient, Client

_CLIENT_NAMES = ("Client", "AsyncClient")
__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> object:
    if name in _CLIENT_NAMES:
        from taskgrove import client

        return getattr(client, name)
    raise AttributeError(f"module 'taskgrove' has no attribute {name!r}")
