"""The generator student of ``slimserve build`` on the tiny recipe: grounded teacher fine-tune, teacher text,
pruning, distillation (a) then (b), held-out KL/loss and grounding, resume, gates, and publishing after the
scorer."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch

from slimserve.buildstage import artifacts
from slimserve.buildstage.context import stage_config
from slimserve.buildstage.generator_served import (
    FREE_PROMPT_FILLS,
    FREE_PROMPT_SEED_OFFSET,
    explain_penalty,
    served_check,
    served_explanations,
    served_label,
)
from slimserve.buildstage.generator_stages import (
    FREE_PROMPT_KEY,
    FREE_PROMPT_TEXT_SEED_OFFSET,
    GENERATOR_STAGES,
    HELDOUT_POSITIONS_FILE,
    REPORT_STAGE,
    active_stages,
    check_gates,
    check_grounding_gates,
    final_model_dir,
    report_generator,
    run_generator,
    scorer_decisions,
    standalone_context,
)
from slimserve.buildstage.recipe import load_recipe
from slimserve.compression.generator_data import Sampling, TeacherText, chat_prompts, generate
from slimserve.compression.generator_distill import (
    response_batch,
    response_logprobs,
    sparse_forward_kl,
    topk_targets,
)
from slimserve.compression.generator_eval import (
    TeacherPositions,
    evaluate_text,
    summarise_teacher,
    token_sums,
)
from slimserve.compression.generator_finetune import finetune_on_answers
from slimserve.compression.trainer import TrainConfig
from slimserve.data.explanations import OFF_TOPIC_INSTRUCTIONS, general_instructions
from slimserve.errors import BuildError
from slimserve.evaluation.generator_report import GeneratorRow
from slimserve.evaluation.grounding import parse_verdict
from slimserve.models.teacher import load_teacher
from slimserve.pair_facts import pair_facts

EXPECTED = [
    "generator teacher (zero-shot)",
    "generator teacher (fine-tuned)",
    "generator pruned (osscar)",
    "generator (a) off-policy",
    "generator (a)+(b) on-policy",
]


def tiny_recipe(tmp_path, **generator_updates):
    recipe = load_recipe("tiny")
    publish = recipe.publish.model_copy(update={"model_repository": tmp_path / "repo"})
    generator = recipe.generator.model_copy(update=generator_updates)
    return recipe.model_copy(
        update={"work_dir": tmp_path / "work", "publish": publish, "generator": generator}
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    recipe = tiny_recipe(tmp_path_factory.mktemp("generator"))
    ctx = standalone_context(recipe)
    seconds: dict[str, float] = {}
    rows = run_generator(ctx, seconds)
    report_generator(ctx, seconds, rows)
    return recipe, ctx, rows, seconds


def test_every_generator_stage_runs_and_is_measured(built):
    recipe, ctx, rows, seconds = built
    assert [r.stage for r in rows] == EXPECTED and set(seconds) == {*GENERATOR_STAGES, REPORT_STAGE}
    zero_shot, teacher, _, offpolicy, onpolicy = rows
    assert teacher.kl_teacher_text == 0 and teacher.top1_agreement == 1 and teacher.kl_own_samples == 0
    assert math.isnan(zero_shot.kl_teacher_text) and zero_shot.decode_tokens_per_s > 0
    assert zero_shot.parameters == teacher.parameters and zero_shot.notes["finetune"]["steps"] > 0
    for row in rows[1:]:
        assert math.isfinite(row.loss_teacher_text) and row.loss_teacher_text > 0
        assert row.kl_teacher_text >= 0 and 0 <= row.top1_agreement <= 1 and row.decode_tokens_per_s > 0
    for row in rows[2:]:
        assert row.kl_teacher_text > 0 and row.kl_own_samples > 0 and row.own_sample_tokens > 0
        assert 0 < row.non_embedding_parameters < teacher.non_embedding_parameters
    assert offpolicy.notes["train"]["steps"] > 0 and onpolicy.notes["onpolicy"]["batches"] > 0
    work = recipe.resolved_work_dir()
    for stage in GENERATOR_STAGES:
        assert (work / stage / "config.json").is_file() and (work / stage / "done.json").is_file()
    # The student is a standard, smaller Hugging Face model with the tokenizer beside it.
    student = artifacts.load_causal_lm(final_model_dir(recipe))
    teacher_config, config = ctx.teacher.config, student.config
    assert type(student).__name__ == "LlamaForCausalLM"
    assert config.num_hidden_layers == recipe.generator.student.layers < teacher_config.num_hidden_layers
    assert config.intermediate_size == recipe.generator.student.mlp_keep
    assert (
        config.num_attention_heads == config.num_key_value_heads * recipe.generator.student.heads_per_kv_group
    )
    assert (final_model_dir(recipe) / "tokenizer.json").is_file()
    assert student.generation_config.eos_token_id == ctx.end_ids


def test_teacher_text_is_cached_with_the_teachers_own_targets(built):
    recipe, ctx, _, _ = built
    settings = recipe.generator.teacher_text
    train = TeacherText.load(recipe.resolved_work_dir() / "gen_teacher", "train")
    count = settings.prompts + settings.free_prompts
    assert len(train.prompts) == count and len(set(train.keys)) == count
    # The free instructions follow the explanation prompts, as chat prompts of their own.
    free = general_instructions(settings.free_prompts, settings.seed + FREE_PROMPT_TEXT_SEED_OFFSET)
    assert settings.free_prompts and train.keys[settings.prompts :] == [
        f"{FREE_PROMPT_KEY}/{i}" for i in range(settings.free_prompts)
    ]
    assert train.prompts[settings.prompts :] == chat_prompts(
        free, ctx.tokenizer_file, settings.max_prompt_tokens
    )
    tokens = sum(len(r) for r in train.responses)
    assert train.generated.topk_logprobs.shape == (tokens, settings.top_k)
    for response in train.responses:
        assert 1 <= len(response) <= settings.max_new_tokens
        assert len(response) == settings.max_new_tokens or response[-1] in ctx.end_ids
    # Targets cached from the batched, left-padded, KV-cached generation equal a plain teacher-forced pass.
    batch = response_batch(train.prompts[:3], train.responses[:3])
    with torch.no_grad():
        values, ids = topk_targets(response_logprobs(ctx.teacher, batch), settings.top_k)
    cached = [train.generated.targets(i) for i in range(3)]
    assert torch.allclose(values, torch.cat([c[0] for c in cached]), atol=1e-4)
    assert torch.equal(ids[:, 0], torch.cat([c[1] for c in cached])[:, 0])
    heldout = TeacherText.load(recipe.resolved_work_dir() / "gen_teacher", "heldout")
    assert len(heldout.prompts) == settings.heldout_prompts and not set(heldout.keys) & set(train.keys)


def test_students_rows_on_the_teachers_text_equal_an_evaluation_with_the_teachers_pass(built):
    recipe, ctx, rows, _ = built
    work = recipe.resolved_work_dir()
    heldout = TeacherText.load(work / "gen_teacher", "heldout")
    kept = TeacherPositions.load(work / "gen_teacher" / HELDOUT_POSITIONS_FILE)
    assert len(kept) == sum(len(r) for r in heldout.responses)
    batch_size = ctx.settings.evaluation.batch_size
    for stage, row in zip(GENERATOR_STAGES[2:], rows[2:], strict=True):
        student = ctx.load_student(stage)
        with_pass = evaluate_text(
            student, ctx.reference_teacher, heldout.prompts, heldout.responses, batch_size
        )
        assert row.kl_teacher_text == pytest.approx(with_pass.kl, rel=1e-5, abs=1e-7)
        assert row.loss_teacher_text == with_pass.loss and row.top1_agreement == with_pass.top1_agreement


def test_onpolicy_stage_samples_from_the_student(built):
    recipe, ctx, _, _ = built
    record = json.loads((recipe.resolved_work_dir() / "gen_onpolicy" / "onpolicy_samples.json").read_text())
    assert record["batches"] > 0 and record["sampled_tokens"] > 0 and record["samples"]
    assert any(s["response"] != s["teacher_response"] for s in record["samples"])
    # The sampler: seeded, so reproducible; the student's samples are not the teacher's text.
    student = artifacts.load_causal_lm(recipe.resolved_work_dir() / "gen_offpolicy" / "model")
    prompts = TeacherText.load(recipe.resolved_work_dir() / "gen_teacher", "train").prompts[:4]
    sampling = Sampling(max_new_tokens=8, temperature=0.85, seed=3)
    first = generate(student, prompts, sampling, ctx.end_ids).responses
    assert first == generate(student, prompts, sampling, ctx.end_ids).responses
    assert first != generate(ctx.teacher, prompts, sampling, ctx.end_ids).responses
    assert first != generate(student, prompts, Sampling(8, 0.85, seed=4), ctx.end_ids).responses


def test_kl_and_loss_on_a_known_case():
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0]]).clamp_min(1e-30).log()
    q = torch.tensor([[0.25, 0.25, 0.25, 0.25]]).log()
    loss, kl, agree = token_sums(p, q, torch.tensor([1]))
    assert loss == pytest.approx(math.log(4))
    assert kl == pytest.approx(0.5 * math.log(2))  # 0.5 log(0.5/0.25) + 2 * 0.25 log(1)
    assert agree == 1  # argmax q is index 0 (ties resolve to the first), as p's
    # The training loss: exact KL when k = vocabulary, the renormalised top-k KL otherwise.
    values, ids = topk_targets(p, 4)
    assert float(sparse_forward_kl(q, values, ids)) == pytest.approx(kl, abs=1e-6)
    values, ids = topk_targets(p, 1)
    assert float(sparse_forward_kl(q, values, ids)) == pytest.approx(math.log(4))


def test_evaluation_of_a_model_against_itself_and_hf_loss():
    model = load_teacher("tiny", seed=1).model
    other = load_teacher("tiny", seed=2).model
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    same = evaluate_text(model, model, prompts, responses)
    assert same.kl == 0 and same.top1_agreement == 1 and same.tokens == 5
    batch = response_batch(prompts[:1], responses[:1])
    labels = torch.full_like(batch.input_ids, -100)
    labels[0, 3:] = torch.tensor(responses[0])
    with torch.no_grad():
        hf_loss = float(model(input_ids=batch.input_ids, labels=labels).loss)
    assert evaluate_text(model, model, prompts[:1], responses[:1]).loss == pytest.approx(hf_loss, rel=1e-5)
    assert evaluate_text(other, model, prompts, responses).kl > 0


def test_evaluation_reads_the_teachers_kept_positions_instead_of_running_it(tmp_path):
    teacher = load_teacher("tiny", seed=1).model
    student = copy.deepcopy(teacher)  # a student keeps the teacher's LM head (embeddings frozen)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in student.get_decoder().layers.parameters():
            parameter.add_(torch.randn_like(parameter))
    prompts, responses = [[5, 6, 7], [8, 9], [3, 4]], [[10, 11], [12, 13, 14], [15]]
    own, positions = summarise_teacher(teacher, prompts, responses, batch_size=2)
    assert own == evaluate_text(teacher, teacher, prompts, responses, batch_size=2)
    positions.save(tmp_path / "kept.npz")
    kept = TeacherPositions.load(tmp_path / "kept.npz")
    fresh = evaluate_text(student, teacher, prompts, responses, batch_size=2)
    calls = []
    hook = teacher.register_forward_hook(lambda *args: calls.append(1))
    try:
        read = evaluate_text(student, teacher, prompts, responses, batch_size=2, positions=kept)
    finally:
        hook.remove()
    assert not calls and fresh.kl > 0.01  # the teacher did not run
    assert read.loss == fresh.loss and read.top1_agreement == fresh.top1_agreement
    assert read.kl == pytest.approx(fresh.kl, rel=1e-5)
    with pytest.raises(ValueError, match="not those of this text"):
        evaluate_text(student, teacher, prompts, [[10, 11], [12, 13, 99], [15]], batch_size=2, positions=kept)
    other = load_teacher("tiny", seed=2).model  # another head: the teacher runs
    assert evaluate_text(other, teacher, prompts, responses, 2, positions=kept) == evaluate_text(
        other, teacher, prompts, responses, 2
    )


def _with_generator(recipe, section: str, **changes):
    """``recipe`` with the fields ``changes`` of its ``generator.<section>`` changed."""
    part = getattr(recipe.generator, section).model_copy(update=changes)
    return recipe.model_copy(update={"generator": recipe.generator.model_copy(update={section: part})})


def _stages_kept(recipe, other) -> list[bool]:
    """Per generator stage, whether ``other`` keeps ``recipe``'s stage settings (so its result)."""
    return [stage_config(other, s) == stage_config(recipe, s) for s in GENERATOR_STAGES]


