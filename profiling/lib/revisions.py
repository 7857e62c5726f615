"""Another commit of this repository's files beside this checkout, for a tool that measures two commits
side by side in one run (profiling/engine_overhead.py, profiling/overhead_floor.py)."""
from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from pipeline.config import REPO_ROOT


def _safe(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, links out of the tree skipped rather than refused."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """REV's files (`git archive`: no worktree registered, nothing to clean up in the repository) in a
    temporary folder, removed afterwards; ValueError naming REV when git does not know it."""
    done = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO_ROOT, capture_output=True)
    if done.returncode != 0:
        raise ValueError(f"cannot read commit {rev!r}: {done.stderr.decode(errors='replace').strip()}")
    with tempfile.TemporaryDirectory(prefix="rev-") as folder:
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
            archive.extractall(folder, filter=_safe)
        yield Path(folder)


def write_compared(out: Path, tool: str, args, results: dict) -> Path:
    """A compared run's record: its arguments, this checkout's commit, the commit compared (or None) and
    the results by label, as `out/<tool>.json`."""
    from profiling.lib.provenance import git_commit
    from profiling.lib.report import write_json
    record = {"args": {k: v for k, v in vars(args).items() if k != "out"}, "commit": git_commit(),
              "compared": args.compare or None, "results": results}
    return write_json(out / f"{tool}.json", record)
