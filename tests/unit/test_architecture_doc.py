"""docs/architecture.md names every module of the project, and no module that is gone.

The rule: the doc's "Every module" table has one row per folder that holds project modules (the
first cell is the folder in backticks, `./` for the repository root); the row's last cell names
each module of that folder by its file name in backticks (`settings.py`), __init__.py excepted
(the row itself stands for the package). A file name in another folder's row does not count, so
`role.py` in `services/roles/worker/` names that module and no other.
"""
from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_architecture import ROOT, project_files

DOC = ROOT / "docs" / "architecture.md"
TABLE_HEADING = "## Every module"
BACKTICKED = re.compile(r"`([^`]+)`")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py")


def folder_of(path: Path) -> str:
    folder = path.parent.relative_to(ROOT).as_posix()
    return "./" if folder == "." else folder + "/"


def modules_by_folder() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in project_files():
        names = found.setdefault(folder_of(path), set())
        if path.name != "__init__.py":
            names.add(path.name)
    return found


def table_rows(text: str) -> dict[str, set[str]]:
    """Folder -> the module file names its row names, from the table under TABLE_HEADING."""
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-", " ", ":"}:
            continue
        folder = BACKTICKED.search(cells[0])
        if folder is None:
            continue  # the header row
        assert folder[1] not in rows, f"two rows for {folder[1]}"
        rows[folder[1]] = {name for name in BACKTICKED.findall(cells[-1]) if MODULE_NAME.fullmatch(name)}
    return rows


def test_every_module_is_named_in_its_folders_row_and_every_name_is_a_module():
    rows = table_rows(DOC.read_text())
    modules = modules_by_folder()
    assert sorted(set(modules) - set(rows)) == [], "folders with no row in docs/architecture.md"
    assert sorted(set(rows) - set(modules)) == [], "rows in docs/architecture.md for folders with no module"
    unnamed = {folder: sorted(names - rows[folder]) for folder, names in modules.items() if names - rows[folder]}
    assert unnamed == {}, "modules docs/architecture.md does not name"
    stale = {folder: sorted(rows[folder] - names) for folder, names in modules.items() if rows[folder] - names}
    assert stale == {}, "names in docs/architecture.md that are no module of their folder"


def test_the_rule_reads_a_row_per_folder_and_only_its_last_cell():
    text = ("intro `x.py`\n## Every module\n| folder | job | modules |\n|---|---|---|\n"
            "| `a/` | reads `b.py` | `c.py` (does `d.py`'s job), `e/` |\n| `./` | top | `client.py` |\n"
            "## Next\n| `z/` | | `z.py` |\n")
    assert table_rows(text) == {"a/": {"c.py", "d.py"}, "./": {"client.py"}}


def test_the_modules_include_every_package_and_the_root():
    modules = modules_by_folder()
    assert {"pipeline/", "pipeline/config/", "services/roles/worker/", "builders/", "profiling/lib/", "./"} <= set(modules)
    assert "client.py" in modules["./"] and "checks.py" in modules["pipeline/config/"]
