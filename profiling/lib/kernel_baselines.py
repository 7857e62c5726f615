"""The kernels a benchmark can switch back to their baselines, measured side by side with the current ones
on one loaded model (profiling/bench_decode.py's `--baselines`).

* ``unfused-int8``: int8-dynamic's per-row glue as torch ops, not pipeline/kernels/fused_int8.py's C++
  passes (the same bits).
* ``chunked-attention``: the CPU's attention as torch's flash kernel in chunks, not
  pipeline/kernels/ordered_attention.py (other bits: the tokens may differ).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

# name -> whether it gives the current kernels' bits
BASELINES = {"unfused-int8": True, "chunked-attention": False}


@contextlib.contextmanager
def running(model, baseline: str | None) -> Iterator[None]:
    """Within: `model` (a torch module, or None for a stage without one) runs `baseline`'s kernels (None: the
    current ones); the current ones are back after, an exception included."""
    from pipeline.kernels.int8 import Int8DynamicLinear
    from pipeline.kernels.ordered_attention import EXTENSION
    if baseline is not None and baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r} (expected one of {', '.join(BASELINES)})")
    int8 = [] if model is None else [m for m in model.modules() if isinstance(m, Int8DynamicLinear)]
    fused = [m.fused for m in int8]
    built = EXTENSION.ops
    try:
        if baseline == "unfused-int8":
            for module in int8:
                module.fused = False
        elif baseline == "chunked-attention":
            EXTENSION.ops = lambda: None  # chunked_attention and the decode step ask it at every call
        yield
    finally:
        for module, was in zip(int8, fused):
            module.fused = was
        EXTENSION.ops = built
