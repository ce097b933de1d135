"""Multi-item scoring: one member prefix, many items, each scored exactly as ``prefix + item`` alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from slimserve.bundle import PromptSplit
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.models.multi_item import MultiItemScorer
from slimserve.models.scorer_graph import ScorerGraph
from slimserve.models.teacher import default_tokenizer_file, load_teacher
from slimserve.prompts import render_item_suffix, render_member_prefix, render_scoring_prompt
from slimserve.scoring_tokens import encode_scoring, multi_item_requests
from slimserve.tokenization import PromptTokenizer, pad_batch, pad_multi_item

SPLIT = PromptSplit(prefix_max_tokens=192, item_max_tokens=128)


@pytest.fixture(scope="module")
def tokenizer():
    return PromptTokenizer(default_tokenizer_file(), max_length=320)


@pytest.fixture(scope="module")
def graphs(tokenizer):
    lm = load_teacher("tiny", seed=3).model
    graph = ScorerGraph(lm, tokenizer.token_id(" Yes"), tokenizer.token_id(" No")).eval()
    return graph, MultiItemScorer(graph).eval()


def single_scores(graph, sequences) -> np.ndarray:
    """The single-sequence graph on each sequence alone (no padding at all)."""
    with torch.no_grad():
        return np.array(
            [float(graph(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))) for s in sequences]
        )


def multi_scores(scorer, tokens_list, item_length=None) -> np.ndarray:
    arrays = pad_multi_item([t.prefix for t in tokens_list], [t.items for t in tokens_list], item_length)
    with torch.no_grad():
        return scorer(*(torch.from_numpy(a) for a in arrays)).numpy()


def mixed_candidates(count: int):
    items = example_candidates(count)
    items[1] = dataclasses.replace(items[1], description="A much longer description. " * 12)
    return items


def test_multi_item_equals_single_sequence_on_real_prompts(tokenizer, graphs):
    graph, scorer = graphs
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, mixed_candidates(9), SPLIT)
    assert len({len(i) for i in tokens.items}) > 1  # mixed lengths
    multi = multi_scores(scorer, [tokens], item_length=128)[0]
    np.testing.assert_allclose(multi, single_scores(graph, tokens.sequences()), atol=1e-5)


def test_v5_asks_the_question_once_and_older_bundles_keep_their_text(tokenizer):
    item = example_candidates(1)[0]
    prefix, suffix = render_member_prefix(EXAMPLE_MEMBER), render_item_suffix(EXAMPLE_MEMBER, item)
    assert prefix.endswith("Question: Will this member engage with the item below? Answer Yes or No.\n")
    assert "Question" not in suffix and suffix.endswith("Answer:")
    old_suffix = render_item_suffix(EXAMPLE_MEMBER, item, "scoring-v4")
    assert "Question: Will this member engage with this job?" in old_suffix
    assert "Question" not in render_member_prefix(EXAMPLE_MEMBER, "scoring-v4")
    whole = render_scoring_prompt(EXAMPLE_MEMBER, item, "scoring-v3")
    assert (
        whole
        == render_scoring_prompt(EXAMPLE_MEMBER, item, "scoring-v4")
        != render_scoring_prompt(EXAMPLE_MEMBER, item)
    )
    with pytest.raises(ValueError, match="unknown scoring template 'scoring-v9'"):
        render_member_prefix(EXAMPLE_MEMBER, "scoring-v9")
    items = example_candidates(4)
    new = encode_scoring(tokenizer, EXAMPLE_MEMBER, items, SPLIT)
    old = encode_scoring(tokenizer, EXAMPLE_MEMBER, items, SPLIT, "scoring-v4")
    assert len(new.prefix) > len(old.prefix)
    assert all(len(a) < len(b) for a, b in zip(new.items, old.items, strict=True))


def test_a_single_candidate(tokenizer, graphs):
    graph, scorer = graphs
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(1), SPLIT)
    np.testing.assert_allclose(
        multi_scores(scorer, [tokens])[0], single_scores(graph, tokens.sequences()), atol=1e-5
    )


def test_a_single_candidate_is_sent_folded(tokenizer, graphs):
    """One candidate: all its tokens but the last join the prefix, one item token, nothing padded."""
    graph, scorer = graphs
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(1), SPLIT)
    (request,) = multi_item_requests(tokens, (32, 64, 128), max_items=4)
    assert request.prefix_ids[0].tolist() == tokens.sequences()[0][:-1]
    assert request.item_ids.shape == (1, 1, 1)
    with torch.no_grad():
        score = scorer(*(torch.from_numpy(a) for a in request.arrays())).numpy()[0]
    np.testing.assert_allclose(score, single_scores(graph, tokens.sequences()), atol=1e-5)
    five = encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(5), SPLIT)
    runs = multi_item_requests(five, (32, 64, 128), max_items=4)  # the last run of one is folded too
    assert [r.item_ids.shape for r in runs] == [runs[0].item_ids.shape, (1, 1, 1)]
    assert runs[0].item_ids.shape[1:] != (1, 1) and runs[1].prefix_ids.shape[1] > len(five.prefix)


def test_members_of_different_prefix_lengths_in_one_batch(tokenizer, graphs):
    graph, scorer = graphs
    other = dataclasses.replace(EXAMPLE_MEMBER, id="m2", skills=("SQL",), history=())
    first = encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(5), SPLIT)
    second = encode_scoring(tokenizer, other, example_candidates(3, seed=7), SPLIT)
    assert len(first.prefix) != len(second.prefix)
    batched = multi_scores(scorer, [first, second])
    np.testing.assert_allclose(batched[0], single_scores(graph, first.sequences()), atol=1e-5)
    # the second member has fewer items: its padding rows are ignored
    np.testing.assert_allclose(batched[1, :3], single_scores(graph, second.sequences()), atol=1e-5)


def test_items_cannot_see_each_other(tokenizer, graphs):
    _, scorer = graphs
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(6), SPLIT)
    before = multi_scores(scorer, [tokens], item_length=128)[0]
    changed = list(tokens.items)
    changed[2] = [(t + 17) % 1000 + 1 for t in changed[2]]  # same length, other tokens
    after = multi_scores(scorer, [dataclasses.replace(tokens, items=changed)], item_length=128)[0]
    others = [i for i in range(6) if i != 2]
    np.testing.assert_allclose(after[others], before[others], atol=1e-6)
    assert abs(after[2] - before[2]) > 1e-6


def test_prefix_and_suffix_tokenization_follows_the_split(tokenizer):
    items = mixed_candidates(4)
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, items, SPLIT)
    (prefix,) = tokenizer.encode_within([render_member_prefix(EXAMPLE_MEMBER)], 192, add_special_tokens=True)
    assert tokens.prefix == prefix
    assert all(len(i) <= SPLIT.item_max_tokens for i in tokens.items)
    tight = encode_scoring(
        tokenizer, EXAMPLE_MEMBER, items, PromptSplit(prefix_max_tokens=40, item_max_tokens=30)
    )
    assert len(tight.prefix) == 40 and max(map(len, tight.items)) == 30
    # the answer cue survives truncation: the last tokens are those of the untruncated suffix
    assert all(t[-8:] == f[-8:] for t, f in zip(tight.items, tokens.items, strict=True))
    # whole-text templates (scoring-v3) have no prefix and tokenize each prompt as one text
    whole = encode_scoring(tokenizer, EXAMPLE_MEMBER, items, None)
    assert whole.prefix == [] and whole.items == tokenizer.encode(
        [render_scoring_prompt(EXAMPLE_MEMBER, i) for i in items]
    )


def test_requests_split_above_the_item_limit_and_pad_to_a_bucket(tokenizer):
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, mixed_candidates(10), SPLIT)
    requests = multi_item_requests(tokens, (32, 64, 128), max_items=4)
    assert [r.indices for r in requests] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    for request in requests:
        longest = max(len(tokens.items[i]) for i in request.indices)
        length = request.item_ids.shape[2]
        assert length in (32, 64, 128) and length >= longest
        assert request.prefix_ids.shape == (1, len(tokens.prefix)) and request.prefix_mask.all()
    with pytest.raises(ValueError, match="needs a member prefix"):
        multi_item_requests(encode_scoring(tokenizer, EXAMPLE_MEMBER, example_candidates(2), None), (64,), 4)


def test_pad_multi_item_rejects_empty_members():
    with pytest.raises(ValueError, match="non-empty prefix"):
        pad_multi_item([[]], [[[1, 2]]])
    with pytest.raises(ValueError, match="one item list per prefix"):
        pad_multi_item([[1]], [])


def test_unsupported_decoders_are_refused():
    graph = type("G", (), {})()
    graph.body = type("B", (), {"config": type("C", (), {"model_type": "gemma"})()})()
    with pytest.raises(ValueError, match="gemma"):
        MultiItemScorer(graph)


@pytest.mark.slow
def test_packaged_teacher_multi_item_equals_single_sequence(tokenizer, packaged_teacher):
    lm = packaged_teacher.model
    graph = ScorerGraph(lm, tokenizer.token_id(" Yes"), tokenizer.token_id(" No")).eval()
    tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, mixed_candidates(6), SPLIT)
    multi = multi_scores(MultiItemScorer(graph).eval(), [tokens], item_length=128)[0]
    single = single_scores(graph, tokens.sequences())
    np.testing.assert_allclose(multi, single, atol=1e-4)
    assert list(np.argsort(-multi)) == list(np.argsort(-single))
    ids, mask = pad_batch(tokens.sequences(), 320)
    with torch.no_grad():
        padded = graph(torch.from_numpy(ids), torch.from_numpy(mask)).numpy().ravel()
    np.testing.assert_allclose(multi, padded, atol=1e-4)
