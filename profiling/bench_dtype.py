"""How often bfloat16 answers differ from float32 answers on the reference queries.

    python -m profiling.bench_dtype [--queries 8] [--out DIR]

Runs each model stage in float32 and in bfloat16 on the same inputs (the eight
reference queries with support documents) and reports, per stage, how many
outputs are identical, and for the LLM the first token where they part. With
stand-ins (random weights) this measures numeric drift, not answer quality.
"""
from __future__ import annotations

import argparse
import json
import time

from builders.corpus import support_documents
from pipeline import spec
from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
from pipeline.device import Placement, select_device
from pipeline.generator import GenerationRequest, Generator
from pipeline.reranker import Reranker, RerankRequest
from profiling.lib.cli import add_out, make_parser
from profiling.lib.models import worker_settings
from profiling.lib.provenance import local_record
from profiling.lib.report import run_folder, write_json


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def parser() -> argparse.ArgumentParser:
    p = make_parser("python -m profiling.bench_dtype", __doc__)
    p.add_argument("--queries", type=int, default=8, help="reference queries compared (at most the SPEC's eight)")
    add_out(p, "bench_dtype")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings, source = worker_settings()
    device = select_device(settings.models.only_cpu)
    queries = list(spec.REFERENCE_QUERIES[: args.queries])
    docs = list(support_documents(200, seed=0))
    rerank_requests = [RerankRequest(q, tuple(docs[10 * i: 10 * i + 10])) for i, q in enumerate(queries)]
    report: dict = {"model_source": source.describe(), "queries": len(queries)}
    outputs: dict = {}
    for dtype in ("float32", "bfloat16"):
        placement = Placement(device, dtype)
        started = time.monotonic()
        reranker = Reranker.load(source, placement)
        ranked = reranker.rerank(rerank_requests)
        del reranker
        generator = Generator.load(source, placement)
        gen_requests = [GenerationRequest(q, tuple(s.document for s in r)) for q, r in zip(queries, ranked)]
        ids = [generator.generate_ids([generator.prompt(r.query, r.documents)])[0] for r in gen_requests]
        texts = [generator.tokenizer.decode(x, skip_special_tokens=True) for x in ids]
        del generator
        sentiment = SentimentClassifier.load(source, placement).classify(texts)
        toxicity = ToxicityClassifier.load(source, placement).classify(texts)
        outputs[dtype] = {"order": [[s.document.doc_id for s in r] for r in ranked], "ids": ids, "texts": texts,
                          "sentiment": sentiment, "toxicity": toxicity, "seconds": time.monotonic() - started}
        print(f"{dtype}: {outputs[dtype]['seconds']:.1f}s", flush=True)
    a, b = outputs["float32"], outputs["bfloat16"]
    report["rerank_order_identical"] = sum(x == y for x, y in zip(a["order"], b["order"]))
    report["rerank_top3_identical"] = sum(x[:3] == y[:3] for x, y in zip(a["order"], b["order"]))
    report["answers_identical"] = sum(x == y for x, y in zip(a["texts"], b["texts"]))
    report["first_differing_token"] = [first_difference(x, y) for x, y in zip(a["ids"], b["ids"])]
    report["sentiment_identical"] = sum(x == y for x, y in zip(a["sentiment"], b["sentiment"]))
    report["toxicity_identical"] = sum(x == y for x, y in zip(a["toxicity"], b["toxicity"]))
    report["seconds"] = {k: round(v["seconds"], 1) for k, v in outputs.items()}
    print(json.dumps(report, indent=2))
    report["provenance"] = local_record()
    path = write_json(run_folder("bench_dtype", args.out) / "bench_dtype.json", report)
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
