"""Tooling stays out of the serving house: nothing in pipeline/ or services/ imports the tools floor
(tools/), the builders, the measuring tools (profiling/) or the course client, and the packages
around the house keep the 350-line cap too.

Every import statement counts, a lazy one inside a function or one under `if TYPE_CHECKING:`
too: a serving node must run, and be read, without any of them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("pipeline", "services")
OUTSIDE = ("tools", "builders", "profiling", "client")
MAX_LINES = 350


def imported_roots(source: str, filename: str = "<test>") -> set[str]:
    """The top-level package of every absolute import in `source`, wherever the statement is."""
    roots = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def serving_imports_of_tooling() -> list[str]:
    return [f"{path.relative_to(ROOT)} imports {root}"
            for package in SERVING for path in sorted((ROOT / package).rglob("*.py"))
            for root in sorted(imported_roots(path.read_text(), str(path)) & set(OUTSIDE))]


def test_no_serving_module_imports_tools_builders_profiling_or_the_client():
    assert serving_imports_of_tooling() == []


def test_the_check_sees_lazy_and_type_only_imports():
    source = ("import os\nfrom pipeline import spec\n"
              "def f():\n    from builders.standins import build_standins\n"
              "if TYPE_CHECKING:\n    from tools.local import LocalCluster\n"
              "import client, profiling.lib.cli as cli\n")
    assert imported_roots(source) & set(OUTSIDE) == {"builders", "tools", "client", "profiling"}


@pytest.mark.parametrize("package", ["tools", "builders", "profiling"])
def test_no_module_in_the_tooling_packages_is_over_350_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
