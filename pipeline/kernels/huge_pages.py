"""CPU tensors in 2 MB pages (Linux's transparent huge pages) where the kernel gives them for the asking.

A decode step streams every packed weight from memory once. In 4 KB pages a gigabyte of weights is a quarter
of a million pages: a TLB miss at each (in a virtual machine a walk of two page tables), and the hardware
prefetchers stop at each page's end. torch's CPU allocator (glibc's malloc) neither aligns a large tensor to 2 MB
nor advises the kernel to back it with 2 MB pages, and the kernel's default ("madvise") gives them only where
advised. On a Zen 4 virtual machine, in one process against the same weights in 4 KB pages, a decode step took
0.91-0.97x the time at one sequence and its products 0.82-0.97x (docs/performance.md, section 26).

:func:`empty` maps anonymous private memory, advises ``MADV_HUGEPAGE`` over the whole 2 MB pages inside the
tensor (its head is aligned; a tail under 2 MB stays in 4 KB pages, so no page is larger than what it holds), and
returns a tensor over it that keeps the mapping alive. Where the kernel gives no huge pages ("never", or no such
setting: another OS), and for tensors under 2 MB, it is torch's own allocation.
"""
from __future__ import annotations

import math
import mmap
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HUGE_PAGE = 2 ** 21
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def mode(setting: Path = SETTING) -> str | None:
    """The kernel's transparent huge page mode (the bracketed word of `setting`: "always", "madvise" or
    "never"), None where the setting is absent or unreadable."""
    try:
        words = setting.read_text().split()
    except OSError:
        return None
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether this kernel backs memory advised MADV_HUGEPAGE with 2 MB pages."""
    return mode() in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE")


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor, in 2 MB pages where :func:`available` and it fills one."""
    import torch
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGE or not available():
        return torch.empty(shape, dtype=dtype)
    # one huge page more than asked: room to start the tensor on a 2 MB boundary
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # holds `mapping` for as long as the tensor lives
    head = -raw.data_ptr() % HUGE_PAGE
    mapping.madvise(mmap.MADV_HUGEPAGE, head, nbytes // HUGE_PAGE * HUGE_PAGE)
    return raw[head:head + nbytes].view(dtype).view(shape)


def contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a CPU tensor (any strides), in 2 MB pages where :func:`empty` gives them."""
    return empty(tensor.shape, tensor.dtype).copy_(tensor)
