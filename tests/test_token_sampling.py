"""The inverse-CDF token draw that replaces ``torch.multinomial`` in the build's sampled ``generate``."""

from __future__ import annotations

import pytest
import torch

from slimserve.compression.generator_data import Sampling, generate
from slimserve.compression.token_sampling import InverseCdfDraw, sampling_processors
from slimserve.models.teacher import load_teacher


def _drawn(processors, scores: torch.Tensor, draws: int) -> torch.Tensor:
    """Token counts of ``draws`` draws from each row of ``scores``."""
    counts = torch.zeros_like(scores)
    ids = torch.zeros((len(scores), 1), dtype=torch.long)
    for _ in range(draws):
        out = processors(ids, scores.clone())
        assert torch.isfinite(out).sum(-1).tolist() == [1] * len(scores)  # one token left per row
        counts.scatter_add_(-1, out.argmax(-1, keepdim=True), torch.ones(len(scores), 1))
    return counts


def test_draws_follow_the_tempered_distribution_and_never_a_token_of_probability_zero():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")], [0.0, 0.0, 3.0, float("-inf"), 1.0]])
    draws, temperature = 6000, 0.7
    counts = _drawn(sampling_processors(temperature), logits, draws)
    expected = torch.softmax(logits / temperature, dim=-1) * draws
    assert counts[0, 4] == 0 and counts[1, 3] == 0
    # Pearson's chi-square over the tokens that can be drawn: far below what a wrong distribution gives
    possible = expected > 0
    chi2 = float(((counts - expected)[possible] ** 2 / expected[possible]).sum())
    assert chi2 < 30, (counts, expected)


def test_the_nucleus_keeps_only_the_most_likely_tokens():
    torch.manual_seed(1)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    counts = _drawn(sampling_processors(1.0, top_p=0.7), logits, 2000)
    assert counts[0, 2:].sum() == 0 and counts[0, 0] > counts[0, 1] > 0  # 0.5 + 0.3 covers 0.7


def test_a_draw_is_seeded_by_torch():
    scores = torch.randn(4, 50)
    ids = torch.zeros((4, 1), dtype=torch.long)
    torch.manual_seed(5)
    first = InverseCdfDraw()(ids, scores).argmax(-1)
    torch.manual_seed(5)
    assert torch.equal(InverseCdfDraw()(ids, scores).argmax(-1), first)
    with pytest.raises(ValueError, match="temperature"):
        sampling_processors(0.0)


def test_sampled_generate_is_seeded_and_not_greedy():
    model = load_teacher("tiny", seed=0).model
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    sampled = Sampling(12, temperature=1.5, seed=3)
    first = generate(model, prompts, sampled, [1], batch_size=2).responses
    assert generate(model, prompts, sampled, [1], batch_size=2).responses == first
    greedy = generate(model, prompts, Sampling(12), [1], batch_size=2).responses
    other = generate(model, prompts, Sampling(12, temperature=1.5, seed=4), [1], batch_size=2).responses
    assert first != greedy and first != other and all(1 <= len(r) <= 12 for r in first)
