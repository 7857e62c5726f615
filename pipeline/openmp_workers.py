"""A thread's OpenMP workers handed back while it waits for work.

libgomp (the OpenMP runtime torch's Linux builds carry) keeps the workers of each thread that ran a
parallel region docked for that thread's next one. When the workers of all those teams outnumber
the process's CPUs, libgomp lets no team's workers spin between parallel regions (100 spins
instead of about 300,000) and they sleep and wake at each one: a decode step of a few hundred
small parallel regions, on its engine's thread while the encoder stages' threads hold idle teams,
took 48 ms in a node against 28.6 ms alone (docs/performance.md, sections 28 and 29). A stage's
thread that hands its workers back before it waits leaves the team that runs the only one;
the next batch on that thread starts its workers again (a few pthread_create calls).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the thread pool goes, the runtime stays initialised


def _libgomp() -> ctypes.CDLL | None:
    """torch's libgomp, or None: torch not imported yet (no teams to hand back), or a build on another
    OpenMP runtime (LLVM's libomp pauses the whole runtime, not one thread's team)."""
    torch = sys.modules.get("torch")
    if torch is None or torch.__file__ is None:
        return None
    return _libgomp_in(Path(torch.__file__).parent / "lib")


@functools.cache
def _libgomp_in(folder: Path) -> ctypes.CDLL | None:
    for path in sorted(folder.glob("libgomp*.so*")):
        library = ctypes.CDLL(str(path))  # already loaded by torch: the same handle, no second runtime
        if hasattr(library, "omp_pause_resource_all"):  # OpenMP 5.0: libgomp from GCC 9 on
            return library
    log.debug("no libgomp with omp_pause_resource_all in %s: idle threads keep their OpenMP workers", folder)
    return None


def hand_back_openmp_workers() -> None:
    """End the calling thread's OpenMP workers (libgomp's pause is per thread: other threads' teams,
    running or not, are not touched; its thread count stays). A no-op where torch is not loaded or not
    on libgomp."""
    library = _libgomp()
    if library is not None:
        library.omp_pause_resource_all(OMP_PAUSE_SOFT)  # -1 only inside a parallel region, never here