def _without_speed(row: GeneratorRow) -> dict:
    return {k: v for k, v in row.as_dict().items() if k != "decode_tokens_per_s"}  # measured again


def test_resume_skips_finished_generator_stages(built, caplog):
    recipe, ctx, first, _ = built
    (recipe.resolved_work_dir() / "gen_onpolicy" / "done.json").unlink()  # died during stage (b)
    seconds: dict[str, float] = {}
    with caplog.at_level("INFO"):
        again = run_generator(ctx, seconds)
        report_generator(ctx, seconds, again)
    assert set(seconds) == {"gen_onpolicy", REPORT_STAGE}  # the report reads (b)'s new student
    skipped = {r.getMessage().split()[1].rstrip(":") for r in caplog.records if "skipped" in r.getMessage()}
    assert skipped == {"gen_finetune", "gen_teacher", "gen_prune", "gen_offpolicy"}
    assert [_without_speed(r) for r in again[:4]] == [_without_speed(r) for r in first[:4]]
    # A changed setting invalidates its stage and those after it, not those before.
    other = _with_generator(recipe, "onpolicy", temperature=0.5)
    assert _stages_kept(recipe, other) == [True] * 4 + [False]


def test_a_finished_build_run_again_never_loads_a_teacher(built):
    recipe = built[0]
    again, seconds = standalone_context(recipe), {}
    rows = run_generator(again, seconds)
    report_generator(again, seconds, rows)
    assert [r.stage for r in rows] == EXPECTED and not seconds  # all skipped, the report too
    assert again._teacher is None  # neither the teacher as loaded nor the fine-tuned one


