"""py-spy over one node of a local cluster while a load runs: which of its threads hold the GIL, and in what (a
diagnosis kept beside a check's figures; py-spy itself is not a dependency: where it is not on PATH, nothing runs)."""
from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

RATE_HZ = 100
STACK_FRAMES = 3  # the innermost frames a thread's stack is named by


def node_pid(launcher_pid: int, node: int) -> int | None:
    """The process of node `node` among the launcher's children (its environment's NODE_NUMBER), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone, or not ours to read
        if parent == launcher_pid and f"NODE_NUMBER={node}".encode() in environ:
            return int(entry.name)
    return None


@contextlib.contextmanager
def gil_recording(pid: int | None, out: Path) -> Iterator[Path | None]:
    """py-spy's GIL samples of process `pid` (every thread, raw stacks) into `out` for as long as the block runs;
    yields the file, or None where py-spy is not on PATH or there is no process."""
    spy = shutil.which("py-spy")
    if spy is None or pid is None:
        yield None
        return
    with open(out.with_suffix(".log"), "w") as log:
        record = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw",
                                   "--threads", "--nonblocking", "--gil", "-o", str(out)], stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            yield out
        finally:
            record.send_signal(signal.SIGINT)  # py-spy writes what it sampled when interrupted
            try:
                record.wait(30)
            except subprocess.TimeoutExpired:
                record.kill()


def thread_tops(raw: str, stacks: int = 5) -> dict[str, dict]:
    """From py-spy's raw output (`frame;frame;... count` lines, the first frame `thread (id): name`): per thread
    name (a pool's numbered names as one) its GIL samples and its most sampled innermost frames."""
    samples: collections.Counter[str] = collections.Counter()
    tops: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        name = re.sub(r"-\d+$", "", re.sub(r"^thread \(\w+\): ", "", frames[0]))
        samples[name] += int(count)
        tops[name][";".join(frame.split(" (")[0] for frame in frames[-STACK_FRAMES:])] += int(count)
    return {name: {"samples": n, "top": dict(tops[name].most_common(stacks))} for name, n in samples.most_common()}


def read_tops(path: Path | None) -> dict[str, dict] | None:
    """:func:`thread_tops` of a recording's file, or None where nothing was recorded."""
    return thread_tops(path.read_text()) if path is not None and path.exists() and os.path.getsize(path) else None
