"""mkdocs hook: lets mkdocstrings find the package `taskgrove` for docs/client.md's API reference.

The package is the repository root itself (pyproject.toml's package-dir), and griffe, which reads
the source for mkdocstrings, finds packages by folder name: it is given a folder holding one link,
`taskgrove`, to the root (as tests/test_types.py does for mypy). Made per build, removed at exit.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority


@event_priority(100)  # before mkdocstrings' own on_config, which creates the handler with its paths
def on_config(config: Any) -> Any:
    where = Path(tempfile.mkdtemp(prefix="taskgrove-docs-"))
    atexit.register(shutil.rmtree, where, True)
    (where / "taskgrove").symlink_to(Path(config.config_file_path).resolve().parent, target_is_directory=True)
    handlers = config.plugins["mkdocstrings"].config["handlers"]
    python = handlers.setdefault("python", {})
    python["paths"] = [str(where), *python.get("paths", [])]
    return config