def test_the_stages_measure_what_gates_read_and_the_report_after_them_the_rest(built):
    recipe, _, completed, _ = built
    gated = run_generator(standalone_context(recipe), {})  # the rows as the stages saved them
    zero_shot, teacher, pruned, offpolicy, onpolicy = gated
    assert all(row.grounding_pairs == 0 and math.isnan(row.decode_tokens_per_s) for row in gated)
    assert math.isnan(pruned.kl_own_samples)  # no gate reads the pruned student's samples ...
    assert offpolicy.kl_own_samples > 0 and onpolicy.kl_own_samples > 0  # ... max_kl_increase reads these
    assert zero_shot.parameters == teacher.parameters > pruned.parameters > 0
    # gen_report filled in the rest, the KLs on the teacher's text as the stages measured them
    assert all(row.grounding_pairs > 0 and row.decode_tokens_per_s > 0 for row in completed)
    assert completed[2].kl_own_samples > 0 and completed[2].own_sample_tokens > 0
    assert [r.kl_teacher_text for r in completed[1:4]] == [r.kl_teacher_text for r in gated[1:4]]
    assert completed[3].kl_own_samples == offpolicy.kl_own_samples  # (b) ran again in an earlier test


def test_gate_above_what_was_reached_fails_the_build_and_publishes_nothing(built, tmp_path):
    from slimserve.buildstage.runner import _report_and_publish

    recipe, ctx, rows, _ = built
    reached = rows[-1].kl_own_samples - rows[-2].kl_own_samples
    gates = recipe.generator.gates.model_copy(update={"max_kl_increase": reached - 1.0})
    strict = recipe.model_copy(update={"generator": recipe.generator.model_copy(update={"gates": gates})})
    ctx.recipe = strict
    published = []
    try:
        with pytest.raises(BuildError, match=r"generator\.gates\.max_kl_increase.*nothing was published"):
            _report_and_publish(strict, [], ctx.data, {}, "test", published.append, ctx)
    finally:
        ctx.recipe = recipe
    assert not published and not (recipe.publish.model_repository / "generator").exists()
    final = GeneratorRow.from_dict({**rows[-1].as_dict(), "top1_agreement": 0.5})
    agreement = recipe.generator.model_copy(
        update={"gates": gates.model_copy(update={"max_kl_increase": None, "min_top1_agreement": 0.9})}
    )
    with pytest.raises(BuildError, match="min_top1_agreement"):
        check_gates(agreement, [*rows[:-1], final])


