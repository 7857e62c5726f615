"""README.md and docs/ name only files that exist: every repository path they mention, and every link's file and anchor, is checked."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
TOP = ("pipeline", "services", "profiling", "builders", "tools", "tests", "deploy", "docs", ".ci")
# A path: one of the project's top folders, then folder/file names; a file name ends in an extension.
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./@*<>-]*[\w/])" % "|".join(re.escape(t) for t in TOP))
# A command: `python -m profiling.loadgen` names profiling/loadgen.py (or a package's __main__).
COMMAND = re.compile(r"-m ((?:pipeline|services|profiling|builders|tools)(?:\.\w+)+)")
# A line that says what it names was removed or moved keeps it as a record, and so does every
# other mention of a name such a line gives (docs/performance.md's ledger and its commands).
REMOVED = re.compile(r"\b(?:removed|moved)\b")
# Written by a run, not kept in git (data/, logs/, runs/ are ignored; .cache too).
GENERATED = ("data/", "logs/", "runs/", ".cache/")


def recorded_as_gone(text: str) -> set[str]:
    """The names a line saying 'removed' or 'moved' gives: `profiling/bench_x.py` and bench_x."""
    names = set()
    for line in text.splitlines():
        if REMOVED.search(line):
            for match in [*PATH.finditer(line), *COMMAND.finditer(line)]:
                names.add(Path(match.group(1).replace(".", "/").removesuffix("/py")).stem)
            names.update(word.rpartition(".")[2] for word in re.findall(r"`([\w.]+)", line))
    return names


def mentioned_paths(text: str) -> set[str]:
    found = set()
    gone = recorded_as_gone(text)
    for line in text.splitlines():
        if REMOVED.search(line):
            continue
        for match in PATH.finditer(line):
            path = match.group(1).rstrip("./")
            if "*" in path or "<" in path or any(path.startswith(g) for g in GENERATED):
                continue
            found.add(path)
        found.update(match.group(1).replace(".", "/") for match in COMMAND.finditer(line))
    return {p for p in found if Path(p).stem not in gone}


def exists(path: str) -> bool:
    """The file or folder, or a module with an attribute after it (pipeline/cpu_features.cpu_supports_bf16)."""
    if (ROOT / path).exists() or (ROOT / f"{path}.py").exists():
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
    assert mentioned_paths("run `python -m profiling.loadgen --help`") == {"profiling/loadgen"}
    assert mentioned_paths("`profiling/bench_x.py` (tool removed; it ran at commit abc)") == set()
    assert mentioned_paths("`bench_x` (removed)\n```\npython -m profiling.bench_x --rounds 2\n```") == set()
    assert mentioned_paths("`bench_y` (removed)\npython -m profiling.bench_x") == {"profiling/bench_x"}
    assert exists("pipeline/spec.answer_json") and exists("deploy/systemd/rag-node@.service")
    assert exists("profiling/loadgen") and exists("builders/standins")
    assert not exists("services/errors.py") and not exists("pipeline/nowhere.name")


# A Markdown link outside code blocks: [text](target), the target a file, a file#anchor or #anchor.
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found = {heading_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", doc.read_text())):
        if re.match(r"\w+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no such heading or anchor)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_a_doc_makes_reaches_a_file_and_its_anchor(doc):
    assert broken_links(doc) == [], f"{doc.relative_to(ROOT)} links to what is not there"


def test_the_link_rule_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "a.md").write_text('# The `POST /query` route\n<a id="today"></a>\n')
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#the-post-query-route) [ok](a.md#today) [no](a.md#gone) [no](c.md)\n"
                   "```\n[in code](nowhere.md)\n```\n[web](https://example.com/x)")
    assert broken_links(doc) == ["a.md#gone (no such heading or anchor)", "c.md (no such file)"]
