"""Peak and current memory of this process, the peak resettable per measurement where Linux allows."""
from __future__ import annotations

import logging
import re
import resource
from pathlib import Path

log = logging.getLogger(__name__)


class MemoryProbe:
    """Peak and current RSS of this process.

    ru_maxrss only ever grows, so with `--stage all` every stage would report the
    largest model loaded before it. Linux can reset the peak (VmHWM) by writing 5
    to /proc/self/clear_refs; where that is refused we fall back to ru_maxrss and
    say so once.
    """

    def __init__(self):
        self.resettable = self.reset()
        if not self.resettable:
            log.info("cannot reset the peak RSS here; peaks are since the process started")

    @staticmethod
    def reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def peak_mib(self) -> float:
        hwm_kib = _status_kib("VmHWM") if self.resettable else None
        if hwm_kib is None:
            hwm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return hwm_kib / 1024

    @staticmethod
    def current_mib() -> float:
        import psutil
        return psutil.Process().memory_info().rss / 2**20


def _status_kib(key: str) -> int | None:
    try:
        match = re.search(rf"^{key}:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None