def test_runner_reports_the_generator_and_publishes_it_after_the_scorer(built):
    from slimserve.buildstage.runner import _report_and_publish
    from slimserve.generator_bundle import load_generator_bundle

    recipe, ctx, _, _ = built
    order = []
    result = _report_and_publish(recipe, [], ctx.data, {}, "test", lambda card: order.append(card), ctx)
    assert order and "| generator (a)+(b) on-policy |" in order[0]
    served = served_label(ctx)
    assert [r.stage for r in result.generator_rows] == [*EXPECTED, served]
    report = json.loads((recipe.resolved_work_dir() / "report.json").read_text())
    assert [s["stage"] for s in report["generator_stages"]] == [*EXPECTED, served]
    assert f"| {served} |" in (recipe.resolved_work_dir() / "report.md").read_text()
    version = result.generator_published
    assert version == recipe.publish.model_repository / "generator" / "1"
    bundle = load_generator_bundle(version / "bundle")
    assert "generator student" in bundle.source_model and list(bundle.eos_token_ids) == ctx.end_ids
    # The published graph explained the held-out pairs as the service decodes Explain (greedy, at its
    # explain_repetition_penalty), and that row is in the version's export report and model card.
    row = json.loads((version / "export_report.json").read_text())["served_grounding"]
    assert row["grounding_pairs"] == len(ctx.grounding_examples()) and row["unseen_pairs"] == 2
    assert row["notes"]["repetition_penalty"] == explain_penalty() == 1.0
    assert row["notes"]["copy_names"] is True  # with its prompt's names, as Explain sends them
    assert [e["key"] for e in row["notes"]["explanations"]] == [
        f"{e.member_id}/{e.item_id}" for e in ctx.grounding_examples()
    ]
    card = (version / "MODEL_CARD.md").read_text()
    assert "grounding as served (greedy, repetition penalty 1, names copied whole)" in card
    # ... and the test split's full matches, a failure the random held-out pairs rarely hold
    full = ctx.full_match_examples()
    assert full and row["full_match_pairs"] == len(full) <= recipe.generator.evaluation.full_match_prompts
    assert [e["key"] for e in row["notes"]["full_match_explanations"]] == [
        f"{e.member_id}/{e.item_id}" for e in full
    ]
    assert all(pair_facts(e.member, e.item).full_match for e in full)
    assert f"as served on {len(full)} test-split full matches" in card
    # ... and how many free Generate prompts it answered as an explanation of fit
    free = row["notes"]["free_prompts"]
    shaped = round(free["as_explanations"] * len(free["answers"]))
    assert (
        f"answered as an explanation of fit (none asks for one): {shaped} of {len(free['answers'])}" in card
    )


