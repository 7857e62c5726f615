"""Every precision variant the project offers an encoder stage, applied to a sentence-transformers
encoder exactly as the embedder applies it (pipeline.embedder.Embedder.load), and each variant's
drift from float32 over a set of texts: embedding cosine and top-k neighbour overlap."""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from profiling.lib.fidelity import REFERENCE, neighbour_overlap, row_cosines

NEIGHBOURS = 10


@dataclass(frozen=True)
class Variant:
    name: str  # as the table shows it
    precision: str  # the PRECISION value serving would run
    int8: tuple[tuple[str, object], ...] = ()  # Int8DynamicLinear's options; () = serving's (kernel auto, fused)


def _serving_int8() -> tuple[str, bool]:
    """(kernel, fused) that Int8DynamicLinear's defaults pick on this CPU (for Linears of 2+ inputs); fused
    (fbgemm's glue in C++) only means something for fbgemm."""
    from pipeline.kernels.fused_int8 import fused_ops
    from pipeline.kernels.int8 import auto_kernel
    kernel = auto_kernel() or "int_mm"  # None: none exact, and int8-dynamic is refused
    return kernel, kernel == "fbgemm" and fused_ops() is not None


def _int8_name(kernel: str, fused: bool) -> str:
    return f"int8-dynamic {kernel}" + (" fused" if fused else "")


def int8_kernels() -> list[Variant]:
    """int8-dynamic on each other kernel this CPU can run (the same bits by design: here measured on real
    weights): the VNNI kernel where built, fbgemm where exact with its glue fused and not, the AVX2 kernel where
    built, torch._int_mm always."""
    from pipeline.kernels import avx2_int8, vnni_int8
    from pipeline.kernels.fbgemm import fbgemm_is_exact
    from pipeline.kernels.fused_int8 import fused_ops
    combos = [("vnni", False)] if vnni_int8.EXTENSION.ops() is not None else []
    if fbgemm_is_exact():
        combos += [("fbgemm", f) for f in ([True, False] if fused_ops() is not None else [False])]
    combos += [("avx2", False)] if avx2_int8.EXTENSION.ops() is not None else []
    combos.append(("int_mm", False))
    return [Variant(_int8_name(k, f), "int8-dynamic", (("kernel", k), ("fused", f)))
            for k, f in combos if (k, f) != _serving_int8()]


def encoder_variants(precisions: Sequence[str] | None = None, kernels: bool = True) -> list[Variant]:
    """float32 first (the reference), then each of `precisions` (default: every variant the CPU is
    offered, supported_variants) as serving applies it, int8-dynamic named by the kernel it runs on;
    with `kernels`, int8-dynamic on every other kernel too."""
    from pipeline.precision_policy import supported_variants
    chosen = [p for p in (precisions or supported_variants("cpu")) if p != REFERENCE]
    variants = [Variant(REFERENCE, REFERENCE)] + [
        Variant(_int8_name(*_serving_int8()) + " (serving)" if p == "int8-dynamic" else p, p) for p in chosen]
    return variants + (int8_kernels() if kernels and "int8-dynamic" in chosen else [])


def load_variant(model_dir: Path, variant: Variant):
    """The encoder in `variant` on the CPU, loaded and converted as the embedder loads bge-base."""
    from pipeline.device import Placement
    from pipeline.embedder import Embedder
    from pipeline.models import ModelSource
    from pipeline.precision_policy import LOAD_DTYPE
    placement = Placement("cpu", LOAD_DTYPE[variant.precision], variant.precision)
    return Embedder.load(ModelSource("hub", None, local_files_only=True), placement, str(model_dir),
                         **dict(variant.int8))


def embed_all(embedder, texts: Sequence[str], batch: int) -> np.ndarray:
    """(n, d) unit rows, in `texts`' order; batches of similar lengths (less padding: faster, and the
    embedder gives a row the same bits whatever its batch-mates)."""
    by_length = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.empty((len(texts), 0), dtype=np.float32)
    for start in range(0, len(texts), batch):
        rows = by_length[start:start + batch]
        vectors = embedder.embed([texts[i] for i in rows])
        if out.shape[1] == 0:
            out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
        out[rows] = vectors
    return out


@dataclass
class VariantFidelity:
    """One variant of one model against float32 on the same texts."""
    model: str  # "real" or "standin"
    variant: str
    precision: str
    cosine_mean: float
    cosine_min: float
    overlap_mean: float  # top-NEIGHBOURS neighbour overlap, mean over query texts
    overlap_min: float
    float32_bits: bool  # its embeddings are float32's, bit for bit
    same_bits_as: str | None = None  # the first variant listed before it with bit-identical embeddings
    extra: dict = field(default_factory=dict)


def compare(model: str, embeddings: dict[str, np.ndarray], variants: Sequence[Variant],
            queries: Sequence[int] | None = None, k: int = NEIGHBOURS) -> list[VariantFidelity]:
    """Each variant's figures against float32's embeddings (variants[0] must be float32)."""
    reference = embeddings[REFERENCE]
    rows = []
    for i, v in enumerate(variants):
        got = embeddings[v.name]
        cos, overlap = row_cosines(reference, got), neighbour_overlap(reference, got, k, queries)
        same = next((u.name for u in variants[:i] if np.array_equal(embeddings[u.name], got)), None)
        rows.append(VariantFidelity(model, v.name, v.precision, float(cos.mean()), float(cos.min()),
                                    float(overlap.mean()), float(overlap.min()), np.array_equal(reference, got), same))
    return rows


def measure(model: str, model_dir: Path, texts: Sequence[str], variants: Sequence[Variant], *, batch: int = 32,
            queries: Sequence[int] | None = None, progress: Callable[[str], None] = lambda _: None
            ) -> list[VariantFidelity]:
    """Embeds `texts` with the model in each variant (one loaded at a time) and compares them."""
    import time
    embeddings, seconds = {}, {}
    for v in variants:
        started = time.perf_counter()
        embedder = load_variant(model_dir, v)
        embeddings[v.name] = embed_all(embedder, texts, batch)
        seconds[v.name] = time.perf_counter() - started
        del embedder
        gc.collect()
        progress(f"{model} {v.name}: {len(texts)} texts in {seconds[v.name]:.1f} s")
    rows = compare(model, embeddings, variants, queries)
    for r in rows:
        r.extra["load_and_embed_s"] = round(seconds[r.variant], 2)  # a shared machine's: not a timing result
    return rows


def sample_queries(n: int, count: int | None) -> list[int] | None:
    """`count` query rows spread evenly over n texts (None: every text is a query)."""
    if count is None or count >= n:
        return None
    return [math.floor(i * n / count) for i in range(count)]
