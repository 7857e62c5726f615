"""Other runtimes for the encoder stages: ONNX Runtime against PyTorch, on identical inputs.

For each encoder stage (embed, rerank, sentiment, toxicity) the project's own loader
gives the float32 model and its int8-dynamic variant (`pipeline.precision`). The
float32 model is exported to ONNX (TorchScript exporter, dynamic batch and sequence
axes) and run by onnxruntime's CPUExecutionProvider as is (`ort-float32`) and after
`onnxruntime.quantization.quantize_dynamic` (`ort-int8`: int8 weights, uint8
activations quantized at run time; only MatMuls with constant weights, i.e. the
Linears, as the project's int8 keeps embeddings and attention in float).

All four runtimes get the same tokenized arrays; timings are interleaved (the order
rotated each repeat, so a busy neighbour slows every runtime alike) and their
medians compared. Fidelity is measured against PyTorch float32 with the selection
tool's metrics (`profiling.lib.fidelity`). The rule (:func:`verdict`): a stage
adopts an ONNX Runtime variant only if it is at least `min_speedup` times faster
than PyTorch int8-dynamic at both sizes, its every rule metric is at least as
good as PyTorch int8-dynamic's, and its outputs move with their batch-mates no more
than PyTorch int8-dynamic's (per-row scales) do.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from pipeline import spec
from profiling.lib.fidelity import fidelity

# The encoders: every model stage but the LLM.
STAGES = tuple(str(stage) for stage in spec.MODEL_STAGES if stage != spec.Stage.GENERATE)
REFERENCE, BASELINE = "torch-float32", "torch-int8"
CANDIDATES = ("ort-float32", "ort-int8")
RUNTIMES = (REFERENCE, BASELINE) + CANDIDATES
# Item counts timed per stage: one, and a typical batch (rerank: one request's ten pairs).
DEFAULT_SIZES = {"embed": (1, 16), "rerank": (1, 10), "sentiment": (1, 8), "toxicity": (1, 8)}
# The fidelity metrics the rule compares (at least as good as PyTorch int8's, each).
RULE_METRICS = {"embed": ("cosine_min", "cosine_mean"), "rerank": ("top3_agreement", "spearman"),
                "sentiment": ("label_agreement",), "toxicity": ("label_agreement",)}
DEFAULT_MIN_SPEEDUP = 1.3
# A candidate's batch drift may exceed PyTorch int8-dynamic's (padding only: per-row scales) by float noise only.
DRIFT_SLACK = 1e-5
RERANK_DOCS = 10  # pairs per rerank request, as search returns them


def default_opset() -> int:
    """The newest opset the installed torch's TorchScript exporter writes."""
    try:
        from torch.onnx import _constants
        return int(_constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET)
    except (ImportError, AttributeError):
        return 17


# ------------------------------------------------------------------------- models as tensor functions

def load_stage(stage: str, source, variant: str):
    """The project's stage object (Embedder, Reranker, ...) in `variant`, on the CPU, as the service loads it."""
    from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
    from pipeline.device import Placement
    from pipeline.embedder import Embedder
    from pipeline.precision import LOAD_DTYPE
    from pipeline.reranker import Reranker
    classes = {"embed": Embedder, "rerank": Reranker, "sentiment": SentimentClassifier,
               "toxicity": ToxicityClassifier}
    return classes[stage].load(source, Placement("cpu", LOAD_DTYPE[variant], variant))