def _published_to(recipe, repository, **gates):
    """``recipe`` publishing to ``repository``, with ``gates`` over its generator gates."""
    generator = recipe.generator.model_copy(update={"gates": recipe.generator.gates.model_copy(update=gates)})
    publish = recipe.publish.model_copy(update={"model_repository": repository})
    return recipe.model_copy(update={"generator": generator, "publish": publish})


def test_the_published_graph_explains_as_the_serving_engine_decodes(built, tmp_path):
    """The served row's texts are the serving engine's greedy decoding of the published graph, at the
    Explain penalty and with each prompt's names (Explain's defaults), token for token."""
    from slimserve.buildstage import generator_stages
    from slimserve.compression.generator_data import explain_prompts
    from slimserve.prompts import explain_names
    from slimserve.tokenization import copy_name_ids
    from slimserve.triton_models.generator import (
        BatchEngine,
        GenerationRequest,
        OnnxDecoder,
        TokenTexts,
    )
    from slimserve.triton_models.generator import generate as engine_generate

    recipe, ctx, _, _ = built
    ctx.recipe = _published_to(recipe, tmp_path / "repo")
    try:
        version = generator_stages.publish(ctx, served_check(ctx))
    finally:
        ctx.recipe = recipe
    examples = ctx.grounding_examples()[:2]
    prompts = explain_prompts(examples, ctx.tokenizer_file, ctx.settings.teacher_text.max_prompt_tokens)
    decoder = OnnxDecoder(version / "model.onnx", 1)
    engine = BatchEngine(
        decoder, ctx.end_ids, TokenTexts.of_tokenizer(ctx.tokenizer_file, decoder.vocab_size)
    )
    limit = ctx.settings.evaluation.max_new_tokens
    names = [
        tuple(map(tuple, copy_name_ids(ctx.tokenizer, explain_names(e.member, e.item)))) for e in examples
    ]
    assert all(names)
    requests = [
        GenerationRequest(tuple(p), limit, repetition_penalty=1.0, copy_names=n)
        for p, n in zip(prompts, names, strict=True)
    ]
    expected = [ctx.tokenizer.decode(t, skip_special_tokens=True) for t in engine_generate(engine, requests)]
    assert served_explanations(ctx, decoder, examples, explain_penalty()) == expected
    # The served row also answers free Generate prompts: held-out template fills, then off-topic ones.
    report = json.loads((version / "export_report.json").read_text())
    free = report["served_grounding"]["notes"]["free_prompts"]
    seed = ctx.settings.teacher_text.seed + FREE_PROMPT_SEED_OFFSET
    prompts = [*general_instructions(FREE_PROMPT_FILLS, seed), *OFF_TOPIC_INSTRUCTIONS]
    assert [a["prompt"] for a in free["answers"]] == prompts
    verdicts = [parse_verdict(a["text"]) is not None for a in free["answers"]]
    assert free["as_explanations"] == sum(verdicts) / len(prompts)


