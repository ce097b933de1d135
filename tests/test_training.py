"""Training pieces: losses, the cached-bottom split scorer, and a trainer that resumes exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slimserve.compression.batches import batch_indices, pad_right
from slimserve.compression.losses import distill_loss, label_loss
from slimserve.compression.split_scorer import HiddenCache, SplitScorer, graph_logits, top_logits
from slimserve.compression.trainer import TrainConfig, train
from slimserve.export.pipeline import parity_prompts
from slimserve.export.scorer_graph import ScorerGraph
from slimserve.export.teacher import load_teacher
from slimserve.tokenization import PromptTokenizer


def test_label_loss_is_cross_entropy_on_yes_no():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([1, 0])
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0))) / 2
    assert float(label_loss(logits, labels)) == pytest.approx(expected, rel=1e-6)


def test_distill_loss():
    logits = torch.tensor([[1.0, -1.0], [0.5, 0.2]])
    assert float(distill_loss(logits, logits, temperature=2.0)) == pytest.approx(0.0, abs=1e-7)
    assert float(distill_loss(logits, logits.flip(1), temperature=2.0)) > 0
    unlabelled = torch.tensor([-1, -1])
    assert float(distill_loss(logits, logits, 2.0, unlabelled, label_weight=0.5)) == pytest.approx(
        0.0, abs=1e-7
    )
    mixed = distill_loss(logits, logits, 1.0, torch.tensor([1, -1]), label_weight=0.5)
    assert float(mixed) == pytest.approx(0.5 * float(label_loss(logits[:1], torch.tensor([1]))), rel=1e-6)


def test_batches_cover_every_index_once():
    lengths = np.random.default_rng(0).integers(10, 200, size=103)
    for shuffle in (False, True):
        batches = batch_indices(lengths, 8, shuffle=shuffle, seed=3)
        assert sorted(np.concatenate(batches).tolist()) == list(range(103))
    assert [b.tolist() for b in batch_indices(lengths, 8, shuffle=True, seed=3)] == [
        b.tolist() for b in batch_indices(lengths, 8, shuffle=True, seed=3)
    ]


@pytest.fixture(scope="module")
def tiny_graph():
    loaded = load_teacher("tiny", seed=1)
    tokenizer = PromptTokenizer(loaded.tokenizer_file, max_length=320)
    graph = ScorerGraph(loaded.model, tokenizer.token_id(" Yes"), tokenizer.token_id(" No")).eval()
    return graph, tokenizer.encode(parity_prompts(10))


def test_split_scorer_matches_the_full_graph(tiny_graph):
    graph, sequences = tiny_graph
    full = graph_logits(graph, sequences, batch_size=4)
    for cut in (0, 1):
        split = SplitScorer(graph, cut)
        cached = top_logits(split, HiddenCache(split, sequences, batch_size=3), batch_size=5)
        np.testing.assert_allclose(cached, full, atol=1e-3)  # float16 cache
    with pytest.raises(ValueError, match="cut"):
        SplitScorer(graph, 7)


def _fit(parameter: torch.nn.Parameter, config: TrainConfig, checkpoint=None, fail_at: int | None = None):
    target = torch.tensor([3.0, -2.0])
    calls = {"n": 0}

    def plan(epoch: int):
        return [epoch * 100 + i for i in range(6)]

    def loss_fn(payload):
        calls["n"] += 1
        if fail_at is not None and calls["n"] == fail_at:
            raise KeyboardInterrupt("simulated crash")
        return ((parameter - target * (1 + payload % 3)) ** 2).sum()

    return train([parameter], plan, loss_fn, config, checkpoint, desc="test")


def test_trainer_resumes_exactly_after_an_interruption(tmp_path):
    config = TrainConfig(epochs=2, batch_size=1, grad_accum=2, lr=0.1, checkpoint_every=2, warmup_ratio=0.2)
    reference = torch.nn.Parameter(torch.zeros(2))
    _fit(reference, config)

    resumed = torch.nn.Parameter(torch.zeros(2))
    checkpoint = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        _fit(resumed, config, checkpoint, fail_at=10)  # step 5 of 6: the step-4 checkpoint exists
    assert checkpoint.is_file()
    resumed.data.zero_()  # a new process starts from the stage's input again
    report = _fit(resumed, config, checkpoint)
    assert report.resumed_from_step == 4 and not checkpoint.exists()
    torch.testing.assert_close(resumed.data, reference.data)


def test_trainer_keeps_the_weights_of_the_best_validation_epoch():
    parameter = torch.nn.Parameter(torch.zeros(2))
    scores = iter([0.5, 0.9, 0.7])  # epoch 2 is best; epoch 3 moves the weights on
    seen = []

    def validation_score() -> float:
        seen.append(parameter.detach().clone())
        return next(scores)

    def plan(epoch: int):
        return list(range(4))

    report = train(
        [parameter],
        plan,
        lambda _: ((parameter - torch.tensor([3.0, -2.0])) ** 2).sum(),
        TrainConfig(epochs=3, batch_size=1, lr=0.1, warmup_ratio=0.0),
        validation_score=validation_score,
    )
    assert report.epoch_scores == [0.5, 0.9, 0.7] and report.best_epoch == 2
    assert not torch.equal(seen[1], seen[2])
    torch.testing.assert_close(parameter.data, seen[1])


def test_pad_right():
    ids, mask = pad_right([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_a_stage_keeps_its_checkpoint_only_for_the_same_settings(tmp_path):
    from slimserve.buildstage import artifacts

    stage = tmp_path / "distill"
    artifacts.prepare_stage(stage, {"lr": 1})
    (stage / "checkpoint.pt").write_text("partial")
    artifacts.prepare_stage(stage, {"lr": 1})  # the same settings: resume
    assert (stage / "checkpoint.pt").exists()
    artifacts.prepare_stage(stage, {"lr": 2})  # changed upstream settings: start over
    assert not (stage / "checkpoint.pt").exists()
    assert not artifacts.is_done(stage, {"lr": 2})
    artifacts.mark_done(stage, {"lr": 2})
    assert artifacts.is_done(stage, {"lr": 2}) and not artifacts.is_done(stage, {"lr": 3})
