"""One decode step of the continuous engine with a model whose arithmetic costs (next to) nothing: its host
time and the ops it dispatches (profiling/engine_overhead.py).

Runnable as a script in another checkout (`python <this file> SPEC_JSON OUT_JSON`, with that checkout as
the working folder and PYTHONPATH), so that two commits' engines are measured by the same code in one run;
it imports only `pipeline` (that checkout's) and torch.

Models: `null` (pipeline.null_models.NullCausalLM: fixed one-hot logits, the engine alone: scheduler,
slots, runner, token choice) and `qwen` (the real Qwen2 decoder in the stand-ins' layout, the faithful
layer count, every width tiny, in the precision variant the service applies: the model's own glue per
layer, its non-matmul ops, with matrices too small to cost anything).
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # run as a script: this folder's modules (load.py, models.py) must not shadow others

# The qwen model: Qwen2.5-0.5B's layer count and head layout ratio, widths that make its matmuls free.
QWEN_TINY: dict[str, Any] = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
             "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "tie_word_embeddings": True}
QWEN_LAYERS = 24


# The ops that multiply by a weight matrix, per CPU variant: a step's products (the rest is its glue).
PRODUCT_OPS = frozenset({"_linear_pointwise", "bf16_linear", "linear_dynamic", "vnni_linear", "avx2_linear", "vnni_int4_linear",
                         "avx2_int4_linear", "_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm", "_int_mm", "mm",
                         "addmm", "bmm", "linear"})


class ProductRecorder:
    """A TorchDispatchMode keeping each product op (PRODUCT_OPS) dispatched while it is on with its
    arguments, so the products of one step can be replayed alone: their time, the step's matmul time; and
    the multiply-adds of each op's calls (`macs`, by op name: the output's values times the input's width)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        calls: list[tuple[Any, tuple, dict]] = []
        macs: Counter[str] = Counter()
        self.calls, self.macs = calls, macs

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = str(func.overloadpacket.__name__)
                if name in PRODUCT_OPS:
                    calls.append((func, args, kwargs or {}))
                    macs[name] += out.numel() * args[1 if name == "addmm" else 0].shape[-1]  # addmm(bias, x, w)
                return out

        self.mode = Mode()

    def replay_ms(self, rounds: int, repeats: int) -> float:
        """ms the recorded products take in a row, best of `rounds` rounds of `repeats` replays (warm
        caches, unlike inside the step: the figure errs low, the glue's remainder high)."""
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(repeats):
                for func, args, kwargs in self.calls:
                    func(*args, **kwargs)
            best = min(best, (time.perf_counter() - started) * 1000 / repeats)
        return best


def profiled_steps(step, steps: int, trace: Path | None, cuda: bool) -> dict[str, Any]:
    """torch.profiler over `steps` calls of `step()`: the CPU's ops and, with `cuda`, the device's kernels; the
    chrome trace written to `trace` where given. Returns every op's calls, self CPU ms a step and self device ms a
    step (0 on the CPU), by self CPU time, most first."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"steps": steps, "trace": None if trace is None else trace.name, "ops": [
        {"op": e.key, "calls": e.count, "self_ms_per_step": round(e.self_cpu_time_total / 1000 / steps, 3),
         "device_ms_per_step": round(getattr(e, "self_device_time_total", 0) / 1000 / steps, 3)} for e in events]}


class OpCounter:
    """A TorchDispatchMode counting every aten op dispatched while it is on, by name."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        counts: Counter[str] = Counter()
        self.counts = counts

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts[str(func.overloadpacket.__name__)] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def _generator(model_kind: str, precision: str, layers: int, source_dir: str):
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from pipeline import spec
    from pipeline.device import Placement
    from pipeline.generator import Generator
    kwargs: dict[str, Any] = {"cache_dir": source_dir, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, padding_side="left", **kwargs)
    generation = GenerationConfig.from_pretrained(spec.GENERATOR_MODEL, **kwargs)
    vocab = len(tokenizer)
    if model_kind == "null":
        from pipeline.null_models import NULL_ANSWER, NullCausalLM
        model: Any = NullCausalLM(tokenizer.encode(NULL_ANSWER, add_special_tokens=False), vocab, generation)
        return Generator(tokenizer, model, Placement("cpu", "float32", "null"))
    from pipeline.precision import apply_precision
    from pipeline.precision_policy import LOAD_DTYPE
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN_TINY, num_hidden_layers=layers, vocab_size=vocab, max_position_embeddings=32768)
    model = Qwen2ForCausalLM(config).to(getattr(torch, LOAD_DTYPE[precision])).eval()
    model.generation_config = generation
    model = apply_precision(model, precision)
    return Generator(tokenizer, model, Placement("cpu", LOAD_DTYPE[precision], precision))