def test_free_prompts_answered_with_a_verdict_count_as_explanations(built, monkeypatch):
    """The free-prompt check counts the answers whose first sentence gives a verdict of fit."""
    from slimserve.buildstage import generator_served

    _, ctx, _, _ = built
    answers = iter(["Weak fit for you. Your profile lists none of them.", "Paris is the capital."])
    monkeypatch.setattr(
        generator_served,
        "_served_texts",
        lambda ctx, decoder, prompts, penalty: [next(answers, "A haiku.") for _ in prompts],
    )
    free = generator_served.free_prompt_answers(ctx, decoder=None)
    assert free["as_explanations"] == 1 / (FREE_PROMPT_FILLS + len(OFF_TOPIC_INSTRUCTIONS))
    assert (
        free["answers"][0]["text"].startswith("Weak fit")
        and free["answers"][1]["text"] == "Paris is the capital."
    )


def test_a_published_graph_that_misses_a_grounding_gate_publishes_nothing(built, tmp_path):
    """The grounding gates apply to the exported graph as served: missing one raises before the version
    is written (the tiny random model names no verdict, so a verdict gate of 0.5 fails)."""
    from slimserve.buildstage import generator_stages

    recipe, ctx, _, _ = built
    repository = tmp_path / "repo"
    strict = _published_to(recipe, repository, min_verdict_agreement=0.5)
    ctx.recipe = strict
    try:
        with pytest.raises(BuildError, match=r"published FP32 graph as served.*min_verdict_agreement"):
            generator_stages.publish(ctx, served_check(ctx))
    finally:
        ctx.recipe = recipe
    assert not (repository / "generator").exists() or not any((repository / "generator").glob("[0-9]*"))


def test_teacher_is_fine_tuned_on_written_explanations_and_its_own_answers(built):
    recipe, ctx, _, _ = built
    settings = recipe.generator.finetune
    work = recipe.resolved_work_dir()
    records = json.loads((work / "gen_finetune" / "finetune_set.json").read_text())
    explanations = [r for r in records if r["kind"] == "explanation"]
    instructions = [r for r in records if r["kind"] == "instruction"]
    assert len(explanations) == settings.examples and len(instructions) == settings.general_examples > 0
    assert all(r["text"].startswith(("Strong fit", "Partial fit", "Weak fit")) for r in explanations)
    # The fine-tuned teacher is the teacher of every later stage: saved, and loaded into the context.
    tuned = artifacts.load_causal_lm(work / "gen_finetune" / "model")
    original = standalone_context(recipe).teacher
    key = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(tuned.state_dict()[key], ctx.teacher.state_dict()[key].cpu())
    assert not torch.equal(tuned.state_dict()[key], original.state_dict()[key].cpu())


def test_fine_tune_of_the_top_layers_leaves_the_ones_below_as_they_were(tmp_path):
    model = load_teacher("tiny", seed=1).model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(lr=1e-2, epochs=1, batch_size=2)
    report = finetune_on_answers(model, [[5, 6, 7], [8, 9]], [[10, 11], [12, 13]], config, None, 1)
    assert report.steps == 1
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    top = len(model.get_decoder().layers) - 1
    assert changed and all(k.startswith(f"model.layers.{top}.") or k == "model.norm.weight" for k in changed)
    assert all(not p.requires_grad for p in model.parameters())  # frozen again once trained


