"""The training stages' PyTorch precision: what ``auto`` picks, autocast only inside ``compute()`` blocks
of a ``using`` block, FP32 weights after BF16 training, and stages re-run when a precision changes
(the distillations' forward at their precision: tests/test_training.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slimserve.buildstage.context import stage_config
from slimserve.buildstage.recipe import load_recipe
from slimserve.compression import precision
from slimserve.compression.trainer import TrainConfig, train
from slimserve.settings import ConfigError


def test_resolve_names_the_choice_and_refuses_unknown_ones():
    assert precision.resolve("fp32") == "fp32" and precision.resolve("bf16") == "bf16"
    assert precision.resolve("auto") == ("bf16" if precision.has_bf16_matrix_units() else "fp32")
    with pytest.raises(ValueError, match="precision: 'fp16'"):
        precision.resolve("fp16")


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "expected"),
    [(True, False, "bf16"), (False, True, "bf16"), (True, True, "bf16"), (False, False, "fp32")],
)
def test_auto_picks_bf16_with_amx_tiles_or_avx512_bf16(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert precision.resolve("auto") == expected
    assert precision.resolve("fp32") == "fp32"  # an explicit choice is never overridden


def test_compute_autocasts_only_inside_a_bf16_using_block():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with precision.compute():
        assert layer(x).dtype == torch.float32  # nothing configured: FP32
    with precision.using("bf16") as chosen:
        assert chosen == "bf16"
        assert layer(x).dtype == torch.float32  # outside compute(): FP32 (the evaluations)
        with precision.compute():
            assert layer(x).dtype == torch.bfloat16
        with precision.using("fp32"), precision.compute():
            assert layer(x).dtype == torch.float32
        with precision.compute():
            assert layer(x).dtype == torch.bfloat16  # the inner block restored it
    with precision.compute():
        assert layer(x).dtype == torch.float32  # and the outer one the default


def test_training_at_bf16_learns_and_keeps_fp32_weights():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 1)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 1)

    def loss_fn(rows):
        with precision.compute():
            out = layer(x[rows])
        assert out.dtype == torch.bfloat16  # the forward ran under autocast
        return torch.nn.functional.mse_loss(out.float(), y[rows])

    def plan(epoch):
        order = torch.randperm(256, generator=torch.Generator().manual_seed(epoch))
        return [order[i : i + 32] for i in range(0, 256, 32)]

    with torch.no_grad():
        before = float(torch.nn.functional.mse_loss(layer(x), y))
    with precision.using("bf16"):
        report = train(
            list(layer.parameters()), plan, loss_fn, TrainConfig(epochs=20, lr=0.05, batch_size=32)
        )
    with torch.no_grad():
        after = float(torch.nn.functional.mse_loss(layer(x), y))
    assert all(p.dtype == torch.float32 for p in layer.parameters())
    assert after < 0.2 * before, (before, after, report.as_dict())
    assert report.precision == "bf16"  # the report says what the block ran at
    plain = train(list(layer.parameters()), plan, lambda rows: layer(x[rows]).pow(2).mean(), TrainConfig())
    assert plain.precision == "fp32"


def test_the_trainer_itself_stays_fp32():
    """Students train in FP32 even inside a BF16 block: only ``compute()`` autocasts."""
    layer = torch.nn.Linear(4, 1)
    seen = []

    def loss_fn(rows):
        out = layer(torch.ones(2, 4))
        seen.append(out.dtype)
        return out.pow(2).mean()

    with precision.using("bf16"):
        train(list(layer.parameters()), lambda epoch: [0, 1], loss_fn, TrainConfig(epochs=1))
    assert seen == [torch.float32, torch.float32]


def test_the_recipe_field_is_checked_and_reruns_the_teacher_and_after():
    with pytest.raises(ConfigError, match="precision"):
        load_recipe("tiny", overrides={"teacher": {"precision": "fp16"}})
    fp32, bf16 = (load_recipe("tiny", overrides={"teacher": {"precision": p}}) for p in ("fp32", "bf16"))
    assert stage_config(fp32, "data") == stage_config(bf16, "data")  # the data does not depend on it
    for stage in ("teacher", "distill", "redistill"):
        assert stage_config(fp32, stage)["precision"] == "fp32"
        assert stage_config(fp32, stage) != stage_config(bf16, stage)
    assert load_recipe("tiny").teacher.precision == "fp32"  # the field's default (the cpu recipe: auto)
    auto = load_recipe("tiny", overrides={"teacher": {"precision": "auto"}})
    assert stage_config(auto, "teacher")["precision"] == precision.resolve("auto")  # resolved, not "auto"


def test_a_distillation_s_precision_reruns_it_and_what_follows_but_fp32_keeps_old_ids():
    """student.distill.precision re-runs distill and after, prune.redistill.precision only redistill
    and after; at FP32 the stage settings hold no precision key, so builds made before the setting
    existed keep their stage ids."""
    fp32, student, redistill = (load_recipe("tiny") for _ in range(3))
    student.student.distill.precision = "bf16"
    redistill.prune.redistill.precision = "bf16"
    assert "precision" not in stage_config(fp32, "distill")["student"]["distill"]
    assert "precision" not in stage_config(fp32, "redistill")["redistill"]
    assert stage_config(student, "teacher") == stage_config(fp32, "teacher")
    assert stage_config(student, "distill")["student"]["distill"]["precision"] == "bf16"
    assert stage_config(student, "redistill") != stage_config(fp32, "redistill")  # it builds on distill
    assert stage_config(redistill, "prune") == stage_config(fp32, "prune")
    assert stage_config(redistill, "redistill")["redistill"]["precision"] == "bf16"
    assert stage_config(redistill, "int8") != stage_config(fp32, "int8")
    with pytest.raises(ConfigError, match="precision"):
        load_recipe("tiny", overrides={"student": {"distill": {"precision": "fp16"}}})


def test_trained_precision_reads_what_the_stage_settings_write():
    """``bench floor`` reads a stage's precision from its settings: the same keys ``stage_config`` writes."""
    from slimserve.buildstage.context import trained_precision

    fp32, bf16 = load_recipe("tiny"), load_recipe("tiny")
    bf16.teacher.precision = bf16.student.distill.precision = bf16.prune.redistill.precision = "bf16"
    for stage in ("teacher", "distill", "redistill"):
        assert trained_precision(stage_config(fp32, stage), stage) == "fp32"
        assert trained_precision(stage_config(bf16, stage), stage) == "bf16"
    assert trained_precision(stage_config(bf16, "prune"), "prune") == "fp32"  # no training pass of its own