def forward_module(stage: str, model, names: Sequence[str]):
    """The stage's network as positional tensors -> one float tensor (what ONNX export traces)."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            inputs = dict(zip(names, tensors))
            if stage == "embed":  # sentence-transformers: pooling and normalisation included
                return self.model(inputs)["sentence_embedding"]
            return self.model(**inputs).logits

    return Forward().eval()


@dataclass
class Workload:
    """One stage's tokenized inputs: the two timed sizes and the fidelity set in batches."""
    stage: str
    names: list[str]  # input names, in the order the exported graph takes them
    sizes: tuple[int, int]
    timed: dict[int, dict[str, np.ndarray]]  # item count -> feed
    fidelity_feeds: list[dict[str, np.ndarray]]
    to_items: Callable[[list[np.ndarray]], list]  # raw outputs of the fidelity feeds -> fidelity() input
    tokens: dict[int, int] = field(default_factory=dict)  # item count -> padded sequence length
    alone_feeds: list[dict[str, np.ndarray]] = field(default_factory=list)  # fidelity_feeds[0]'s items, one each


def _tokenizer(stage: str, obj) -> Callable[[list], dict[str, np.ndarray]]:
    """items -> int64 arrays, padded, truncated as the stage truncates them."""
    from pipeline import spec

    def as_int64(encoded) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=np.int64) for k, v in encoded.items()}
    if stage == "embed":
        def embed_features(texts):  # sentence-transformers' own tokenization; drops its non-tensor keys
            prepare = getattr(obj.model, "preprocess", None) or obj.model.tokenize
            return as_int64({k: v.numpy() for k, v in prepare(list(texts)).items() if hasattr(v, "numpy")})
        return embed_features
    if stage == "rerank":
        return lambda pairs: as_int64(obj.tokenizer([list(p) for p in pairs], padding=True, truncation=True,
                                                    max_length=spec.TRUNCATE_LENGTH, return_tensors="np"))
    return lambda texts: as_int64(obj.tokenizer([spec.classifier_text(t) for t in texts], padding=True,
                                                truncation=True, max_length=spec.TRUNCATE_LENGTH,
                                                return_tensors="np"))


def stage_items(stage: str, n: int) -> list:
    """n inputs of the stage's kind: queries, (query, document) pairs in requests of ten, answers."""
    from profiling.lib.inputs import answer_texts, document_pool, query_set, rerank_inputs
    if stage == "embed":
        return query_set(n)
    pool = document_pool(None)
    if stage == "rerank":
        requests = rerank_inputs(pool, max(1, math.ceil(n / RERANK_DOCS)))
        queries = query_set(len(requests))  # varied queries, as the selection tool asks them
        return [(q, d.content) for q, r in zip(queries, requests) for d in r.documents][:n]
    return answer_texts(pool, n)


def _to_items(stage: str, obj) -> Callable[[list[np.ndarray]], list]:
    from pipeline import spec
    if stage == "embed":
        return lambda outs: np.concatenate(outs).astype(np.float32)
    if stage == "rerank":  # one score list per request (a fidelity feed is one request)
        return lambda outs: [o.reshape(-1).tolist() for o in outs]
    if stage == "sentiment":
        labels = obj.labels
        return lambda outs: [spec.sentiment_from_label(labels[i]) for o in outs for i in o.argmax(-1)]
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    return lambda outs: [spec.is_toxic_flag(float(p)) for o in outs for p in sigmoid(o).max(-1)]


def build_workload(stage: str, obj, sizes: tuple[int, int], queries: int) -> Workload:
    """Timed feeds of sizes[0] and sizes[1] items, and `queries` fidelity items in batches of sizes[1]
    (rerank: `queries` requests of ten pairs, one request per feed)."""
    tokenize = _tokenizer(stage, obj)
    timed = {n: tokenize(stage_items(stage, n)) for n in sizes}
    per_feed = RERANK_DOCS if stage == "rerank" else sizes[1]
    total = queries * RERANK_DOCS if stage == "rerank" else queries
    items = stage_items(stage, total)
    feeds = [tokenize(items[i:i + per_feed]) for i in range(0, len(items), per_feed)]
    names = list(timed[sizes[1]].keys())
    alone = [tokenize([item]) for item in items[:per_feed]]
    return Workload(stage, names, tuple(sizes), timed, feeds, _to_items(stage, obj),
                    {n: int(feed[names[0]].shape[1]) for n, feed in timed.items()}, alone)


