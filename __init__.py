"""taskgrove: the one import name of the installed distribution.

The repository root is the package `taskgrove` (pyproject.toml maps it with setuptools `package-dir`),
so agent/, executors/, storage/ and llm/ import as `taskgrove.agent`, `taskgrove.executors`, ...
and agent-card.json beside this file is package data (read through importlib.resources).
"""