def test_generator_training_stages_take_a_precision_that_reruns_them_and_fp32_keeps_old_ids():
    """generator.finetune.precision re-runs every generator stage (the fine-tuned teacher is the
    teacher); offpolicy's re-runs (a) and (b), onpolicy's (b) only; FP32 writes no precision key."""
    from slimserve.buildstage.context import trained_precision
    from slimserve.buildstage.generator_stages import GENERATOR_STAGES

    fp32 = load_recipe("tiny")
    for stage in GENERATOR_STAGES:
        assert trained_precision(stage_config(fp32, stage), stage) == "fp32"
    for section in ("finetune", "offpolicy", "onpolicy"):
        assert "precision" not in stage_config(fp32, "gen_onpolicy")[section]
    changed = {}
    for section in ("finetune", "offpolicy", "onpolicy"):
        bf16 = load_recipe("tiny")
        getattr(bf16.generator, section).precision = "bf16"
        changed[section] = [s for s in GENERATOR_STAGES if stage_config(bf16, s) != stage_config(fp32, s)]
        trained = f"gen_{section}"
        assert trained_precision(stage_config(bf16, trained), trained) == "bf16"
    assert changed == {
        "finetune": list(GENERATOR_STAGES),
        "offpolicy": ["gen_offpolicy", "gen_onpolicy"],
        "onpolicy": ["gen_onpolicy"],
    }
    assert trained_precision(stage_config(bf16, "gen_teacher"), "gen_teacher") == "fp32"  # text: FP32
    with pytest.raises(ConfigError, match="precision"):
        load_recipe("tiny", overrides={"generator": {"offpolicy": {"precision": "fp16"}}})
    assert load_recipe("cpu").generator.onpolicy.precision == "auto"


def test_a_generator_s_training_forward_autocasts_but_its_lm_head_and_evaluations_stay_fp32():
    from slimserve.compression.generator_distill import response_batch, response_logprobs
    from slimserve.models.teacher import load_teacher

    model = load_teacher("tiny", seed=3).model.eval()
    batch = response_batch([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15]])
    head_inputs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: head_inputs.append((i[0], o)))
    with torch.no_grad():
        reference = response_logprobs(model, batch)
        fp32_trained = response_logprobs(model, batch, training=True)  # no using block: FP32
        with precision.using("bf16"):
            evaluation = response_logprobs(model, batch)
            trained = response_logprobs(model, batch, training=True)
    hook.remove()
    assert torch.equal(evaluation, reference)  # evaluations: FP32 inside a BF16 stage
    torch.testing.assert_close(fp32_trained, reference, atol=1e-5, rtol=1e-5)  # only its attention differs
    assert trained.dtype == torch.float32 and trained.shape == reference.shape == (5, model.config.vocab_size)
    assert all(i.dtype == o.dtype == torch.float32 for i, o in head_inputs)  # the LM head ran in FP32
    difference = float((trained - reference).abs().max())
    assert 0 < difference < 0.1  # the decoder ran at BF16: close, not equal


