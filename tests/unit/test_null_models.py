"""MODEL_SOURCE=null, the measurement mode: the source resolved only with the stand-ins' tokenizers there and
announced loudly, each null stage's output well-formed, and the real continuous engine over the null LM."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline import spec
from pipeline.config import Settings
from pipeline.continuous import ContinuousEngine
from pipeline.continuous.output import Finish
from pipeline.docstore import Document
from pipeline.generator import GenerationRequest
from pipeline.models import ModelsMissing, resolve_model_source
from pipeline.null_models import NULL_ANSWER, NullCausalLM
from pipeline.reranker import RerankRequest
from pipeline.stages import Stages
from tests.helpers import TEST_ENV


@pytest.fixture(scope="module")
def null_settings(model_source) -> Settings:
    return Settings.from_env({**TEST_ENV, "MODEL_SOURCE": "null", "STANDIN_HOME": str(model_source.cache_dir.parent)})


@pytest.fixture(scope="module")
def null_stages(null_settings) -> Stages:
    return Stages.load(null_settings, resolve_model_source(null_settings))


def test_null_source_reads_the_standins_and_is_announced_loudly(null_settings, caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.models"):
        source = resolve_model_source(null_settings)
    assert (source.kind, source.describe(), source.is_null, source.is_standin) == ("null", "null:tiny", True, False)
    assert any("NULL MODELS, A MEASUREMENT MODE" in r.getMessage() for r in caplog.records)


def test_null_source_without_standins_names_the_build_command(tmp_path):
    settings = Settings.from_env({**TEST_ENV, "MODEL_SOURCE": "null", "STANDIN_HOME": str(tmp_path)})
    with pytest.raises(ModelsMissing, match=r"MODEL_SOURCE=null: .*python -m builders.standins --profile tiny"):
        resolve_model_source(settings)


def test_every_null_stage_says_it_is_null_where_health_shows_devices(null_stages):
    assert set(null_stages.devices().values()) == {"cpu/null"}
    assert list(null_stages.devices()) == list(spec.MODEL_STAGES)


def test_null_embeddings_are_unit_vectors_of_the_index_dimension_one_per_text(null_stages):
    texts = ["Where is my order?", "How do I return an item?", "Where is my order?"]
    vectors = null_stages.embedder.embed(texts)
    assert vectors.shape == (3, spec.EMBED_DIM) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2]) and not np.array_equal(vectors[0], vectors[1])
    assert [v.shape for v in null_stages.embedder(texts[:2])] == [(spec.EMBED_DIM,)] * 2


def test_null_rerank_keeps_retrieval_order_and_classifiers_give_contract_labels(null_stages):
    docs = tuple(Document(i, f"title {i}", f"content {i}", "faq") for i in (7, 3, 9))
    ranked = null_stages.reranker.rerank([RerankRequest("q", docs), RerankRequest("r", docs[:1])])
    assert [[s.document.doc_id for s in r] for r in ranked] == [[7, 3, 9], [7]]
    assert all(isinstance(s.score, float) for r in ranked for s in r)
    assert null_stages.sentiment(["a", "b"]) == ["neutral", "neutral"]
    assert set(null_stages.toxicity(["a"])) <= set(spec.TOXIC_FLAGS)


def test_the_real_engine_runs_the_null_lm_to_each_cap_with_the_null_answer(null_stages):
    generator = null_stages.generator
    engine = ContinuousEngine(generator, max_batch=4, kv_cache_tokens=4096)
    null_stages.warm_up(engine)
    caps = [5, 12, 40]
    seqs = [engine.add(GenerationRequest(q, (), max_new_tokens=cap)) for q, cap in zip(spec.REFERENCE_QUERIES, caps)]
    while engine.has_work():
        assert not engine.step().failed
    assert [len(s.generated) for s in seqs] == caps
    assert all(engine.finish_of(s) == Finish.LENGTH for s in seqs)
    text = generator.completion(seqs[2].generated).text
    assert text and set(text.split()) <= set(NULL_ANSWER.split()) | {""}  # words of the null answer only


def test_a_null_lm_row_does_not_depend_on_its_batch_mates(null_stages):
    def run(queries):
        engine = ContinuousEngine(null_stages.generator, max_batch=4, kv_cache_tokens=4096)
        seqs = [engine.add(GenerationRequest(q, (), max_new_tokens=9)) for q in queries]
        while engine.has_work():
            engine.step()
        return [s.generated for s in seqs]

    alone = run(spec.REFERENCE_QUERIES[:1])[0]
    assert run(spec.REFERENCE_QUERIES[:4])[0] == alone


def test_null_lm_logits_are_each_rows_one_hot_answer_token_in_a_fresh_tensor():
    import torch
    lm = NullCausalLM([5, 2, 9], vocab_size=16, generation_config=None)
    positions = torch.tensor([[0, 1], [3, 4], [7, 8]])  # last positions 1, 4, 8: answer tokens 2, 2, 9
    first = lm(input_ids=None, position_ids=positions).logits
    assert first.shape == (3, 1, 16) and first.dtype == torch.float32
    expected = torch.zeros(3, 1, 16)
    expected[[0, 1, 2], 0, [2, 2, 9]] = 1.0
    assert torch.equal(first, expected)
    first.fill_(7.0)  # the engine penalizes logits in place: the next call must not see it
    assert torch.equal(lm(input_ids=None, position_ids=positions).logits, expected)


def test_null_lm_refuses_answer_ids_outside_its_vocabulary():
    with pytest.raises(ValueError, match="below the vocabulary"):
        NullCausalLM([1, 70], vocab_size=64, generation_config=None)