def measure(spec_: dict) -> dict:
    """{model: {rows: {"host_ms_per_step": [each round's mean], "ops_per_step": n, "top_ops": [[name, n]]}}}
    for spec_'s models, rows, steps, rounds, prompt_tokens, precision, layers, threads, source_dir."""
    import torch

    from pipeline.continuous import ContinuousEngine
    from pipeline.generator import GenerationRequest
    torch.set_num_threads(int(spec_["threads"]))
    results: dict[str, dict[str, Any]] = {}
    for kind in spec_["models"]:
        generator = _generator(kind, spec_["precision"], int(spec_["layers"]), spec_["source_dir"])
        results[kind] = {}
        for rows in spec_["rows"]:
            results[kind][str(rows)] = _measure_rows(generator, int(rows), spec_, ContinuousEngine, GenerationRequest)
            print(f"[engine_overhead] {Path.cwd().name}: {kind} model, {rows} rows measured", file=sys.stderr, flush=True)
    return results


def _measure_rows(generator, rows: int, spec_: dict, engine_class, request_class) -> dict:
    steps, rounds, count_steps, warm, chunk = int(spec_["steps"]), int(spec_["rounds"]), 2, 3, 512
    prompt = tuple(100 + (i % 2000) for i in range(int(spec_["prompt_tokens"])))
    # Prompts are prefilled a chunk an iteration while the first rows already decode: the cap covers
    # every prefill iteration too, so no row finishes before all decode and the steps are measured.
    prefills = rows * -(-len(prompt) // chunk) + rows
    cap = prefills + warm + rounds * steps + count_steps + 2
    engine = engine_class(generator, max_batch=rows, kv_cache_tokens=rows * (len(prompt) + cap + 256),
                          prefill_chunk=chunk)
    for i in range(rows):  # each prompt distinct in its first token: no two rows alike
        engine.add(request_class("q", (), max_new_tokens=cap, prompt_ids=(prompt[0] + i, *prompt[1:])))
    for _ in range(prefills + 1):  # until every prompt is in and every row decodes
        if engine.step().decoded_rows == rows and not engine.stats().waiting_sequences:
            break
    else:
        raise RuntimeError(f"{rows} rows were not all decoding after {prefills + 1} iterations")
    for _ in range(warm):
        engine.step()
    per_round = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(steps):
            result = engine.step()
        per_round.append((time.perf_counter() - started) * 1000 / steps)
        if result.decoded_rows != rows:
            raise RuntimeError(f"a step decoded {result.decoded_rows} rows, not {rows}")
    counter = OpCounter()
    with counter.mode:
        for _ in range(count_steps):
            engine.step()
    ops = {name: n // count_steps for name, n in counter.counts.items()}
    products = ProductRecorder()
    with products.mode:
        engine.step()
    import torch
    with torch.inference_mode():
        products_ms = products.replay_ms(rounds, steps)
        # older commits move K/V rows in place only in inference mode
        for seq in engine.sequences():
            engine.cancel(seq)
    return {"host_ms_per_step": per_round, "ops_per_step": sum(ops.values()),
            "products_per_step": len(products.calls), "products_ms_per_step": products_ms,
            "top_ops": sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:int(spec_.get("top", 12))]}


if __name__ == "__main__":
    spec_in, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    out.write_text(json.dumps(measure(spec_in)))
