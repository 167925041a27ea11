"""The house: what the distribution holds under its one import name, and which way imports run.

Every `import` and `from ... import` of every module is read with `ast`, wherever it stands: at the
top, inside a function (lazy), under `if TYPE_CHECKING:`. A type-only import is still a dependency
of the design, so it counts like any other.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("agent", "client", "executors", "storage", "llm")

# Layers inside `agent`, top to bottom, one folder each: a module may import its own layer and the
# layers below, never one above. A module's layer is its folder (`agent/services/x.py` is a
# service); the modules directly in `agent/` are the entry point and the wiring (cli.py, app.py),
# above all of them; the package `taskgrove.agent` itself holds only `__version__` and sits at the
# bottom. `executors`, `llm` and `storage` sit below all of them (checked separately).
AGENT_LAYERS = ("remote", "surfaces", "services", "engine", "foundations")
# What each folder holds (docs/ARCHITECTURE.md, "Rooms"):
#   remote/       the remote command line: a client of a running service over HTTP
#   surfaces/     A2A, JSON-RPC envelope and HTTP edge, GraphQL, MCP, WebSocket, dashboard
#   services/     one service per concern, each with its method table, and the container of them
#   engine/       the scheduler: passes, attempts, runs and leases, waits, bus
#   foundations/  what every layer above shares: call context, settings, errors, auth, typed requests
TOP_LEVEL = -1  # the entry point and the wiring (modules directly in agent/)


def _dotted(folder: Path) -> str:
    return ".".join(("taskgrove", *folder.relative_to(ROOT).parts))


def _modules() -> dict[str, Path]:
    """Every module of the distribution: dotted name -> file."""
    found = {"taskgrove": ROOT / "__init__.py"}
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("taskgrove", *parts))] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> set[str]:
    """The taskgrove modules `name` imports, anywhere in its body."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in MODULES else source)
    resolved = set()
    for target in targets:
        while target and target not in MODULES:  # `import taskgrove.x.y as z`: the module itself
            target = target.rpartition(".")[0]
        if target.startswith("taskgrove") and target != name:
            resolved.add(target)
    return resolved


GRAPH = {name: _imports(name) for name in MODULES}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _room(name: str) -> int | None:
    """The layer of an agent module, read off its folder (an index into AGENT_LAYERS, TOP_LEVEL for
    the modules directly in agent/); None outside agent."""
    if name == "taskgrove.agent":
        return len(AGENT_LAYERS) - 1
    if not _within(name, "taskgrove.agent"):
        return None
    parts = name.split(".")[2:]
    if len(parts) == 1 and not _is_package(name):
        return TOP_LEVEL
    return AGENT_LAYERS.index(parts[0]) if parts[0] in AGENT_LAYERS else None


def _layer_name(index: int) -> str:
    return "entry point and wiring" if index == TOP_LEVEL else AGENT_LAYERS[index]


