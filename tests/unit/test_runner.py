"""pipeline/continuous/runner.py: the batched repetition penalty is the reference processor's, row by row."""
from __future__ import annotations

import pytest

from pipeline.continuous.slots import SlotRule
from pipeline.kernels.chunked_attention import CHUNK
from tests.support.extensions import built_ops


@pytest.mark.parametrize("kernel", [True, False], ids=["greedy-kernel", "torch-ops"])
def test_batched_repetition_penalty_equals_the_reference_processor_per_row(kernel, monkeypatch):
    """The scores bit for bit (the torch ops the sampled rows take), and every greedy row's token, through
    pipeline.kernels.greedy_choice where built and through the torch ops."""
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from pipeline.continuous.runner import ModelRunner
    from pipeline.continuous.sampling import penalized
    from pipeline.kernels.greedy_choice import EXTENSION
    if kernel:
        built_ops(EXTENSION, "no AVX2: every row takes the torch ops on this CPU")
    else:
        monkeypatch.setattr(EXTENSION, "ops", lambda: None)
    runner = ModelRunner(None, SlotRule(1, CHUNK, CHUNK), repetition_penalty=1.1)
    processor = RepetitionPenaltyLogitsProcessor(1.1)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen) * 4
    rows = [[5, 7, 5, 9], [1, 2], [3, 3, 3, 40, 41, 0]]  # repeats, ragged, token 0 seen only by row 2
    width = max(map(len, rows))
    # padded on the right with each row's first token, as the runner's seen tensor is
    seen = torch.tensor([row + [row[0]] * (width - len(row)) for row in rows])
    expected = [int(processor(torch.tensor([row]), logits[i:i + 1].clone()).argmax()) for i, row in enumerate(rows)]
    scores = torch.cat([processor(torch.tensor([row]), logits[i:i + 1].clone()) for i, row in enumerate(rows)])
    assert runner._choose(logits.clone(), seen) == expected
    assert runner._choose(logits.bfloat16(), seen) == [int(processor(torch.tensor([row]), logits[i:i + 1].bfloat16()
                                                                     .float()).argmax()) for i, row in enumerate(rows)]
    assert torch.equal(penalized(logits.clone(), seen, 1.1), scores)  # the same scores, bit for bit


def test_a_sequence_cancelled_outside_inference_mode_leaves_its_slot_and_the_others_answer_as_alone(
        generator, reference_texts):
    """The generate stage cancels (a reader gone, a stop string) outside any inference mode; the slot
    table's K/V buffers are inference tensors (written in the engine's step), and the last row's move
    into the freed slot must still happen there."""
    from pipeline.continuous import ContinuousEngine
    from tests.helpers import engine_requests
    requests = engine_requests()[1]
    engine = ContinuousEngine(generator, max_batch=4, kv_cache_tokens=4096)
    first, second = engine.add(requests[0]), engine.add(requests[1])
    while len(second.generated) < 2:
        engine.step()
    engine.cancel(first)  # slot 0 of two: the last row moves into it
    while engine.has_work():
        engine.step()
    assert generator.completion(second.generated).text == reference_texts[1]