def batch_drift(run: Callable[[Mapping[str, np.ndarray]], np.ndarray], work: Workload) -> float:
    """Largest difference between an item's raw output in its batch and alone. Padding moves
    float sums a little in any runtime; a per-tensor activation scale (ORT's dynamic int8 picks
    one per input) moves every row with its batch-mates, which the service must not allow."""
    together = run(work.fidelity_feeds[0])
    return max(float(np.abs(together[i] - run(feed)[0]).max()) for i, feed in enumerate(work.alone_feeds))


# ------------------------------------------------------------------------- runtimes

def torch_runner(module, names: Sequence[str]) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    import torch

    def run(feed):
        with torch.inference_mode():
            return module(*[torch.from_numpy(feed[n]) for n in names]).float().numpy()
    return run


def export_onnx(module, feed: Mapping[str, np.ndarray], names: Sequence[str], path: Path, opset: int) -> float:
    """Writes the module as ONNX at path (batch and sequence axes dynamic); returns the seconds taken.
    The example feed should be padded (several lengths), so no shortcut for an all-ones mask is traced."""
    import torch
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    started = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(module, tuple(torch.from_numpy(feed[n]) for n in names), str(path), dynamo=False,
                          opset_version=opset, input_names=list(names), output_names=["output"],
                          dynamic_axes={**axes, "output": {0: "batch"}})
    return time.perf_counter() - started


def quantize_onnx(source: Path, target: Path, per_channel: bool) -> float:
    """ORT dynamic int8 of the Linears' MatMuls (int8 weights, per channel or per tensor); seconds taken."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    started = time.perf_counter()
    quantize_dynamic(str(source), str(target), per_channel=per_channel, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})
    return time.perf_counter() - started


def ort_runner(path: Path, threads: int) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # the same budget torch gets
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # No busy-waiting after a run: spinning threads would steal the cores from the next runtime timed
    # (and, in service, from the other stages in the process).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, dict(feed))[0]


def interleaved_ms(runners: Mapping[str, Callable], feeds: Mapping[int, Mapping], repeat: int) -> dict:
    """runtime -> item count -> timings in ms: one warm-up each, then `repeat` rounds with the
    runtimes' order rotated every round."""
    names = list(runners)
    for name in names:
        for feed in feeds.values():
            runners[name](feed)
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in feeds} for name in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for n, feed in feeds.items():
                started = time.perf_counter()
                runners[name](feed)
                times[name][n].append((time.perf_counter() - started) * 1e3)
    return times


def _mib(module) -> float:
    from pipeline.precision import model_nbytes
    return model_nbytes(module) / 2**20  # int8-dynamic's packed weights included


