"""The house's shape, checked: no import circle anywhere in the project, and each floor of
services/ imports only the floors below it (docs/architecture.md draws them).

Every import statement that runs counts, a lazy one inside a function too: a circle that only
closes at run time is still a circle for whoever reads the code. Imports under
`if TYPE_CHECKING:` never run and name types only; they do not count."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "services", "profiling", "builders", "tools")
# services/ floors, lowest first: a module may import its own floor's modules and lower floors only.
# stages and cluster share a floor and must not import each other.
FLOORS = {"services.server": 0, "services.stages": 1, "services.cluster": 1, "services.roles": 2, "services.node": 3}
# Below every services/ floor; must import nothing from services/ or profiling/.
BASE = ("pipeline", "builders")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports (resolved to the deepest module that exists)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    found.discard(module_name(path))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {name: imports_of(path, modules) for name, path in modules.items()}
    # A package's __init__ is imported before any of its modules: importing pkg.mod imports pkg.
    for name in list(graph):
        for target in list(graph[name]):
            parent = target.rpartition(".")[0]
            while parent:
                if parent in graph and parent != name and not name.startswith(parent + "."):
                    graph[name].add(parent)
                parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floor(module: str) -> int | None:
    for prefix, level in FLOORS.items():
        if module == prefix or module.startswith(prefix + "."):
            return level
    return None


def test_no_import_circle_in_the_project():
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_services_floors_import_only_downward():
    wrong = []
    for module, targets in import_graph().items():
        level = floor(module)
        if level is None:
            continue
        for target in targets:
            target_level = floor(target)
            if target_level is None:
                if target.startswith("profiling"):
                    wrong.append(f"{module} -> {target}")
                continue
            same_floor = target_level == level
            same_package = target.split(".")[:2] == module.split(".")[:2]
            if target_level > level or (same_floor and not same_package):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


@pytest.mark.parametrize("base", BASE)
def test_pipeline_and_builders_never_import_services_or_profiling(base):
    wrong = [f"{module} -> {target}" for module, targets in import_graph().items()
             if module.split(".")[0] == base for target in targets
             if target.split(".")[0] in ("services", "profiling")]
    assert wrong == []


def test_no_module_in_pipeline_or_services_is_over_350_lines():
    long = {str(p.relative_to(ROOT)): n for package in ("pipeline", "services") for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 350}
    assert long == {}