def test_auto_on_cuda_reads_the_gpu_and_its_autocast_leaves_cpu_operations_alone(monkeypatch):
    """A generator on CUDA (``generator.device``) resolves ``auto`` by the GPU's BF16 support, not the
    CPU's units, in its stage ids too; ``compute()`` then autocasts CUDA operations only."""
    from slimserve.buildstage.context import trained_precision

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for supported, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert precision.resolve("auto", "cuda") == expected and precision.resolve("auto") == "fp32"
        recipe = load_recipe("tiny")
        recipe.generator.device = "auto"
        recipe.generator.finetune.precision = "auto"
        assert recipe.generator.resolved_device() == "cuda"
        assert trained_precision(stage_config(recipe, "gen_finetune"), "gen_finetune") == expected
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    layer = torch.nn.Linear(8, 4)
    with precision.using("bf16", "cuda"), precision.compute():
        assert layer(torch.randn(2, 8)).dtype == torch.float32  # a CPU operation: not autocast


def test_a_decoding_copy_runs_the_decoder_in_bf16_its_lm_head_fp32_and_leaves_the_model_alone():
    from slimserve.models.teacher import load_teacher

    model = load_teacher("tiny", seed=3).model.eval()
    assert precision.decoding_copy(model, "fp32") is model
    copy = precision.decoding_copy(model, "bf16")
    assert copy is not model and not copy.training
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the original is untouched
    assert {p.dtype for p in copy.get_decoder().layers.parameters()} == {torch.bfloat16}
    assert copy.get_output_embeddings().weight is model.get_output_embeddings().weight  # FP32, shared
    buffers = dict(model.named_buffers())
    for name, buffer in copy.named_buffers():  # the rotary frequencies among them: FP32, unrounded
        assert buffer.dtype == buffers[name].dtype and torch.equal(buffer, buffers[name]), name
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        reference, logits = model(input_ids=ids).logits, copy(input_ids=ids).logits
    assert logits.dtype == torch.float32
    difference = float((logits - reference).abs().max())
    assert 0 < difference < 0.1  # the decoder ran at BF16: close, not equal


