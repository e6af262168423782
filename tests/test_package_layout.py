"""The package's rooms follow the data's path: a module imports only from its own room or the rooms before it."""

import ast
from pathlib import Path

import pytest

import ckptqual

PACKAGE = Path(ckptqual.__file__).parent
# The rooms in the order of the data's path; each may import from those before it (top-level modules are rooms).
ROOMS = (
    "faults",
    "resources",
    "output_file",
    "documents",
    "bounded",
    "printable",
    "plan",
    "host",
    "io",
    "limits",
    "config",
    "runs",
    "report",
    "pytest_plugin",
    "cli",
)


def room_of(module: str) -> str:
    return module.split(".")[1]


def imports(path: Path) -> set[str]:
    """The ckptqual modules `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptqual."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("ckptqual.")}
    return found


def test_every_room_is_named():
    rooms = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()}
    assert rooms - {"__init__", "__pycache__", "data"} == set(ROOMS)


def test_no_module_imports_from_a_room_after_its_own():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        own = ROOMS.index(parts[0])
        wrong += [f"{'/'.join(parts)} imports {name}" for name in imports(path) if ROOMS.index(room_of(name)) > own]
    assert wrong == []


def test_read_engines_import_nothing_from_the_sweep_or_the_limits():
    for path in (PACKAGE / "io" / "readers").glob("*.py"):
        assert not {name for name in imports(path) if room_of(name) in ("runs", "limits")}, path


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The ckptqual modules `path` imports, `from package import module` included, typing-only imports too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptqual."):
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= named or {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("ckptqual.")}
    return found & modules


@pytest.mark.parametrize("room", ROOMS)
def test_no_modules_import_each_other_in_a_circle(room):
    """A module needs only what is below it: no module of the room (a package's modules, or the top-level module)
    reaches itself through its imports (typing-only imports included)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: module_imports(path, set(paths)) - {name} for name, path in paths.items()}
    in_room = f"ckptqual.{room}"
    circles = []
    for start in (name for name in graph if name == in_room or name.startswith(f"{in_room}.")):
        seen, stack = set(), [(start, (start,))]
        while stack:
            name, chain = stack.pop()
            for imported in graph[name]:
                if imported == start:
                    circles.append(" -> ".join((*chain, start)))
                elif imported not in seen:
                    seen.add(imported)
                    stack.append((imported, (*chain, imported)))
    assert circles == []
