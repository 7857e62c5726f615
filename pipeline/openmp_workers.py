"""A thread's OpenMP workers handed back while it waits for work.

libgomp (the OpenMP runtime torch's Linux builds carry) keeps the workers of each thread that ran a
parallel region docked for that thread's next one. When the workers of all those teams outnumber
the process's CPUs, libgomp lets no team's workers spin between parallel regions (100 spins
instead of about 300,000) and they sleep and wake at each one: a decode step of a few hundred
small parallel regions, on its engine's thread while the encoder stages' threads hold idle teams,
took 48 ms in a node against 28.6 ms alone (docs/performance.md, sections 28 and 29). A stage's
thread that hands its workers back before it waits leaves the team that runs the only one;
the next batch on that thread starts its workers again (a few pthread_create calls).

faiss's wheel carries a libgomp of its own: the index node's search thread hands its team back too, or its
worker spins about 300,000 times after every search, the CPU a node beside it on the host needs
(docs/performance.md, section 34).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the thread pool goes, the runtime stays initialised


def _libgomps() -> tuple[ctypes.CDLL, ...]:
    """The OpenMP runtimes loaded here that can hand a thread's team back: torch's libgomp and faiss's (its wheel
    carries its own copy, a runtime of its own with its own teams), each where its package is imported. LLVM's
    libomp, which pauses the whole runtime rather than one thread's team, is left alone."""
    return _libgomps_of(getattr(sys.modules.get("torch"), "__file__", None),
                        getattr(sys.modules.get("faiss"), "__file__", None))


@functools.cache
def _libgomps_of(torch_file: str | None, faiss_file: str | None) -> tuple[ctypes.CDLL, ...]:
    folders = [Path(torch_file).parent / "lib"] if torch_file else []
    if faiss_file:
        folders.append(Path(faiss_file).parent.parent / "faiss_cpu.libs")
    return tuple(library for folder in folders if (library := _libgomp_in(folder)) is not None)


@functools.cache
def _libgomp_in(folder: Path) -> ctypes.CDLL | None:
    for path in sorted(folder.glob("libgomp*.so*")):
        library = ctypes.CDLL(str(path))  # already loaded by its package: the same handle, no second runtime
        if hasattr(library, "omp_pause_resource_all"):  # OpenMP 5.0: libgomp from GCC 9 on
            return library
    log.debug("no libgomp with omp_pause_resource_all in %s: idle threads keep their OpenMP workers", folder)
    return None


def hand_back_openmp_workers() -> None:
    """End the calling thread's OpenMP workers in torch's and faiss's runtimes (libgomp's pause is per thread:
    other threads' teams, running or not, are not touched; its thread count stays). A no-op for a package not
    imported or not on libgomp."""
    for library in _libgomps():
        library.omp_pause_resource_all(OMP_PAUSE_SOFT)  # -1 only inside a parallel region, never here