def test_every_package_folder_is_in_the_distribution() -> None:
    """pyproject.toml lists the packages by hand (so tests/ and bench/ never ship): none forgotten."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"taskgrove": "."}
    folders = {ROOT}
    for top in TOP:
        folders |= {p.parent for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(config["packages"]) == sorted(
        "taskgrove" if f == ROOT else _dotted(f) for f in folders)


def test_the_import_graph_is_read() -> None:
    """Guard against a vacuous pass: the reader sees the imports it must see."""
    assert "taskgrove.agent.services.container" in GRAPH["taskgrove.agent.app"]
    assert "taskgrove.storage.repository" in GRAPH["taskgrove.agent.engine.engine"]
    assert "taskgrove.llm.client" in GRAPH["taskgrove.executors.llm"]
    assert "taskgrove.client" in GRAPH["taskgrove.agent.remote"]  # the command line is the client's user


def test_no_import_circle() -> None:
    """Depth-first search over the module graph; any back edge is a circle, reported in full."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_rooms_talk_downwards_only() -> None:
    wrong = []
    for name, targets in GRAPH.items():
        for target in targets:
            if _within(name, "taskgrove.storage") and not _within(target, "taskgrove.storage"):
                wrong.append(f"{name} -> {target} (storage imports none of the others)")
            if (_within(name, "taskgrove.executors") or _within(name, "taskgrove.llm")) \
                    and _within(target, "taskgrove.agent"):
                wrong.append(f"{name} -> {target} (executors and llm never reach up into agent)")
            if _within(name, "taskgrove.llm") and _within(target, "taskgrove.executors"):
                wrong.append(f"{name} -> {target} (llm sits below executors)")
            if _within(name, "taskgrove.client") and not _within(target, "taskgrove.client"):
                wrong.append(f"{name} -> {target} (the public client imports nothing of the service: "
                             "it installs and runs with httpx, websockets, pydantic and anyio alone)")
            if _within(target, "taskgrove.client") and not _within(name, "taskgrove.client") \
                    and name != "taskgrove" and not _within(name, "taskgrove.agent.remote"):
                wrong.append(f"{name} -> {target} (only the remote command line uses the client: the "
                             "service never calls itself over HTTP)")
            if target == "taskgrove.agent.app" and name != "taskgrove.agent.cli":
                wrong.append(f"{name} -> {target} (app.py only wires; only the entry point starts it)")
            source_room, target_room = _room(name), _room(target)
            if source_room is not None and target_room is not None and target_room < source_room:
                wrong.append(f"{name} ({_layer_name(source_room)}) -> {target} "
                             f"({_layer_name(target_room)}): upwards")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_agent_module_has_a_layer() -> None:
    """Every folder of agent/ is a layer: a new folder must be placed in AGENT_LAYERS first."""
    homeless = [name for name in MODULES if _within(name, "taskgrove.agent") and _room(name) is None]
    assert not homeless, f"a folder of agent/ that is no layer (add it to AGENT_LAYERS): {homeless}"
    top_level = sorted(name for name in MODULES if _room(name) == TOP_LEVEL)
    assert top_level == ["taskgrove.agent.app", "taskgrove.agent.cli"], top_level


# Module names used in two places on purpose: the same concept at two layers (docs/ARCHITECTURE.md,
# "One name for one thing"). Any other name used twice is a newcomer's trap and fails below.
SHARED_MODULE_NAMES = {
    "__init__.py": "a package's marker",
}
MAX_SHARED_NAMES = 4  # issue 44: at most four module names used twice, each documented


def _package_files() -> list[Path]:
    return [path for name, path in MODULES.items() if name != "taskgrove"]


def test_one_module_name_for_one_thing() -> None:
    seen: dict[str, list[str]] = {}
    for path in _package_files():
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: places for name, places in seen.items() if len(places) > 1}
    unexplained = {name: places for name, places in twice.items() if name not in SHARED_MODULE_NAMES}
    assert not unexplained, f"module names used more than once: {unexplained}"
    assert len(set(twice) - {"__init__.py"}) <= MAX_SHARED_NAMES


def test_one_class_name_for_one_thing() -> None:
    """No two classes of the package share a name (a reader searching for it finds one).

    The public client (client/) is read apart from the service: its answers and errors carry the
    names the service gives the same things on the wire (Task, TaskStatus, Schedule, QuotaExceeded)
    for the people who use it, who never read the service's code; within the client, too, each
    class name is used once."""
    client = [p for p in _package_files() if p.is_relative_to(ROOT / "client")]
    service = [p for p in _package_files() if not p.is_relative_to(ROOT / "client")]
    for files in (service, client):
        where: dict[str, list[str]] = {}
        for path in files:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
        twice = {name: places for name, places in where.items() if len(places) > 1}
        assert not twice, f"class names defined more than once: {twice}"


def test_no_module_over_600_lines() -> None:
    long = {str(path.relative_to(ROOT)): n for path in _package_files()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"split these by concern: {long}"
