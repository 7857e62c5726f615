"""The oracle: the seven stages in one process, one request at a time (`python -m pipeline.reference
[QUERY ...]`). Each model runs in the placement the service gives it for the same settings, so batching,
continuous batching and distribution are checked against the same arithmetic."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, fields

from pipeline import spec
from pipeline.config import ConfigError, Settings
from pipeline.continuous.output import Completion
from pipeline.conversation import HISTORY_TOKENS, NONE, Conversation, fit, retrieval_query
from pipeline.data_version import manifest_path, read_manifest, serving_params, version_dir_of
from pipeline.docstore import DocumentStore
from pipeline.generator import GenerationRequest
from pipeline.models import ModelSource, resolve_model_source
from pipeline.reranker import RerankRequest
from pipeline.sampling_params import Sampling
from pipeline.stages import Stages
from pipeline.vector_index import ShardedVectorIndex, VectorIndex


def open_index(settings: Settings) -> VectorIndex | ShardedVectorIndex:
    """The whole index as the index nodes serve it: every shard's file, at NPROBE / EF_SEARCH where set, else
    at the values its data version's manifest records (what its recall was measured or tuned at)."""
    nprobe, ef_search = settings.index.nprobe, settings.index.ef_search
    directory = version_dir_of(settings.index.faiss_index_path)
    if manifest_path(directory).is_file():
        nprobe, ef_search = serving_params(read_manifest(directory), nprobe, ef_search)
    return ShardedVectorIndex.load(settings.require_index_files(), nprobe=nprobe, mmap=settings.index.faiss_mmap,
                                   ef_search=ef_search)


@dataclass
class ReferencePipeline(Stages):
    """A worker's stages plus the FAISS index and the document store themselves (a worker asks the index
    nodes instead, and fetches from the data version its request holds)."""
    index: VectorIndex | ShardedVectorIndex
    store: DocumentStore
    history_tokens: int = HISTORY_TOKENS  # MAX_HISTORY_TOKENS: a conversation's share of the prompt

    @classmethod
    def from_settings(cls, settings: Settings, source: ModelSource | None = None) -> "ReferencePipeline":
        source = source or resolve_model_source(settings)
        index = open_index(settings)
        store = DocumentStore(settings.require_documents())
        stages = Stages.load(settings, source)  # the service's placement_for, per stage
        return cls(index=index, store=store, history_tokens=settings.limits.max_history_tokens,
                   **{f.name: getattr(stages, f.name) for f in fields(stages)})

    def retrieve(self, query: str):
        ids, _ = self.index.search(self.embedder.embed([query]), spec.TOP_K)
        return self.store.fetch_batch([ids[0].tolist()])[0]

    def completion(self, query: str, max_new_tokens: int | None = None, stop: tuple[str, ...] = (),
                   conversation: Conversation = NONE) -> Completion:
        """The LLM's answer to the query (the latest user turn, after `conversation`), greedy: its text
        and finish reason, by the service's output processor."""
        fitted = fit(conversation, self.generator.count_tokens, self.history_tokens).conversation
        searched = retrieval_query(query, fitted.history)
        documents = self.retrieve(searched)
        ranked = self.reranker.rerank([RerankRequest(searched, tuple(documents))])[0]
        request = GenerationRequest(query, tuple(s.document for s in ranked), max_new_tokens,
                                    Sampling(stop=stop) if stop else None, conversation=fitted or None)
        return self.generator.completions([request])[0]

    def answer(self, query: str, request_id: str = "", conversation: Conversation = NONE) -> dict:
        response = self.completion(query, conversation=conversation).text
        return spec.answer_json(request_id, response, self.sentiment.classify([response])[0],
                                self.toxicity.classify([response])[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queries", nargs="*", help="queries to answer (default: the reference client's eight)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        pipeline = ReferencePipeline.from_settings(Settings.from_env())
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    for i, query in enumerate(args.queries or spec.REFERENCE_QUERIES):
        answer = pipeline.answer(query, request_id=f"ref-{i}")
        if args.json:
            print(json.dumps(answer), flush=True)
        else:
            print(f"\nQ: {query}\nA: {answer['generated_response']!r}\n"
                  f"   sentiment={answer['sentiment']} is_toxic={answer['is_toxic']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
