"""The house's shape, checked: no import circle anywhere in the project, each floor of services/
imports only the floors below it (docs/architecture.md draws them), no module is over 350 lines, and no test
module imports a fixture from another.

Every import statement counts: a lazy one inside a function, and one under `if TYPE_CHECKING:` that
names types only. A circle that closes only at run time, or only for the type checker, is still a
circle for whoever reads the code."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "services", "profiling", "builders", "tools")
# Modules at the top of the repository, outside every package.
TOP_MODULES = ("client.py",)
# services/ floors, lowest first: a module may import its own floor's modules and lower floors only.
# stages and cluster share a floor and must not import each other.
FLOORS = {"services.server": 0, "services.stages": 1, "services.cluster": 1, "services.roles": 2, "services.node": 3}
# Below every services/ floor; must import nothing from services/, profiling/ or tools/.
BASE = ("pipeline", "builders")
MAX_MODULE_LINES = 350


def project_files() -> list[Path]:
    """Every .py file of the project outside tests/: the packages' and the top modules."""
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    return files + [ROOT / name for name in TOP_MODULES if (ROOT / name).is_file()]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for p in project_files()}


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The project modules a module imports, type-only ones included (resolved to the deepest module that exists)."""
    found: set[str] = set()
    path = modules[module]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
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
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {name: imports_of(name, modules) for name in modules}
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


def test_a_type_only_import_closes_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert imports_of("a", modules) == {"b"} and imports_of("b", modules) == {"a"}


def test_the_project_includes_every_package_and_the_top_modules():
    modules = project_modules()
    assert {"client", "pipeline.config.checks", "services.node", "builders", "profiling"} <= set(modules)
    assert not any(name.startswith("tests") for name in modules)


def test_services_floors_import_only_downward():
    wrong = []
    for module, targets in import_graph().items():
        level = floor(module)
        if level is None:
            continue
        for target in targets:
            target_level = floor(target)
            if target_level is None:
                if target.split(".")[0] in ("profiling", "tools"):
                    wrong.append(f"{module} -> {target}")
                continue
            same_floor = target_level == level
            same_package = target.split(".")[:2] == module.split(".")[:2]
            if target_level > level or (same_floor and not same_package):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


@pytest.mark.parametrize("base", BASE)
def test_pipeline_and_builders_never_import_services_profiling_or_tools(base):
    wrong = [f"{module} -> {target}" for module, targets in import_graph().items()
             if module.split(".")[0] == base for target in targets
             if target.split(".")[0] in ("services", "profiling", "tools")]
    assert wrong == []


def test_serving_code_never_imports_tools_builders_profiling_or_the_client():
    """A serving node runs, and is read, without the tools floor, the builders, the measuring tools
    or the course client (a node with no models fails and names the builder; it never builds)."""
    wrong = [f"{module} -> {target}" for module, targets in import_graph().items()
             if module.split(".")[0] in ("pipeline", "services") for target in targets
             if target.split(".")[0] in ("tools", "builders", "profiling", "client")]
    assert wrong == []


def long_modules() -> dict[str, int]:
    """Each project module (tests excluded) over MAX_MODULE_LINES, with its line count."""
    return {str(p.relative_to(ROOT)): n for p in project_files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}


def test_no_module_is_over_350_lines():
    assert long_modules() == {}


def _fixtures(tree: ast.Module) -> set[str]:
    """The names of a module's top-level functions decorated as pytest fixtures."""
    def is_fixture(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "fixture"
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and any(map(is_fixture, node.decorator_list))}


def fixtures_imported_from_test_modules(root: Path) -> list[str]:
    """`module: name` for every fixture a test module imports from another test module (under root/tests): such a
    fixture comes without the fixtures it asks for, which the importing module then lacks (a conftest.py shares
    fixtures instead)."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.rsplit(".", 1)[-1].startswith("test_"):
                source = root / (node.module.replace(".", "/") + ".py")
                if source.is_file():
                    fixtures = _fixtures(ast.parse(source.read_text()))
                    found += [f"{path.relative_to(root)}: {a.name}" for a in node.names if a.name in fixtures]
    return found


def test_no_test_module_imports_a_fixture_from_another():
    assert fixtures_imported_from_test_modules(ROOT) == []


def test_a_fixture_imported_from_a_test_module_is_found(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("import pytest\n\n@pytest.fixture\ndef made():\n    return 1\n\n"
                                                   "def helper():\n    return 2\n")
    (tmp_path / "tests" / "test_b.py").write_text("from tests.test_a import helper, made\n")
    assert fixtures_imported_from_test_modules(tmp_path) == ["tests/test_b.py: made"]
