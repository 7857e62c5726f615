"""How far a precision variant's answers are from float32's (pure functions over plain outputs, no
models), and which variant to pick: the selection rule and the env file a deployer sources."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

REFERENCE = "float32"  # what every variant is compared with, and the fallback


def row_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    ref, cand = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    return (ref * cand).sum(axis=1) / np.maximum(norms, 1e-30)


def nearest_neighbours(vectors: np.ndarray, k: int, queries: Sequence[int] | None = None) -> np.ndarray:
    """(queries, k) indices of each query row's k most cosine-similar other rows of `vectors`, most
    similar first (itself left out; ties by index). Queries: row indices, default every row."""
    unit = np.asarray(vectors, dtype=np.float64)
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-30)
    rows = np.arange(len(unit)) if queries is None else np.asarray(queries)
    similar = unit[rows] @ unit.T
    similar[np.arange(len(rows)), rows] = -np.inf
    return np.argsort(-similar, axis=1, kind="stable")[:, :k]


def neighbour_overlap(reference: np.ndarray, candidate: np.ndarray, k: int = 10,
                      queries: Sequence[int] | None = None) -> np.ndarray:
    """Per query row, the share of its k nearest neighbours under `reference` that are also among
    its k nearest under `candidate` (the same rows embedded twice; order inside the k ignored:
    retrieval hands its top k on as a set)."""
    ref, cand = nearest_neighbours(reference, k, queries), nearest_neighbours(candidate, k, queries)
    return np.array([len(set(a) & set(b)) / k for a, b in zip(ref.tolist(), cand.tolist())])


def order(scores: Sequence[float]) -> list[int]:
    """Indices by descending score; ties keep input order (the reranker's stable sort)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def top_k_agreement(reference: Sequence[float], candidate: Sequence[float], k: int = 3) -> float:
    """Share of float32's top k that the variant also puts in its top k (order inside ignored:
    the LLM sees the top 3 as its context either way)."""
    k = min(k, len(reference))
    return len(set(order(reference)[:k]) & set(order(candidate)[:k])) / k if k else 1.0


def _ranks(scores: Sequence[float]) -> np.ndarray:
    ranks = np.empty(len(scores))
    ranks[order(scores)] = np.arange(len(scores))
    return ranks


def spearman(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """Spearman's rho of the two rankings (ties broken by position, as the rerank order is)."""
    n = len(reference)
    if n < 2:
        return 1.0
    d = _ranks(reference) - _ranks(candidate)
    return float(1 - 6 * (d ** 2).sum() / (n * (n ** 2 - 1)))


def kendall(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """Kendall's tau of the two rankings: (concordant - discordant) pairs / all pairs."""
    a, b = _ranks(reference), _ranks(candidate)
    n = len(a)
    if n < 2:
        return 1.0
    total = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i in range(n) for j in range(i + 1, n))
    return float(total / (n * (n - 1) / 2))


def first_difference(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first token where the two answers differ (a length difference counts
    at the shorter one's end); None when they are identical."""
    for i, (x, y) in enumerate(zip(reference, candidate)):
        if x != y:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def agreement(reference: Sequence, candidate: Sequence) -> float:
    """Share of items with equal outputs (labels, or whole token sequences)."""
    return sum(a == b for a, b in zip(reference, candidate)) / len(reference) if reference else 1.0


def logit_drift(reference: np.ndarray, candidate: np.ndarray) -> float:
    """||candidate - reference|| / ||reference|| of one position's logits (float64 arithmetic)."""
    ref, cand = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    return float(np.linalg.norm(cand - ref) / max(float(np.linalg.norm(ref)), 1e-30))


def generation_fidelity(reference: Sequence[Mapping], candidate: Sequence[Mapping]) -> dict[str, float]:
    """The LLM's figures from per-prompt outputs {"ids": greedy new ids, "prompt_top1": the argmax
    after every prompt position, "last_logits": the logits after the whole prompt}.

    Greedy answers diverge for good at the first flipped near-tie, so exact match alone says
    little; the prompt's positions are read teacher-forced (every variant sees the same text),
    so their top-1 agreement counts flips one position at a time, and the drift is the relative
    error of the logits the first new token is chosen from."""
    ids_ref, ids_cand = [r["ids"] for r in reference], [c["ids"] for c in candidate]
    firsts = [first_difference(r, c) for r, c in zip(ids_ref, ids_cand)]
    differing = [f for f in firsts if f is not None]
    same = sum(int(np.sum(np.asarray(r["prompt_top1"]) == np.asarray(c["prompt_top1"])))
               for r, c in zip(reference, candidate))
    positions = sum(len(r["prompt_top1"]) for r in reference)
    drifts = [logit_drift(r["last_logits"], c["last_logits"]) for r, c in zip(reference, candidate)]
    return {"exact_match": agreement([tuple(r) for r in ids_ref], [tuple(c) for c in ids_cand]),
            "first_diff_min": float(min(differing)) if differing else math.nan,
            "first_diff_median": float(np.median(differing)) if differing else math.nan,
            "teacher_top1": same / positions if positions else 1.0,
            "logit_drift_max": max(drifts) if drifts else 0.0}


def fidelity(stage: str, reference, candidate) -> dict[str, float]:
    """The stage's fidelity figures of one variant's outputs against float32's on the same queries."""
    if stage == "embed":
        cos = row_cosines(np.asarray(reference), np.asarray(candidate))
        return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean())}
    if stage == "rerank":
        pairs = list(zip(reference, candidate))
        return {"top3_agreement": float(np.mean([top_k_agreement(r, c) for r, c in pairs])),
                "spearman": float(np.mean([spearman(r, c) for r, c in pairs])),
                "kendall": float(np.mean([kendall(r, c) for r, c in pairs]))}
    if stage == "generate":
        return generation_fidelity(reference, candidate)
    return {"label_agreement": agreement(list(reference), list(candidate))}


# (stage, metric, default minimum): a variant passes when every metric of its stage is >= its minimum.
DEFAULT_THRESHOLDS: dict[str, dict[str, float]] = {
    "embed": {"cosine_min": 0.99}, "rerank": {"top3_agreement": 0.9, "spearman": 0.8},
    "generate": {"exact_match": 0.75}, "sentiment": {"label_agreement": 0.95}, "toxicity": {"label_agreement": 0.95}}


# Stand-ins have no trained weights' outlier channels, so their embed cosines understate a variant's
# drift; profiling.real_fidelity measures by how much, on a real encoder beside its same-shape stand-in.
REAL_DRIFT_METRICS = ("cosine_min", "cosine_mean")


def real_drift_factors(report: Mapping) -> dict[str, dict[str, float]]:
    """precision -> {metric: how many times the real model's drift (1 - cosine) is the stand-in's, at
    least 1}, from profiling.real_fidelity's report (its rows as serving runs each variant)."""
    rows = {(r["model"], r["variant"]): r for r in report["rows"]
            if r["variant"] == r["precision"] or r["variant"].endswith("(serving)")}
    factors: dict[str, dict[str, float]] = {}
    for (model, variant), real in rows.items():
        stand = rows.get(("standin", variant))
        if model != "real" or stand is None or real["precision"] == REFERENCE:
            continue
        factors[real["precision"]] = {m: max(1.0, (1 - real[m]) / (1 - stand[m])) if stand[m] < 1 else 1.0
                                      for m in REAL_DRIFT_METRICS}
    return factors


def with_real_drift(stage: str, variant: str, figures: Mapping[str, float],
                    factors: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """A stand-in's embed figures with each cosine's drift scaled by the variant's real-weights factor
    (the stand-in's own kept as standin_<metric>); other stages and unmeasured variants as they are."""
    scale = factors.get(variant, {}) if stage == "embed" else {}
    out = dict(figures)
    for metric, factor in scale.items():
        if metric in figures:
            out[f"standin_{metric}"] = figures[metric]
            out[metric] = 1 - (1 - figures[metric]) * factor
    return out


@dataclass
class Measurement:
    """One stage in one variant: speed, memory, fidelity against float32."""
    stage: str
    variant: str
    one_ms: float  # median seconds x 1e3 for one item
    batch_ms: float  # median for a typical batch
    batch: int
    peak_rss_mib: float  # of a fresh process that loaded only this model in this variant
    model_mib: float  # its parameters and buffers
    fidelity: dict[str, float] = field(default_factory=dict)
    passed: bool = True
    failed: list[str] = field(default_factory=list)


def check(m: Measurement, thresholds: Mapping[str, Mapping[str, float]]) -> Measurement:
    """Sets m.passed and m.failed ('metric value < minimum'); float32 always passes: it is the reference."""
    m.failed = [] if m.variant == REFERENCE else [
        f"{metric} {m.fidelity.get(metric, math.nan):.4g} < {minimum:g}"
        for metric, minimum in thresholds.get(m.stage, {}).items()
        if not m.fidelity.get(metric, math.nan) >= minimum]  # NaN (not measured) fails
    m.passed = not m.failed
    return m


def rule_text(thresholds: Mapping[str, Mapping[str, float]]) -> str:
    limits = "; ".join(f"{stage}: " + ", ".join(f"{k} >= {v:g}" for k, v in t.items())
                       for stage, t in thresholds.items())
    return (f"per stage, the variant with the lowest median typical-batch time among those whose fidelity "
            f"against {REFERENCE} passes every threshold ({limits}); {REFERENCE} when none does")


def choose(measurements: Sequence[Measurement]) -> dict[str, str]:
    """stage -> chosen variant, by the rule above (measurements already checked)."""
    chosen: dict[str, str] = {}
    for stage in dict.fromkeys(m.stage for m in measurements):
        passing = [m for m in measurements if m.stage == stage and m.passed and math.isfinite(m.batch_ms)]
        chosen[stage] = min(passing, key=lambda m: m.batch_ms).variant if passing else REFERENCE
    return chosen


def env_file(chosen: Mapping[str, str], header: Sequence[str]) -> str:
    """`# header` lines, then one `<STAGE>_PRECISION=<variant>` line per stage measured."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"{stage.upper()}_PRECISION={variant}" for stage, variant in chosen.items()]
    return "\n".join(lines) + "\n"
