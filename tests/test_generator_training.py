"""How the generator's training passes run: stage (b)'s batched rollouts, the training forward's attention,
and the trainer's fused AdamW (their effect on the build's time: docs/build-times.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slimserve.compression import generator_distill, trainer
from slimserve.compression.generator_data import Generated, Sampling, TeacherText
from slimserve.compression.generator_distill import (
    TRAINING_ATTENTION,
    OnPolicySettings,
    _onpolicy_plan,
    _Rollouts,
    distill_onpolicy,
    response_batch,
    response_logprobs,
)
from slimserve.compression.trainer import TrainConfig
from slimserve.models.teacher import load_teacher


def _on_policy(plan: list[tuple]) -> list[tuple]:
    return [payload for payload in plan if payload[0] == "on"]


@pytest.mark.parametrize("rollout_batches", [1, 2, 3])
def test_on_policy_micro_batches_are_grouped_into_rollouts_in_plan_order(rollout_batches):
    config = TrainConfig(batch_size=2, seed=5)
    plan = _onpolicy_plan([4] * 20, config, share=0.6, epoch=0, rollout_batches=rollout_batches)
    on = _on_policy(plan)
    assert len(on) == 6 and all(payload[3] == () for payload in plan if payload[0] == "off")
    for start in range(0, len(on), rollout_batches):
        group = on[start : start + rollout_batches]
        expected = tuple((indices, seed) for _, indices, seed, _ in group)
        assert all(payload[3] == expected for payload in group)  # each knows its rollout, itself included
    # The grouping changes nothing else: the same micro-batches, kinds and seeds as one at a time.
    alone = _onpolicy_plan([4] * 20, config, share=0.6, epoch=0)
    assert [(k, list(i), s) for k, i, s, _ in plan] == [(k, list(i), s) for k, i, s, _ in alone]


def _text() -> TeacherText:
    prompts = [[5 + i, 6, 7 + i] for i in range(8)]
    return TeacherText([f"m/{i}" for i in range(8)], prompts, Generated([[12, 13]] * 8))


def test_a_rollout_is_sampled_in_one_decode_and_after_a_resume_from_where_it_stopped(monkeypatch):
    student = load_teacher("tiny", seed=4).model.eval()
    calls = []
    real_generate = generator_distill.generate

    def recording_generate(model, prompts, sampling, end_ids, batch_size=16, **kwargs):
        calls.append((len(prompts), batch_size, sampling.seed))
        return real_generate(model, prompts, sampling, end_ids, batch_size=batch_size, **kwargs)

    monkeypatch.setattr(generator_distill, "generate", recording_generate)
    settings = OnPolicySettings(Sampling(4, 0.85), share=1.0, top_k=4, end_ids=[2], rollout_batches=3)
    rollout = ((np.array([0, 1]), 11), (np.array([2, 3]), 12), (np.array([4, 5]), 13))

    rollouts = _Rollouts(student, _text(), settings)
    first = [rollouts.responses(seed, rollout) for _, seed in rollout]
    assert calls == [(6, 6, 11)]  # the whole rollout in one batch, seeded by its first micro-batch
    assert all(len(responses) == 2 for responses in first) and not rollouts.drawn

    calls.clear()
    resumed = _Rollouts(student, _text(), settings)  # a resume after the rollout's first micro-batch
    assert resumed.responses(12, rollout) and calls == [(4, 4, 12)]
    assert resumed.responses(13, rollout) and calls == [(4, 4, 12)]


def test_stage_b_with_rollouts_trains_on_every_micro_batch_it_sampled():
    teacher = load_teacher("tiny", seed=3).model.eval()
    student = load_teacher("tiny", seed=4).model.eval()
    before = [p.detach().clone() for p in student.parameters()]
    settings = OnPolicySettings(Sampling(4, 0.85), share=1.0, top_k=4, end_ids=[2], rollout_batches=2)
    report, record = distill_onpolicy(
        student, teacher, _text(), settings, TrainConfig(epochs=1, batch_size=2, lr=1e-2)
    )
    assert report.steps == 4 and record.batches == 4 and record.sampled_tokens > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters(), strict=True))


def test_the_training_forward_runs_its_attention_and_gives_the_models_own_back():
    model = load_teacher("tiny", seed=4).model.eval()
    own = model.config._attn_implementation
    assert own != TRAINING_ATTENTION  # the tiny model loads with SDPA, as the teacher does
    seen = []
    hook = (
        model.get_decoder()
        .layers[0]
        .register_forward_pre_hook(
            lambda module, args: seen.append(module.self_attn.config._attn_implementation)
        )
    )
    batch = response_batch([[5, 6, 7], [8, 9, 10, 11]], [[12, 13], [14]])
    trained = response_logprobs(model, batch, training=True)
    evaluated = response_logprobs(model, batch)
    hook.remove()
    assert seen == [TRAINING_ATTENTION, own] and model.config._attn_implementation == own
    torch.testing.assert_close(trained, evaluated, atol=1e-5, rtol=1e-5)  # FP32: the same log-probs


def test_the_trainer_runs_adamw_fused_on_the_cpu(monkeypatch):
    made = []
    real = torch.optim.AdamW

    def recording(parameters, **kwargs):
        made.append(kwargs)
        return real(parameters, **kwargs)

    monkeypatch.setattr(trainer.torch.optim, "AdamW", recording)
    weight = torch.nn.Parameter(torch.ones(3))
    trainer.train([weight], lambda epoch: [0, 1], lambda _: (weight * 2).sum(), TrainConfig(lr=0.1))
    assert made[0]["fused"] is True and not torch.equal(weight.detach(), torch.ones(3))
