"""The kernels a benchmark can switch back to their baselines, measured side by side with the current ones
on one loaded model (profiling/bench_decode.py's `--baselines`).

* ``fbgemm-int8``: int8-dynamic's products through fbgemm with pipeline/kernels/fused_int8.py's C++ glue,
  not pipeline/kernels/vnni_int8.py's one call (the same bits);
* ``unfused-int8``: through fbgemm with the glue as torch ops (the same bits);
* ``avx2-kernels``: int8-dynamic's and int4-dynamic's products through pipeline/kernels/avx2_int8.py and
  avx2_int4.py, what an AVX2 CPU without VNNI runs (the same bits);
* ``chunked-attention``: the CPU's attention as torch's flash kernel in chunks, not
  pipeline/kernels/ordered_attention.py (other bits: the tokens may differ);
* ``torch-glue``: the CPU decode step's norms, rotary and cache writes as torch ops, not
  pipeline/kernels/decode_glue.py's calls (the same bits);
* ``python-layers``: the CPU decode step's layers looped in Python, not pipeline/kernels/decode_layers.py's
  one call (the same ops: the same bits);
* ``torch-token-choice``: a greedy row's repetition penalty and argmax as torch ops on a float copy of the logits,
  not pipeline/kernels/greedy_choice.py's one pass (the same tokens);
* ``small-pages``: every weight of 2 MB and more (packed ones included) in a copy in torch's own allocation (4 KB
  pages), not pipeline/kernels/huge_pages.py's 2 MB ones (the same bits). The copies are made at the first switch
  and kept for the next.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

# name -> whether it gives the current kernels' bits
BASELINES = {"fbgemm-int8": True, "unfused-int8": True, "avx2-kernels": True, "chunked-attention": False,
             "torch-glue": True, "python-layers": True, "torch-token-choice": True, "small-pages": True}
# model -> [(a weight, its own data, its copy in 4 KB pages)], for "small-pages"
_SMALL_PAGE_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _small_page_copies(model) -> list[tuple]:
    """Every CPU weight of `model` of 2 MB and more (parameters, buffers, int8's packed weights) beside a copy of
    its data in torch's allocation; made once a model."""
    from pipeline.kernels.huge_pages import HUGE_PAGE
    from pipeline.kernels.int8 import Int8DynamicLinear
    if model not in _SMALL_PAGE_COPIES:
        tensors = {}
        for module in model.modules():
            parts = module.kernel_parts() if isinstance(module, Int8DynamicLinear) else None
            for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False), *(parts or ())]:
                if tensor is not None and tensor.device.type == "cpu" and tensor.nbytes >= HUGE_PAGE:
                    tensors[id(tensor)] = tensor
        _SMALL_PAGE_COPIES[model] = [(t, t.data, t.data.clone()) for t in tensors.values()]
    return _SMALL_PAGE_COPIES[model]


@contextlib.contextmanager
def running(model, baseline: str | None) -> Iterator[None]:
    """Within: `model` (a torch module, or None for a stage without one) runs `baseline`'s kernels (None: the
    current ones); the current ones are back after, an exception included."""
    from pipeline.kernels import decode_glue, decode_layers, greedy_choice, ordered_attention
    from pipeline.kernels.int4 import Int4DynamicLinear
    from pipeline.kernels.int8 import Int8DynamicLinear
    if baseline is not None and baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r} (expected one of {', '.join(BASELINES)})")
    int8 = [] if model is None else [m for m in model.modules() if isinstance(m, Int8DynamicLinear)]
    kernels, fused = [m.kernel for m in int8], [m.fused for m in int8]
    int4 = [] if model is None else [m for m in model.modules() if isinstance(m, Int4DynamicLinear)]
    int4_kernels = [m.kernel for m in int4]
    # The baselines that unload one extension: its callers ask for it at every call (the attention, the decode step,
    # the token chooser) and run torch's ops where it is not loaded.
    unloaded = {"chunked-attention": ordered_attention.EXTENSION, "torch-glue": decode_glue.EXTENSION,
                "python-layers": decode_layers.EXTENSION, "torch-token-choice": greedy_choice.EXTENSION}.get(baseline)
    loaded = unloaded.ops if unloaded is not None else None
    weights = _small_page_copies(model) if baseline == "small-pages" and model is not None else []
    try:
        if baseline in ("fbgemm-int8", "unfused-int8"):
            for module in int8:
                module.use_kernel("fbgemm", keep=True)  # packed once, kept for the next switch
                module.fused = baseline == "fbgemm-int8"
        elif baseline == "avx2-kernels":
            for module in int8:
                module.use_kernel("avx2", keep=True)
            for module in int4:
                module.use_kernel("avx2")
        elif unloaded is not None:
            unloaded.ops = lambda: None
        for tensor, _, copy in weights:
            tensor.data = copy  # the same tensor (the decode layers hold it) over other memory
        yield
    finally:
        for module, kernel, was in zip(int8, kernels, fused):
            module.use_kernel(kernel, keep=True)
            module.fused = was
        for module, kernel in zip(int4, int4_kernels):
            module.use_kernel(kernel)
        if unloaded is not None:
            unloaded.ops = loaded
        for tensor, own, _ in weights:
            tensor.data = own
