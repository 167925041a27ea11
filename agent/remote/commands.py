"""The shape of a remote command group: `taskgrove GROUP COMMAND ...`. A group is a name, a help
line and its commands; a command is its arguments and an async function of (client, args, console)
returning the exit status. Adding a group (say `schedules list`) is one module with one Group, named
in agent/remote/__init__.py's GROUPS."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

# (taskgrove.client.AsyncClient, parsed arguments, rich console) -> exit status.
Run = Callable[[Any, argparse.Namespace, Any], Awaitable[int]]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Run
    arguments: Callable[[argparse.ArgumentParser], None] = lambda _parser: None


@dataclass(frozen=True)
class Group:
    name: str
    help: str
    commands: tuple[Command, ...] = field(default_factory=tuple)
