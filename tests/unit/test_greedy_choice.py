"""pipeline.kernels.greedy_choice: each row's token is what the torch ops give (a float copy, transformers'
repetition penalty by gather/where/scatter, torch's argmax), ties, NaNs and penalized blocks included, alone and
among other rows; and the token chooser takes it only for rows that are plain greedy."""
import pytest
import torch

from pipeline.continuous.sampling import TokenChooser, penalized
from pipeline.kernels import greedy_choice
from pipeline.sampling_params import Sampling
from tests.support.extensions import built_ops

QWEN_VOCAB = 151936


@pytest.fixture(scope="module")
def greedy_tokens():
    built_ops(greedy_choice.EXTENSION, "no AVX2: the token chooser runs torch's ops on this CPU")
    return greedy_choice.EXTENSION.registered("greedy_tokens")


def torch_tokens(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> list[int]:
    """The torch ops' penalty (test_runner checks it against transformers' processor) on a float copy, then torch's
    own argmax."""
    return penalized(logits.to(torch.float32, copy=True), seen, penalty).argmax(dim=-1).tolist()


def random_case(rows: int, vocab: int, width: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    # seen tokens drawn mostly from the largest logits (the penalty decides the token) and some anywhere, repeated
    top = logits.float().topk(8, dim=-1).indices
    anywhere = torch.randint(0, vocab, (rows, width - 16), generator=g)
    seen = torch.cat([top, anywhere, top], dim=1)
    return logits, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("penalty", [1.0, 1.1, 1.3, 0.7])
@pytest.mark.parametrize("rows, vocab", [(1, QWEN_VOCAB), (8, QWEN_VOCAB), (5, 3000), (3, 1024), (2, 7)])
def test_each_rows_token_is_the_torch_ops_token(greedy_tokens, dtype, penalty, rows, vocab):
    width = 40 if vocab > 40 else 20
    for seed in range(3):
        logits, seen = random_case(rows, vocab, width, dtype, seed) if vocab > 40 else (
            (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype),
            torch.randint(0, vocab, (rows, width), generator=torch.Generator().manual_seed(seed)))
        assert greedy_tokens(logits, seen, penalty).tolist() == torch_tokens(logits, seen, penalty)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_go_to_the_first_index_penalized_or_not(greedy_tokens, dtype):
    vocab = 4096
    logits = torch.zeros(6, vocab, dtype=dtype)
    seen = torch.zeros(6, 2, dtype=torch.long)
    # row 0: the largest twice, in two blocks; row 1: twice in one block
    logits[0, [3000, 1500]] = 5.0
    logits[1, [700, 300]] = 5.0
    # row 2: a seen 6.25 penalized to 5.0 (p = 1.25, exact) ties an unseen 5.0 after it: the seen one, first, wins
    logits[2, 100], logits[2, 2000] = 6.25, 5.0
    seen[2] = torch.tensor([100, 100])
    # row 3: the same tie with the unseen one first
    logits[3, 100], logits[3, 2000] = 5.0, 6.25
    seen[3] = torch.tensor([2000, 2000])
    # row 4: every logit the same, 0 and 5 penalized below it: index 1; row 5: all -inf: index 0
    logits[4] = -1.0
    logits[5] = float("-inf")
    seen[4:] = torch.tensor([0, 5])
    expected = torch_tokens(logits, seen, 1.25)
    assert expected == [1500, 300, 100, 100, 1, 0]
    assert greedy_tokens(logits, seen, 1.25).tolist() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_first_nan_is_the_token_as_torchs_argmax_takes_it(greedy_tokens, dtype):
    vocab = 5000
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(3)).to(dtype)
    seen = torch.randint(0, vocab, (5, 12), generator=torch.Generator().manual_seed(4))
    logits[0, [4000, 2500]] = float("nan")  # two blocks apart: the first
    logits[1, 3333] = float("nan")
    seen[1, 0] = 3333  # a seen NaN stays NaN under the penalty
    logits[2, 4999] = float("nan")  # in the last, short block
    logits[3, [10, 11]] = float("nan")
    logits[3, 0] = float("inf")
    seen[4, :] = 17
    logits[4, 17] = float("nan")  # in a penalized block
    expected = torch_tokens(logits, seen, 1.2)
    assert expected == [2500, 3333, 4999, 10, 17]
    assert greedy_tokens(logits, seen, 1.2).tolist() == expected


def test_a_rows_token_is_the_same_alone_and_among_others_and_from_strided_views(greedy_tokens):
    logits, seen = random_case(7, QWEN_VOCAB, 64, torch.bfloat16, seed=9)
    together = greedy_tokens(logits, seen, 1.1).tolist()
    assert together == [greedy_tokens(logits[i:i + 1], seen[i:i + 1], 1.1).item() for i in range(7)]
    # the runner's shapes: the last position of (rows, positions, vocab) logits, seen a slice of a wider table
    wide = torch.zeros(7, 3, QWEN_VOCAB, dtype=torch.bfloat16)
    wide[:, -1] = logits
    table = torch.zeros(9, 100, dtype=torch.long)
    table[:7, :64] = seen
    assert greedy_tokens(wide[:, -1, :], table[:7, :64], 1.1).tolist() == together


def test_a_seen_token_outside_the_vocabulary_is_refused(greedy_tokens):
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        greedy_tokens(torch.zeros(1, 10), torch.tensor([[3, 10]]), 1.1)


class Row:
    def __init__(self, sampling=None):
        self.sampling, self.logprob, self.stream = sampling, None, torch.Generator().manual_seed(0)


def test_the_chooser_takes_the_kernel_only_where_every_row_is_plain_greedy(greedy_tokens, monkeypatch):
    chooser = TokenChooser(1.1)
    calls = []

    def counted(*args):
        calls.append(args)
        return greedy_tokens(*args)

    monkeypatch.setattr(greedy_choice.EXTENSION, "registered", {"greedy_tokens": counted}.get)
    logits, seen = random_case(4, 9000, 32, torch.bfloat16, seed=5)
    expected = torch_tokens(logits, seen, 1.1)
    greedy = Sampling(temperature=0.0)
    assert chooser.choose(logits, seen, [Row(), Row(greedy), Row(), Row()]) == expected
    assert len(calls) == 1
    # a row asking for log probabilities, or sampling, takes the torch ops; the greedy rows' tokens are the same
    logprobs = Row(Sampling(temperature=0.0, logprobs=2))
    assert chooser.choose(logits, seen, [Row(), logprobs, Row(), Row()]) == expected
    assert logprobs.logprob is not None and logprobs.logprob.token == expected[1]
    sampled = chooser.choose(logits, seen, [Row(), Row(), Row(Sampling(temperature=0.8, seed=1)), Row()])
    assert [sampled[i] for i in (0, 1, 3)] == [expected[i] for i in (0, 1, 3)]
    assert len(calls) == 1
