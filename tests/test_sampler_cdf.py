"""Random rows without a seed draw by inverting their CDF (`draw_by_cdf`); seeded rows keep the
exponential race. Frequencies are checked against the probabilities within 5 standard deviations
of a binomial count (a false alarm ~1 in 10^6 per entry); zero-probability entries must never be
drawn (tolerance 0)."""
from dataclasses import dataclass, field

import pytest
import torch

from tokenmill.sampling_params import SamplingParams
from tokenmill.worker.sampler import CDF_BLOCK, Sampler, draw_by_cdf


def assert_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    n = tokens.numel()
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / n
    p = probs.double()
    assert freq[p == 0].sum() == 0
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12).all()


@pytest.mark.parametrize("vocab", [5, CDF_BLOCK, CDF_BLOCK + 1, 2 * CDF_BLOCK + 17])
def test_draws_follow_the_probabilities(vocab):
    torch.manual_seed(vocab)
    probs = torch.zeros(vocab)
    support = torch.randperm(vocab)[:5]
    probs[support] = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])
    tokens = draw_by_cdf(probs.expand(30_000, -1).contiguous())
    assert tokens.dtype == torch.int64 and tokens.shape == (30_000,)
    assert_frequencies(tokens, probs)


def test_rows_are_drawn_from_their_own_distribution():
    """Mass at the very ends of the vocabulary and of a block; a one-hot row; a flat row."""
    torch.manual_seed(1)
    V = 2 * CDF_BLOCK + 3
    rows = torch.zeros(4, V)
    rows[0, [0, V - 1]] = torch.tensor([0.25, 0.75])
    rows[1, [CDF_BLOCK - 1, CDF_BLOCK]] = 0.5
    rows[2, 7] = 1.0
    rows[3] = 1.0 / V
    tokens = draw_by_cdf(rows.repeat(20_000, 1)).view(20_000, 4)
    for i in range(4):
        assert_frequencies(tokens[:, i], rows[i])


@dataclass
class Req:
    request_id: str
    params: SamplingParams
    prompt_token_ids: list = field(default_factory=list)
    output_token_ids: list = field(default_factory=list)
    eos_token_id: int | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def test_seeded_rows_keep_the_race_beside_unseeded_ones():
    """A seeded row's token is the race over its own generator whatever rows sit beside it."""
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(3))
    seeded = Req("s", SamplingParams(temperature=0.8, seed=11))
    alone = Sampler(300)._sample(logits[1:2], [seeded])
    mixed = Sampler(300)._sample(logits, [Req("a", SamplingParams(temperature=0.8)), Req("s", seeded.params),
                                          Req("b", SamplingParams(temperature=0.8, top_k=5))])
    assert mixed[1] == alone[0]
    top5 = logits[2].topk(5).indices
    assert mixed[2] in top5