def test_generation_precision_reaches_every_generation_and_reruns_the_generator_stages(monkeypatch):
    """``generator.generation_precision`` decodes on a BF16 copy (the model itself stays FP32); bf16
    re-runs every generator stage, fp32 writes no key (old builds keep their stage ids)."""
    from slimserve.buildstage.generator_stages import GENERATOR_STAGES
    from slimserve.compression.generator_data import Sampling, generate
    from slimserve.models.teacher import load_teacher

    fp32 = load_recipe("tiny")
    assert fp32.generator.generation_precision == "fp32"
    bf16 = load_recipe("tiny", overrides={"generator": {"generation_precision": "bf16"}})
    assert all("generation_precision" not in stage_config(fp32, s) for s in GENERATOR_STAGES)
    rerun = [s for s in GENERATOR_STAGES if stage_config(bf16, s) != stage_config(fp32, s)]
    assert rerun == list(GENERATOR_STAGES)
    from slimserve.buildstage.context import trained_precision

    # bench floor takes the teacher's text, that stage's work, at the BF16 peak
    assert trained_precision(stage_config(bf16, "gen_teacher"), "gen_teacher") == "bf16"
    assert trained_precision(stage_config(fp32, "gen_teacher"), "gen_teacher") == "fp32"
    with pytest.raises(ConfigError, match="generation_precision"):
        load_recipe("tiny", overrides={"generator": {"generation_precision": "fp16"}})
    assert load_recipe("cpu").generator.generation_precision == "auto"

    model = load_teacher("tiny", seed=3).model.eval()
    decoders = []
    original = precision.decoding_copy
    monkeypatch.setattr(
        "slimserve.compression.generator_data.decoding_copy",
        lambda m, setting: decoders.append(original(m, setting)) or decoders[-1],
    )
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    out = generate(model, prompts, Sampling(6, precision="bf16"), [2], top_k=4)
    assert len(decoders) == 1 and decoders[0] is not model
    assert {p.dtype for p in decoders[0].get_decoder().parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(1 <= len(r) <= 6 for r in out.responses) and out.topk_logprobs.dtype == "float32"
    assert generate(model, prompts, Sampling(6), [2]).responses and decoders[-1] is model  # fp32: itself


def test_stage_b_samples_and_takes_its_targets_at_the_generation_precision(monkeypatch):
    """Stage (b) at ``generation_precision`` bf16: the student's samples and the teacher's targets come
    from BF16 decoder copies; both models stay FP32 and the student still learns."""
    from slimserve.compression import generator_data, generator_distill
    from slimserve.compression.generator_data import Generated, Sampling, TeacherText
    from slimserve.compression.generator_distill import OnPolicySettings, distill_onpolicy
    from slimserve.models.teacher import load_teacher

    teacher = load_teacher("tiny", seed=3).model.eval()
    student = load_teacher("tiny", seed=4).model.eval()
    copied = []
    original = precision.decoding_copy

    def recording_copy(model, setting):
        copied.append((model, setting))
        return original(model, setting)

    monkeypatch.setattr(generator_distill.precision, "decoding_copy", recording_copy)
    monkeypatch.setattr(generator_data, "decoding_copy", recording_copy)
    text = TeacherText(["a", "b"], [[5, 6, 7], [8, 9, 10, 11]], Generated([[12, 13], [14]]))
    before = [p.detach().clone() for p in student.parameters()]
    settings = OnPolicySettings(Sampling(4, 0.85, precision="bf16"), share=1.0, top_k=4, end_ids=[2])
    report, record = distill_onpolicy(
        student, teacher, text, settings, TrainConfig(epochs=1, batch_size=2, lr=1e-2)
    )
    assert report.steps == 1 and record.batches == 1
    assert copied[0] == (teacher, "bf16") and (student, "bf16") in copied  # targets and samples
    assert all(p.dtype == torch.float32 for p in (*teacher.parameters(), *student.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters(), strict=True))


def test_evaluations_score_against_the_teachers_decoding_copy_and_the_teacher_against_itself(tmp_path):
    """At ``generation_precision`` bf16 the teacher-forced evaluations take their reference from one BF16
    decoding copy of the teacher (made once, dropped when the teacher is replaced): the teacher's own
    row is KL 0, a student's KL is measured against that copy."""
    from slimserve.buildstage.generator_stages import GeneratorContext, evaluate
    from slimserve.compression.generator_data import Generated, TeacherText
    from slimserve.compression.generator_eval import evaluate_text
    from slimserve.models.teacher import load_teacher

    evaluation = {"max_new_tokens": 6, "speed_tokens": 0, "grounding_prompts": 0, "unseen_skill_prompts": 0}
    recipe = load_recipe(
        "tiny", overrides={"generator": {"generation_precision": "bf16", "evaluation": evaluation}}
    )
    teacher = load_teacher("tiny", seed=3).model.eval()
    student = load_teacher("tiny", seed=4).model.eval()
    work = tmp_path / "work"
    heldout = TeacherText(["m/a", "m/b"], [[5, 6, 7], [8, 9, 10, 11]], Generated([[12, 13], [14, 15, 16]]))
    (work / "gen_teacher").mkdir(parents=True)
    heldout.save(work / "gen_teacher", "heldout")
    ctx = GeneratorContext(recipe, SimpleNamespace(examples={}), lambda: teacher, None, work, [2], "tiny")
    reference = ctx.reference_teacher
    assert reference is not teacher and reference is ctx.reference_teacher  # made once
    assert {p.dtype for p in reference.get_decoder().parameters()} == {torch.bfloat16}
    own = evaluate(ctx, "teacher", teacher, tmp_path)
    assert own.kl_teacher_text == 0.0 and own.top1_agreement == 1.0 and own.kl_own_samples == 0.0
    row = evaluate(ctx, "student", student, tmp_path)
    assert row.kl_teacher_text > 0 and row.kl_own_samples > 0
    against = {
        m: evaluate_text(student, m, heldout.prompts, heldout.responses).kl for m in (reference, teacher)
    }
    assert row.kl_teacher_text == pytest.approx(against[reference], rel=1e-6) != against[teacher]
    assert all(p.dtype == torch.float32 for p in teacher.parameters())
    ctx.replace_teacher(lambda: student)
    assert ctx.reference_teacher is not reference