def test_training_pairs_are_spread_over_the_verdicts():
    from collections import Counter

    from slimserve.compression.generator_data import pick_balanced

    examples = (
        [("strong", i) for i in range(5)]
        + [("weak", i) for i in range(40)]
        + [("partial", i) for i in range(60)]
    )
    picked = pick_balanced(examples, 35, seed=1, group=lambda e: e[0])
    assert Counter(g for g, _ in picked) == {"strong": 5, "weak": 15, "partial": 15}  # the small group whole
    assert picked == sorted(picked, key=examples.index) and len(set(picked)) == 35  # input order, no repeats
    assert picked == pick_balanced(examples, 35, seed=1, group=lambda e: e[0])
    assert pick_balanced(examples, 500, seed=1, group=lambda e: e[0]) == examples  # all when fewer


def test_every_model_is_evaluated_for_grounding(built):
    recipe, _, rows, _ = built
    pairs = recipe.generator.evaluation.grounding_prompts
    for row in rows:
        assert row.grounding_pairs == pairs, row.stage
        assert 0 <= row.hallucination_rate <= 1 and 0 <= row.verdict_agreement <= 1
        assert row.notes["grounding"]["decision_source"] is None  # no scorer in this work directory
        assert math.isnan(row.decision_agreement)
    checks = json.loads((recipe.resolved_work_dir() / REPORT_STAGE / "grounding.json").read_text())
    assert len(checks["generator (a)+(b) on-policy"]) == pairs
    unseen = recipe.generator.evaluation.unseen_skill_prompts
    assert unseen and all(row.unseen_pairs == unseen for row in rows)
    renamed = checks["generator (a)+(b) on-policy (unseen skills)"]
    from slimserve.data.renaming import HELD_OUT_SKILLS

    assert len(renamed) == unseen and all(
        set(c["named_shared_skills"]) <= set(HELD_OUT_SKILLS) for c in renamed
    )
    assert {"text", "verdict", "expected_verdict", "foreign_terms"} <= set(
        checks["generator (a)+(b) on-policy"][0]
    )
    from slimserve.evaluation.generator_report import generator_table

    table = generator_table(rows)
    assert "| hallucination | coverage | verdict = facts | verdict = scorer | sentence repeated |" in table
    assert all(0 <= row.repetition_rate <= 1 for row in rows if row.grounding_pairs)
    assert "| unseen skills: hallucination | unseen skills: coverage |" in table
    assert "| generator teacher (zero-shot) | - | - | - |" in table


def test_scorer_decisions_come_from_the_scoring_students_test_logits(built, tmp_path):
    _, ctx, _, _ = built
    other = dataclasses.replace(ctx, work=tmp_path)
    examples = other.grounding_examples()
    assert scorer_decisions(other, examples)[0] is None
    test = ctx.data.examples["test"]
    margins = torch.linspace(-1, 1, len(test)).numpy()
    logits = torch.stack([torch.from_numpy(margins), torch.zeros(len(test), dtype=torch.float64)], 1).numpy()
    (tmp_path / "redistill").mkdir()
    artifacts.save_arrays(tmp_path / "redistill", logits_test=logits)
    decisions, source = scorer_decisions(other, examples)
    index = {(e.member_id, e.item_id): i for i, e in enumerate(test)}
    assert decisions == [bool(margins[index[(e.member_id, e.item_id)]] > 0) for e in examples]
    assert "redistill" in source


def test_the_full_match_gate_reads_the_published_graphs_row(built):
    """``max_full_match_hallucination_rate`` gates the row of the published graph (the only one that
    explains the full matches); it needs ``full_match_prompts`` to be set."""
    from slimserve.buildstage.generator_stages import check_grounding_gates

    recipe, _, rows, _ = built
    gates = recipe.generator.gates.model_copy(update={"max_full_match_hallucination_rate": 0.05})
    settings = recipe.generator.model_copy(update={"gates": gates})
    served = GeneratorRow.from_dict(
        {**rows[-1].as_dict(), "full_match_hallucination_rate": 0.5, "full_match_pairs": 2}
    )
    with pytest.raises(
        BuildError, match=r"hallucination rate 0.500 on 2 test-split full matches.*max_full_match"
    ):
        check_grounding_gates(settings, served)
    check_grounding_gates(
        settings, GeneratorRow.from_dict({**served.as_dict(), "full_match_hallucination_rate": 0.0})
    )
    check_grounding_gates(settings, rows[-1])  # a PyTorch row: no full matches explained, nothing to gate
    data = recipe.generator.model_dump()
    data["gates"]["max_full_match_hallucination_rate"] = 0.05
    data["evaluation"]["full_match_prompts"] = 0
    with pytest.raises(ValueError, match=r"evaluation\.full_match_prompts"):
        type(recipe.generator).model_validate(data)