def _folder_mib(folder: Path) -> float:
    """An export's size on disk: its .onnx and any external-data files beside it."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20


def _timed_load(stage: str, source, variant: str):
    started = time.perf_counter()
    obj = load_stage(stage, source, variant)
    return obj, time.perf_counter() - started


def measure_stage(stage: str, source, *, sizes: tuple[int, int], queries: int, repeat: int, threads: int,
                  opset: int, per_channel: bool, workdir: Path, progress=lambda line: None) -> dict:
    """Every runtime of one stage on the same feeds: {"figures", "sizes", "tokens", "export_s", "quantize_s"}."""
    fp32, load32_s = _timed_load(stage, source, "float32")
    int8, load8_s = _timed_load(stage, source, "int8-dynamic")
    work = build_workload(stage, fp32, sizes, queries)
    m32, m8 = forward_module(stage, fp32.model, work.names), forward_module(stage, int8.model, work.names)
    f32_dir, i8_dir = workdir / stage / "float32", workdir / stage / "int8"
    f32_dir.mkdir(parents=True), i8_dir.mkdir(parents=True)
    progress(f"{stage}: exporting to ONNX (opset {opset})")
    export_s = export_onnx(m32, work.timed[sizes[1]], work.names, f32_dir / "model.onnx", opset)
    progress(f"{stage}: quantizing ({'per channel' if per_channel else 'per tensor'})")
    quantize_s = quantize_onnx(f32_dir / "model.onnx", i8_dir / "model.onnx", per_channel)
    runners = {REFERENCE: torch_runner(m32, work.names), BASELINE: torch_runner(m8, work.names),
               "ort-float32": ort_runner(f32_dir / "model.onnx", threads),
               "ort-int8": ort_runner(i8_dir / "model.onnx", threads)}
    progress(f"{stage}: fidelity on {len(work.fidelity_feeds)} feed(s), then {repeat} interleaved repeat(s)")
    outputs = {name: work.to_items([run(feed) for feed in work.fidelity_feeds]) for name, run in runners.items()}
    drift = {name: batch_drift(run, work) for name, run in runners.items()}
    times = interleaved_ms(runners, work.timed, repeat)
    prepare = {REFERENCE: load32_s, BASELINE: load8_s, "ort-float32": export_s, "ort-int8": quantize_s}
    size = {REFERENCE: _mib(m32), BASELINE: _mib(m8), "ort-float32": _folder_mib(f32_dir),
            "ort-int8": _folder_mib(i8_dir)}
    figures = [RuntimeFigures(stage, name, median(times[name][sizes[0]]), median(times[name][sizes[1]]),
                              fidelity(stage, outputs[REFERENCE], outputs[name]), prepare[name], size[name],
                              {str(n): t for n, t in times[name].items()}, drift[name])
               for name in runners]
    return {"figures": figures, "sizes": tuple(sizes), "tokens": work.tokens, "export_s": export_s,
            "quantize_s": quantize_s}


# ------------------------------------------------------------------------- figures and the rule

@dataclass
class RuntimeFigures:
    stage: str
    runtime: str
    one_ms: float  # median, sizes[0] items
    batch_ms: float  # median, sizes[1] items
    fidelity: dict[str, float]  # against PyTorch float32
    prepare_s: float  # load (torch) or export / quantize (ORT)
    model_mib: float  # ONNX file size, or the torch model's parameters and buffers
    times_ms: dict[str, list[float]] = field(default_factory=dict)
    batch_drift: float = math.nan  # max |output in a batch - output alone|, raw model outputs


@dataclass
class Verdict:
    stage: str
    adopt: str | None  # the ORT variant to adopt, None = keep PyTorch
    reasons: dict[str, str]  # candidate -> why it passes or fails


def speedups(candidate: RuntimeFigures, baseline: RuntimeFigures) -> tuple[float, float]:
    """PyTorch int8's median / the candidate's, at one item and at the batch (above 1 = faster)."""
    def ratio(base: float, cand: float) -> float:
        return base / cand if cand > 0 else math.nan
    return ratio(baseline.one_ms, candidate.one_ms), ratio(baseline.batch_ms, candidate.batch_ms)


def verdict(stage: str, figures: Sequence[RuntimeFigures], min_speedup: float = DEFAULT_MIN_SPEEDUP) -> Verdict:
    """Adopt the fastest (at the batch) ORT variant that is >= min_speedup x PyTorch int8 at both sizes
    and at least as faithful on every rule metric; else keep PyTorch (None). Missing figures fail."""
    by_runtime = {f.runtime: f for f in figures if f.stage == stage}
    baseline = by_runtime.get(BASELINE)
    reasons: dict[str, str] = {}
    passing = []
    for name in CANDIDATES:
        cand = by_runtime.get(name)
        if cand is None or baseline is None:
            reasons[name] = "not measured"
            continue
        one, batch = speedups(cand, baseline)
        faults = [f"{label} {x:.2f}x < {min_speedup:g}x" for label, x in (("one", one), ("batch", batch))
                  if not x >= min_speedup]  # NaN fails
        faults += [f"{m} {cand.fidelity.get(m, math.nan):.4g} < int8's {baseline.fidelity.get(m, math.nan):.4g}"
                   for m in RULE_METRICS[stage]
                   if not cand.fidelity.get(m, math.nan) >= baseline.fidelity.get(m, math.nan)]
        if not cand.batch_drift <= baseline.batch_drift + DRIFT_SLACK:  # NaN fails
            faults.append(f"batch drift {cand.batch_drift:.2g} > int8's {baseline.batch_drift:.2g}: "
                          "an answer would depend on its batch-mates")
        reasons[name] = (f"{one:.2f}x / {batch:.2f}x vs {BASELINE}; "
                         + ("passes" if not faults else "fails: " + "; ".join(faults)))
        if not faults:
            passing.append(cand)
    adopt = min(passing, key=lambda f: f.batch_ms).runtime if passing else None
    return Verdict(stage, adopt, reasons)


def rule_text(min_speedup: float) -> str:
    metrics = "; ".join(f"{s}: {', '.join(m)}" for s, m in RULE_METRICS.items())
    return (f"adopt an ONNX Runtime variant for a stage only if its median time is >= {min_speedup:g}x faster than "
            f"PyTorch int8-dynamic at both sizes and every fidelity metric vs PyTorch float32 ({metrics}) is at "
            f"least as good as PyTorch int8-dynamic's, and an item's output moves with its batch-mates no more than "
            f"PyTorch int8-dynamic's (+{DRIFT_SLACK:g}); the fastest such at the batch, else keep PyTorch")


def format_table(stages: Mapping[str, Mapping]) -> str:
    """stages: stage -> {"figures": [RuntimeFigures], "sizes": (one, batch), "verdict": Verdict}."""
    header = (f"{'stage':<10}{'runtime':<15}{'items':>6}{'tokens':>8}{'ms one':>9}{'ms B':>9}{'x int8 one':>11}"
              f"{'x int8 B':>9}{'prep s':>8}{'MiB':>7}{'drift':>9}  fidelity vs torch-float32")
    lines = [header, "-" * len(header)]
    for stage, result in stages.items():
        figures = result["figures"]
        base = next((f for f in figures if f.runtime == BASELINE), None)
        for f in figures:
            one, batch = speedups(f, base) if base else (math.nan, math.nan)
            adopted = " *" if result["verdict"].adopt == f.runtime else ""
            fid = ", ".join(f"{k} {v:.4g}" for k, v in f.fidelity.items())
            (n1, nb), tokens = result["sizes"], result["tokens"]
            lines.append(f"{stage:<10}{f.runtime + adopted:<15}{f'{n1}/{nb}':>6}{f'{tokens[n1]}/{tokens[nb]}':>8}"
                         f"{f.one_ms:>9.1f}{f.batch_ms:>9.1f}{one:>10.2f}x{batch:>8.2f}x{f.prepare_s:>8.1f}"
                         f"{f.model_mib:>7.0f}{f.batch_drift:>9.1e}  {fid}")
    lines.append("items: one / batch B; tokens: their padded lengths; ms: median ms; x int8: PyTorch int8's time / "
                 "this one's (above 1 = faster); prep s: load (torch), export (ort-float32), quantize (ort-int8); "
                 "MiB: parameters + buffers (torch), file size (ORT); drift: max |output in a batch - alone|; * = adopted")
    return "\n".join(lines)


def format_verdicts(stages: Mapping[str, Mapping]) -> str:
    lines = []
    for stage, result in stages.items():
        v = result["verdict"]
        lines.append(f"{stage}: " + (f"ADOPT {v.adopt}" if v.adopt else "keep PyTorch") + " ("
                     + "; ".join(f"{name}: {why}" for name, why in v.reasons.items()) + ")")
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan
