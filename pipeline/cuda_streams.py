"""Each stage thread of a worker on a GPU issues its work on a CUDA stream of its own.

Threads that share a device's default stream share one queue of kernels: the engine's decode step
(whose chosen tokens, read back to the host, wait for everything queued before them) waited behind the
encoder stages' hundreds of small kernels, and they behind its graphs: on an H200 at 8 clients the
engine's thread spent 61 % of its time in that read (docs/performance.md, section 30). On streams of
their own the stages' kernels run side by side, and each thread's reads wait for its own work only.
The models' weights, KV cache and graphs were written on the default stream while loading and warming
up: a stream taken here first waits for that stream's work, so nothing is read before it is written.
Nothing a stage hands another thread is a CUDA tensor (vectors, scores, labels and tokens leave as host
values), so no tensor is used on two streams.
"""
from __future__ import annotations

from functools import partial
from typing import Callable


def own_stream_starter(device: str) -> Callable[[], None] | None:
    """What a stage's thread runs before its first item on `device`: take a CUDA stream of its own; None
    (nothing to run) off CUDA."""
    return partial(take_own_stream, device) if device.startswith("cuda") else None


def take_own_stream(device: str) -> None:
    """The calling thread's current stream on `device` becomes a new stream, ordered after the work already
    queued on the device's default stream (torch's current stream is per thread)."""
    import torch
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.default_stream(device))
    torch.cuda.set_stream(stream)