def test_the_publish_checks_full_matches_re_run_no_stage(tmp_path):
    """Only the published graph's check reads ``evaluation.full_match_prompts``."""
    recipe = tiny_recipe(tmp_path)
    other = _with_generator(recipe, "evaluation", full_match_prompts=9)
    assert all(_stages_kept(recipe, other))


def test_grounding_gates_fail_the_build(built):
    """The grounding gates judge the published graph's served row (``check_grounding_gates``); the PyTorch
    student's own row fails them only when the recipe has no held-out pairs to measure them on."""
    recipe, _, rows, _ = built
    final = rows[-1]
    gates = recipe.generator.gates
    for field, value, gate in (
        ("hallucination_rate", 0.5, {"max_hallucination_rate": 0.05}),
        ("coverage", 0.5, {"min_coverage": 0.85}),
        ("verdict_agreement", 0.5, {"min_verdict_agreement": 0.85}),
        ("decision_agreement", 0.5, {"min_decision_agreement": 0.85}),
    ):
        bad = GeneratorRow.from_dict({**final.as_dict(), field: value})
        settings = recipe.generator.model_copy(update={"gates": gates.model_copy(update=gate)})
        with pytest.raises(BuildError, match=rf"generator\.gates\.{next(iter(gate))}.*nothing was published"):
            check_grounding_gates(settings, bad)
        good = GeneratorRow.from_dict({**final.as_dict(), field: 0.04 if "hallucination" in field else 0.9})
        check_grounding_gates(settings, good)
        check_gates(settings, [*rows[:-1], bad])  # measured: the served row decides
        unmeasured = GeneratorRow.from_dict({**final.as_dict(), "grounding_pairs": 0, field: float("nan")})
        check_gates(settings, [*rows[:-1], unmeasured])  # measured later: gen_report, the served row
        no_pairs = settings.evaluation.model_copy(update={"grounding_prompts": 0})
        with pytest.raises(BuildError, match=next(iter(gate))):
            check_gates(settings.model_copy(update={"evaluation": no_pairs}), [*rows[:-1], unmeasured])


def test_fine_tune_off_runs_the_teacher_as_loaded(tmp_path):
    recipe = tiny_recipe(tmp_path)
    off_recipe = _with_generator(recipe, "finetune", enabled=False, examples=7)
    assert active_stages(off_recipe.generator) == GENERATOR_STAGES[1:]
    assert active_stages(recipe.generator) == GENERATOR_STAGES
    # Disabled, its other settings do not matter; enabled, they invalidate every stage.
    other = _with_generator(off_recipe, "finetune", examples=8)
    assert all(_stages_kept(off_recipe, other))
    assert all(stage_config(recipe, s) != stage_config(off_recipe, s) for s in GENERATOR_STAGES)


def test_teacher_text_settings_re_run_the_teacher_text_not_the_fine_tune(tmp_path):
    """The distillation prompts' settings (how many, renamed, copied) and the text's decoding: changing one
    keeps the fine-tuned teacher and re-runs every stage from its text on; so does an evaluation setting."""
    recipe = tiny_recipe(tmp_path)
    base = recipe.generator.teacher_text
    changes = (
        ("renamed_share", 0.25),
        ("invented_share", 0.75),
        ("full_match_copies", 3),
        ("free_prompts", 9),
        ("prompts", base.prompts + 1),
        ("heldout_prompts", base.heldout_prompts + 1),
        ("top_k", base.top_k + 1),
        ("max_new_tokens", base.max_new_tokens + 1),
    )
    for field, value in changes:
        other = _with_generator(recipe, "teacher_text", **{field: value})
        assert _stages_kept(recipe, other) == [True, False, False, False, False], field
    other = _with_generator(recipe, "evaluation", sample_temperature=0.5)
    assert _stages_kept(recipe, other) == [True, False, False, False, False]
    other = _with_generator(recipe, "finetune", examples=recipe.generator.finetune.examples + 1)
    assert stage_config(other, "gen_finetune") != stage_config(recipe, "gen_finetune")
