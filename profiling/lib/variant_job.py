"""One stage loaded in one precision variant, in a fresh process, and measured (speed, memory, the
outputs the fidelity figures compare): the job profiling.select_variants runs once per variant."""
from __future__ import annotations

import base64
import math
import time
from typing import Callable, Mapping

from pipeline.config import Settings
from pipeline.precision import model_nbytes


def _workload(stage: str, model, n: int, max_new: int) -> tuple[list, Callable[[list], object], Callable[[list], list]]:
    """(inputs, the stage's batch call to time, outputs to compare per item) for n queries."""
    from profiling.lib.inputs import answer_texts, cycled, document_pool, query_set, rerank_inputs
    queries = query_set(n)
    if stage == "embed":
        return queries, model.embed, lambda items: model.embed(items).tolist()
    pool = document_pool(None)
    if stage == "rerank":
        from pipeline.reranker import RerankRequest
        # ten documents each as in service, asked with the varied query set instead of the eight
        requests = [RerankRequest(q, r.documents) for q, r in zip(queries, rerank_inputs(pool, n))]
        return requests, model.rerank, lambda items: [
            model.score_pairs([(r.query, d.content) for d in r.documents]) for r in items]
    if stage == "generate":
        from pipeline import spec
        # Random-weight stand-ins may emit EOS at any step: every variant generates the full
        # count, so timings compare like with like and the token comparison is the worst case.
        model.generation_config.min_new_tokens = max_new
        prompts = [model.prompt_ids(q, cycled(pool, spec.CONTEXT_DOCS, i * spec.CONTEXT_DOCS))
                   for i, q in enumerate(queries)]
        run = lambda items: model.generate_ids(items, max_new_tokens=max_new)  # noqa: E731
        return prompts, run, lambda items: [{"ids": ids, **_read_prompt(model, prompt)}
                                            for prompt, ids in zip(items, run(items))]
    return answer_texts(pool, n), model.classify, model.classify


def _read_prompt(generator, prompt: list[int], chunk: int = 128) -> dict:
    """The LLM reading one prompt alone: the argmax after every position (teacher-forced) and the
    logits after the last one (float32 bytes, base64). The head runs in chunks of positions: the
    whole prompt's logits would be prompt length x vocabulary floats."""
    import torch
    ids = torch.tensor([prompt], device=generator.placement.device)
    with torch.inference_mode():
        hidden = generator.model.model(input_ids=ids).last_hidden_state
        head = generator.model.lm_head
        top1 = [t for start in range(0, hidden.shape[1], chunk)
                for t in head(hidden[:, start:start + chunk]).argmax(dim=-1)[0].tolist()]
        last = head(hidden[:, -1:]).float()[0, 0].cpu().numpy()
    return {"prompt_top1": top1, "last_logits": base64.b64encode(last.tobytes()).decode()}


def _times_ms(run: Callable[[list], object], items: list, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run(items)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def _model_mib(module) -> float:
    return model_nbytes(module) / 2**20


def measure_one(job: Mapping) -> dict:
    """Load one stage in one variant in this (fresh) process and measure it: what a worker prints."""
    import torch

    from builders.standins import source_building_standins
    from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
    from pipeline.device import Placement, select_device, thread_budget
    from pipeline.embedder import Embedder
    from pipeline.generator import Generator
    from pipeline.precision_policy import LOAD_DTYPE
    from pipeline.reranker import Reranker
    from profiling.lib.inputs import cycled
    from profiling.lib.memory import MemoryProbe
    classes = {"embed": Embedder, "rerank": Reranker, "generate": Generator, "sentiment": SentimentClassifier,
               "toxicity": ToxicityClassifier}
    settings = Settings.from_env()
    torch.set_num_threads(thread_budget(settings.models.torch_threads))  # the budget a worker gives its models
    stage, variant, batch = job["stage"], job["variant"], job["batch"]
    probe = MemoryProbe()
    placement = Placement(select_device(settings.models.only_cpu), LOAD_DTYPE[variant], variant)
    model = classes[stage].load(source_building_standins(settings), placement)
    inputs, run, outputs_of = _workload(stage, model, job["queries"], job["max_new_tokens"])
    outputs = [o for start in range(0, len(inputs), batch) for o in outputs_of(inputs[start:start + batch])]
    run(inputs[:1])  # the fidelity pass warmed the batch shapes; this the one-item shape
    return {"one_ms": _times_ms(run, inputs[:1], job["repeat"]),
            "batch_ms": _times_ms(run, cycled(inputs, batch), job["repeat"]),
            "peak_rss_mib": probe.peak_mib() if probe.resettable else math.nan,
            "model_mib": _model_mib(model.model), "outputs": outputs}
