"""README.md and docs/ name only files that exist: every repository path they mention is checked."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
TOP = ("pipeline", "services", "profiling", "builders", "tools", "tests", "deploy", "docs", ".ci")
# A path: one of the project's top folders, then folder/file names; a file name ends in an extension.
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./@*<>-]*[\w/])" % "|".join(re.escape(t) for t in TOP))
# Written by a run, not kept in git (data/, logs/, runs/ are ignored; .cache too).
GENERATED = ("data/", "logs/", "runs/", ".cache/")


def mentioned_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).rstrip("./")
        if "*" in path or "<" in path or any(path.startswith(g) for g in GENERATED):
            continue
        found.add(path)
    return found


def exists(path: str) -> bool:
    """The file or folder, or a module with an attribute after it (pipeline/cpu_features.cpu_has_amx)."""
    if (ROOT / path).exists():
        return True
    module, dot, _attribute = path.rpartition(".")
    while dot:
        if (ROOT / f"{module}.py").exists():
            return True
        module, dot, _attribute = module.rpartition(".")
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc):
    missing = sorted(p for p in mentioned_paths(doc.read_text()) if not exists(p))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_rule_finds_paths_and_skips_patterns():
    text = "see `services/server/errors.py`, pipeline/config/ and tests/unit/test_*.py; data/demo is built"
    assert mentioned_paths(text) == {"services/server/errors.py", "pipeline/config"}
    assert exists("pipeline/spec.answer_json") and exists("deploy/systemd/rag-node@.service")
    assert not exists("services/errors.py") and not exists("pipeline/nowhere.name")
