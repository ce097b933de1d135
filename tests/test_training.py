"""Training pieces: losses, the cached-bottom split scorer (single-sequence and multi-item), member
batches, and a trainer that resumes exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slimserve.compression.batches import (
    MemberGroup,
    batch_indices,
    encode_member_groups,
    member_batches,
    merge_groups,
    multi_item_batch,
    pad_right,
)
from slimserve.compression.losses import distill_loss, label_loss
from slimserve.compression.split_scorer import (
    HiddenCache,
    MemberHiddenCache,
    SplitScorer,
    graph_logits,
    multi_item_logits,
    top_logits,
    top_logits_multi,
)
from slimserve.compression.trainer import TrainConfig, train
from slimserve.export.pipeline import parity_prompts
from slimserve.models.scorer_graph import ScorerGraph
from slimserve.models.teacher import load_teacher
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


def _member_groups(tokenizer, sizes=(4, 1, 6, 3, 2)):
    """Examples of several members (sizes examples each, members interleaved), grouped and tokenized."""
    from dataclasses import replace

    from slimserve.bundle import PromptSplit
    from slimserve.data.splits import Example
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.schema import Seniority

    items = example_candidates(10)
    members = [
        replace(
            EXAMPLE_MEMBER,
            id=f"m{k}",
            skills=EXAMPLE_MEMBER.skills[k:],
            history=EXAMPLE_MEMBER.history[: k % 4],
        )
        for k in range(len(sizes))
    ]
    members[1] = replace(members[1], seniority=Seniority.ENTRY, headline="Nurse")
    examples = [
        Example(members[k], items[(k + j) % len(items)], (k + j) % 2)
        for j in range(max(sizes))
        for k in range(len(sizes))
        if j < sizes[k]
    ]
    return examples, *encode_member_groups(examples, tokenizer, PromptSplit(192, 64))


@pytest.fixture(scope="module")
def tiny_groups():
    loaded = load_teacher("tiny", seed=1)
    tokenizer = PromptTokenizer(loaded.tokenizer_file, max_length=320)
    graph = ScorerGraph(loaded.model, tokenizer.token_id(" Yes"), tokenizer.token_id(" No")).eval()
    return graph, tokenizer, *_member_groups(tokenizer)


def test_member_groups_hold_exactly_the_scoring_tokens(tiny_groups):
    from slimserve.bundle import PromptSplit
    from slimserve.scoring_tokens import encode_scoring

    _, tokenizer, examples, groups, sequences = tiny_groups
    assert sorted(np.concatenate([g.indices for g in groups]).tolist()) == list(range(len(examples)))
    for group in groups:
        member = examples[group.indices[0]].member
        assert all(examples[i].member == member for i in group.indices)
        assert list(group.indices) == sorted(group.indices)  # order kept inside a group
        tokens = encode_scoring(
            tokenizer, member, [examples[i].item for i in group.indices], PromptSplit(192, 64)
        )
        assert (group.prefix, group.items) == (tokens.prefix, tokens.items)
        assert [sequences[i] for i in group.indices] == tokens.sequences()


def test_member_batches_cover_every_example_once_per_epoch():
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(1, 12, size=60)] + [40]  # one member above the batch size
    groups = [
        MemberGroup([1] * int(rng.integers(5, 30)), [[2] * int(rng.integers(3, 9))] * size, np.arange(size))
        for size in sizes
    ]
    for epoch, shuffle in ((0, False), (0, True), (1, True)):
        batches = member_batches(groups, 16, shuffle=shuffle, seed=epoch)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(groups)))
        for batch in batches:
            assert len(batch) == 1 or sum(sizes[g] for g in batch) <= 16
    again = member_batches(groups, 16, shuffle=True, seed=1)
    assert [b.tolist() for b in again] == [
        b.tolist() for b in member_batches(groups, 16, shuffle=True, seed=1)
    ]
    assert [b.tolist() for b in again] != [
        b.tolist() for b in member_batches(groups, 16, shuffle=True, seed=0)
    ]


def test_multi_item_batch_maps_outputs_back_to_examples(tiny_groups):
    _, _, _, groups, sequences = tiny_groups
    batch = multi_item_batch(groups, [2, 0, 1])
    assert batch.indices.tolist() == [*groups[2].indices, *groups[0].indices, *groups[1].indices]
    rows = batch.valid.nonzero().tolist()
    for (member, item), index in zip(rows, batch.indices, strict=True):
        prefix = batch.prefix_ids[member][batch.prefix_mask[member].bool()].tolist()
        suffix = batch.item_ids[member, item][batch.item_mask[member, item].bool()].tolist()
        assert prefix + suffix == sequences[index]


def test_merged_groups_share_one_prefix(tiny_groups):
    _, _, _, groups, _ = tiny_groups
    shifted = [g.shifted(100) for g in groups[:2]]
    merged = merge_groups(list(groups) + shifted)
    assert len(merged) == len(groups)
    assert merged[0].indices.tolist() == [*groups[0].indices, *(groups[0].indices + 100)]
    assert merged[0].items == groups[0].items * 2


def test_multi_item_logits_equal_the_single_sequence_graph(tiny_groups):
    graph, _, _, groups, sequences = tiny_groups
    full = graph_logits(graph, sequences, batch_size=4)
    np.testing.assert_allclose(multi_item_logits(graph, groups, batch_size=5), full, atol=1e-5)


@pytest.mark.parametrize("cut", [0, 1])
def test_multi_item_teacher_cache_and_top_layers_equal_the_single_sequence_graph(tiny_groups, cut):
    graph, _, _, groups, sequences = tiny_groups
    full = graph_logits(graph, sequences, batch_size=4)
    split = SplitScorer(graph, cut)
    exact = MemberHiddenCache(split, groups, batch_size=5, dtype=torch.float32)
    assert len(exact) == len(sequences)
    np.testing.assert_allclose(top_logits_multi(split, exact, batch_size=7), full, atol=1e-4)
    half = MemberHiddenCache(split, groups, batch_size=3)  # the build's float16 cache
    np.testing.assert_allclose(top_logits_multi(split, half, batch_size=4), full, atol=1e-3)


def test_multi_item_gradients_equal_single_sequence_gradients(tiny_groups):
    graph, _, examples, groups, sequences = tiny_groups
    from slimserve.models.multi_item import MultiItemScorer

    labels = torch.tensor([e.label for e in examples])
    teacher = torch.randn(len(examples), 2, generator=torch.Generator().manual_seed(0))
    batch = multi_item_batch(groups, range(len(groups)))
    index = torch.from_numpy(batch.indices)
    parameters = [p for name, p in graph.named_parameters() if "layers" in name]

    def gradients(loss):
        return torch.autograd.grad(loss, parameters)

    for p in parameters:
        p.requires_grad_(True)
    try:
        multi = MultiItemScorer(graph).label_logits(*batch.tensors())[batch.valid]
        multi_grads = gradients(distill_loss(multi, teacher[index], 2.0, labels[index], 0.3))
        ids, mask = pad_right([sequences[i] for i in batch.indices])
        single = graph.label_logits(ids, mask)
        single_grads = gradients(distill_loss(single, teacher[index], 2.0, labels[index], 0.3))
    finally:
        for p in parameters:
            p.requires_grad_(False)
    for a, b in zip(multi_grads, single_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


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


def test_trainer_checkpoints_by_time_when_steps_are_slow(tmp_path):
    # No step reaches checkpoint_every; every step is past checkpoint_seconds, so each one is saved.
    config = TrainConfig(
        epochs=2, batch_size=1, lr=0.1, checkpoint_every=1000, checkpoint_seconds=1e-9, warmup_ratio=0.0
    )
    reference = torch.nn.Parameter(torch.zeros(2))
    _fit(reference, config)
    resumed, checkpoint = torch.nn.Parameter(torch.zeros(2)), tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        _fit(resumed, config, checkpoint, fail_at=5)
    resumed.data.zero_()
    assert _fit(resumed, config, checkpoint).resumed_from_step == 4
    torch.testing.assert_close(resumed.data, reference.data)


def test_the_checkpoint_interval_is_no_part_of_a_stage_s_settings():
    dumped = TrainConfig(checkpoint_seconds=5.0).model_dump(mode="json")
    assert "checkpoint_seconds" not in dumped and dumped == TrainConfig().model_dump(mode="json")


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


@pytest.mark.parametrize("chosen", ["fp32", "bf16"])
def test_distill_runs_its_forward_at_its_precision_and_keeps_fp32_weights(tiny_groups, chosen, tmp_path):
    """The students' distillation autocasts its layers at ``precision`` (bf16), its label logits and
    weights stay FP32, and it still learns the teacher's distribution."""
    import copy

    from slimserve.buildstage.recipe import DistillSettings
    from slimserve.buildstage.training import distill
    from slimserve.models.multi_item import MultiItemScorer

    graph, _, examples, groups, _ = tiny_groups
    student = copy.deepcopy(graph)
    teacher = torch.randn(len(examples), 2, generator=torch.Generator().manual_seed(1)).numpy() * 3
    labels = np.array([e.label for e in examples])
    settings = DistillSettings(
        precision=chosen, label_weight=0.0, train=TrainConfig(epochs=60, lr=5e-3, batch_size=8)
    )
    seen = set()
    hook = student.body.layers[0].mlp.down_proj.register_forward_hook(
        lambda module, inputs, out: seen.add(out.dtype)
    )

    def kl_to_teacher() -> float:
        batch = multi_item_batch(groups, range(len(groups)))
        with torch.no_grad():
            logits = MultiItemScorer(student).label_logits(*batch.tensors())[batch.valid]
        index = torch.from_numpy(batch.indices)
        return float(distill_loss(logits, torch.from_numpy(teacher)[index], 2.0, None, 0.0))

    before = kl_to_teacher()
    seen.clear()
    distill(student, groups, teacher, labels, settings, tmp_path / "checkpoint.pt", "distill")
    hook.remove()
    assert seen == {torch.bfloat16 if chosen == "bf16" else torch.float32}
    assert all(p.dtype == torch.float32 for p in student.parameters())
    # measured: 0.15 (fp32) and 0.39 (bf16) of it (20 epochs at 1e-2 left 0.84 and 0.71 once the demo's
    # places, which these prompts use, became a city alone: too few steps to fit random targets)
    assert kl_to_teacher() < 0.7 * before
