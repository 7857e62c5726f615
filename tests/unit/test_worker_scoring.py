"""services/roles/worker/request_path.py's methods beyond the answer: Worker.rerank and
Worker.moderate through their stages (the models' own results, in the documents' order), and an
answer's log probabilities: the same alone and among 7 other requests, bit for bit, one per answer
token, changing nothing else of the reply."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline import spec
from pipeline.spec import Stage
from services.server.answer_request import AnswerRequest
from services.server.deadline import Deadline
from services.server.stream_response import collect as collect_answer
from tests.unit.test_request_path import QUERY

pytestmark = pytest.mark.timeout(600)


def collect(events) -> dict:
    """The final answer of a worker's stream, as JSON."""
    return collect_answer(events).wire()


def test_rerank_gives_each_documents_score_in_the_documents_order_through_the_rerank_stage(worker, reranker):
    from services.roles.worker.stage_clock import collect_stage_times
    times = collect_stage_times()
    documents = ["Parcels to Canada take ten days.", "Refunds are issued within 5 business days.", "Reset it."]
    scores = worker.rerank("Where is my refund?", documents, Deadline.after(60))
    assert scores == pytest.approx(reranker.score_pairs([("Where is my refund?", d) for d in documents]), abs=1e-5)
    assert worker.stats()[Stage.RERANK].summary()["items"] >= 1 and "rerank" in times


def test_moderate_gives_each_texts_label_scores_through_the_toxicity_stage(worker, toxicity):
    texts = ["Thanks, it arrived.", "word " * 300]
    scores = worker.moderate(texts, Deadline.after(60))
    expected = toxicity.label_scores(texts)
    assert [list(s) for s in scores] == [list(e) for e in expected]
    assert all(s == pytest.approx(e, abs=1e-5) for s, e in zip(scores, expected))
    assert worker.stats()[Stage.TOXICITY].summary()["items"] >= 2


def test_an_answers_log_probabilities_are_the_same_alone_and_among_7_others(worker):
    asked = AnswerRequest("lp-alone", QUERY, max_new_tokens=12, logprobs=3)
    alone = collect(worker.answer(asked, Deadline.after(300)))
    plain = collect(worker.answer(AnswerRequest("lp-plain", QUERY, max_new_tokens=12), Deadline.after(300)))
    content = alone["logprobs"]
    assert "logprobs" not in plain and alone["generated_response"] == plain["generated_response"]
    assert len(content) == alone["usage"]["completion_tokens"] and all(len(c["top_logprobs"]) == 3 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] == c["logprob"] for c in content)  # greedy: the likeliest token
    others = [AnswerRequest("lp-among", QUERY, max_new_tokens=12, logprobs=3),
              *(AnswerRequest(f"lp-{i}", q, max_new_tokens=8 + i, temperature=0.7, seed=i, logprobs=i % 2 or None)
                for i, q in enumerate(spec.REFERENCE_QUERIES[:7]))]
    with ThreadPoolExecutor(len(others)) as pool:
        replies = list(pool.map(lambda request: collect(worker.answer(request, Deadline.after(300))), others))
    assert replies[0]["logprobs"] == content and replies[0]["generated_response"] == alone["generated_response"]


def test_a_streamed_answers_pieces_carry_the_log_probabilities_of_their_own_tokens(worker):
    from services.server.answer import AnswerPiece, FinalAnswer
    events = list(worker.answer(AnswerRequest("lp-pieces", QUERY, max_new_tokens=12, logprobs=2), Deadline.after(300)))
    *pieces, final = events
    assert isinstance(final, FinalAnswer) and all(isinstance(p, AnswerPiece) for p in pieces)
    given = [item for piece in pieces for item in piece.logprobs]
    assert tuple(given) == final.logprobs and len(given) == final.usage.completion_tokens
    assert all(piece.logprobs for piece in pieces if piece.text) and len([p for p in pieces if p.text]) > 1
    plain = list(worker.answer(AnswerRequest("lp-no-pieces", QUERY, max_new_tokens=12), Deadline.after(300)))
    assert all(not piece.logprobs for piece in plain[:-1]) and plain[-1].logprobs is None
