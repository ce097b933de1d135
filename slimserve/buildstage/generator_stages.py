"""The generator stages of a build: teacher text -> pruned student -> (a) off-policy KL -> (b) on-policy KL.

They run after the scorer's stages when the recipe has a ``generator:`` section, each in
``<work_dir>/<stage>/`` with the build's conventions (``config.json``, ``done.json`` written last, resumable
checkpoints). The teacher is the original model (not the scorer's yes/no fine-tuned copy). Every stage
is evaluated on the same held-out prompts (test-split members), see ``compression.generation_eval``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..compression.generation_data import Sampling, TeacherText
from ..compression.trainer import progress_bar
from ..errors import BuildError, UserError
from ..evaluation.generator_report import GeneratorRow
from . import artifacts
from .context import BuildData
from .generator_recipe import GeneratorSettings
from .recipe import Recipe

log = logging.getLogger(__name__)

GENERATOR_STAGES = ("gen_teacher", "gen_prune", "gen_offpolicy", "gen_onpolicy")
FINAL_STAGE = GENERATOR_STAGES[-1]
ROWS_FILE = "generator_rows.json"


def stage_config(recipe: Recipe, stage: str) -> dict:
    """The settings a generator stage's output depends on (itself and everything upstream)."""
    g = recipe.generator
    dump = lambda model: model.model_dump(mode="json")  # noqa: E731
    config = {
        "data": dump(recipe.data),
        "teacher": {"source": recipe.teacher.source, "seed": recipe.teacher.seed},
        "teacher_text": dump(g.teacher_text),
        "evaluation": dump(g.evaluation),
    }
    for name, key, section in (
        ("gen_teacher", None, None),
        ("gen_prune", "student", g.student),
        ("gen_offpolicy", "offpolicy", g.offpolicy),
        ("gen_onpolicy", "onpolicy", g.onpolicy),
    ):
        if key is not None:
            config = {**config, key: dump(section)}
        if name == stage:
            return config
    raise ValueError(f"unknown generator stage {stage!r}")


@dataclass
class GeneratorContext:
    """What every generator stage reads."""

    recipe: Recipe
    data: BuildData
    teacher: object  # the original causal LM (eval mode)
    tokenizer_file: Path
    work: Path
    end_ids: list[int]
    source: str  # the teacher's name (recorded in the published bundle)
    device: str = "cpu"

    @property
    def settings(self) -> GeneratorSettings:
        return self.recipe.generator

    def load_student(self, stage: str):
        """A stage's saved model, on the generator's device."""
        return artifacts.load_causal_lm(self.work / stage / "model").to(self.device)

    def text(self, name: str) -> TeacherText:
        return TeacherText.load(self.work / "gen_teacher", name)

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_file))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def evaluate(ctx: GeneratorContext, stage: str, model) -> GeneratorRow:
    """Held-out figures of ``model``: on the teacher's text, on its own samples, size and decode speed."""
    from ..compression.generation_eval import decode_tokens_per_s, evaluate_own_samples, evaluate_text

    settings, heldout = ctx.settings.evaluation, ctx.text("heldout")
    with progress_bar(len(heldout.prompts), f"evaluate {stage} on teacher text") as bar:
        text = evaluate_text(
            model, ctx.teacher, heldout.prompts, heldout.responses, settings.batch_size, bar.update
        )
    row = GeneratorRow(stage, text.loss, text.kl, text.top1_agreement, notes={"heldout_tokens": text.tokens})
    if model is ctx.teacher:
        row.kl_own_samples = 0.0
    else:
        sampling = Sampling(
            settings.max_new_tokens, settings.sample_temperature, seed=ctx.settings.teacher_text.seed
        )
        with progress_bar(len(heldout.prompts), f"evaluate {stage} on own samples") as bar:
            own, samples = evaluate_own_samples(
                model, ctx.teacher, heldout.prompts, sampling, ctx.end_ids, progress=bar.update
            )
        row.kl_own_samples = own.kl
        row.own_sample_tokens = own.tokens / len(samples)
    row.parameters, row.embedding_parameters = artifacts.parameter_counts(model)
    if settings.speed_tokens:
        row.decode_tokens_per_s = decode_tokens_per_s(model, heldout.prompts[0], settings.speed_tokens)
    log.info("generator %s: %s", stage, row.as_dict())
    return row


def _save_model(ctx: GeneratorContext, model, out: Path) -> None:
    """A standard Hugging Face directory: weights, config, generation config (end tokens) and tokenizer."""
    from ..export.generator_export import save_hf_model

    model.generation_config.eos_token_id = list(ctx.end_ids)
    model.generation_config.pad_token_id = ctx.end_ids[-1]
    save_hf_model(model, out / "model", ctx.tokenizer_file)


def run_teacher_text(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Write the teacher's text for train prompts (with top-k targets) and held-out prompts, once."""
    from ..compression.generation_data import explain_prompts, generate, pick

    settings = ctx.settings.teacher_text
    sampling = Sampling(settings.max_new_tokens, settings.temperature, seed=settings.seed)
    for name, split, count, top_k in (
        ("train", "train", settings.prompts, settings.top_k),
        ("heldout", "test", settings.heldout_prompts, None),
    ):
        examples = pick(ctx.data.examples[split], count, settings.seed)
        prompts = explain_prompts(examples, ctx.tokenizer_file, settings.max_prompt_tokens)
        with progress_bar(len(prompts), f"teacher text, {name}") as bar:
            generated = generate(
                ctx.teacher, prompts, sampling, ctx.end_ids, settings.batch_size, top_k, bar.update
            )
        keys = [f"{e.member_id}/{e.item_id}" for e in examples]
        TeacherText(keys, prompts, generated).save(out, name, ctx.decode)
    return [evaluate(ctx, "generator teacher", ctx.teacher)]


def _calibration(ctx: GeneratorContext) -> list:
    from ..compression.batches import pad_right

    text = ctx.text("train")
    count = ctx.settings.student.calibration_prompts
    sequences = [p + r for p, r in zip(text.prompts[:count], text.responses[:count], strict=True)]
    return [pad_right(sequences[i : i + 8]) for i in range(0, len(sequences), 8)]


def run_prune(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Prune the teacher (layers by importance, heads per KV group, OSSCAR MLP neurons) on explanation
    prompts with the teacher's answers."""
    from ..compression.prune import PruneConfig, prune_model

    sizes = ctx.settings.student
    config = PruneConfig(
        layers_keep=sizes.layers,
        mlp_keep=sizes.mlp_keep,
        heads_per_kv_group=sizes.heads_per_kv_group,
        layer_calibration_tokens=sizes.layer_calibration_tokens,
    )
    try:  # the pruning code runs on the CPU
        pruned, report = prune_model(ctx.teacher.cpu(), _calibration(ctx), config)
    finally:
        ctx.teacher.to(ctx.device)
    pruned = pruned.to(ctx.device)
    (out / "prune_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    _save_model(ctx, pruned, out)
    return [evaluate(ctx, "generator pruned (osscar)", pruned)]


def run_offpolicy(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Stage (a): forward KL to the teacher on its cached text."""
    from ..compression.generation_distill import distill_offpolicy

    student = ctx.load_student("gen_prune")
    report = distill_offpolicy(
        student, ctx.text("train"), ctx.settings.offpolicy.train, out / "checkpoint.pt"
    )
    _save_model(ctx, student, out)
    row = evaluate(ctx, "generator (a) off-policy", student)
    row.notes["train"] = report.as_dict()
    return [row]


def run_onpolicy(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Stage (b): forward KL on the student's own samples (mixed with teacher text), from stage (a)."""
    from ..compression.generation_distill import OnPolicySettings, distill_onpolicy

    settings = ctx.settings.onpolicy
    student = ctx.load_student("gen_offpolicy")
    text = ctx.text("train")
    policy = OnPolicySettings(
        Sampling(settings.max_new_tokens, settings.temperature, settings.top_p),
        settings.share,
        ctx.settings.teacher_text.top_k,
        ctx.end_ids,
    )
    report, sampled = distill_onpolicy(
        student, ctx.teacher, text, policy, settings.train, out / "checkpoint.pt"
    )
    for sample in sampled.samples:
        sample["text"] = ctx.decode(sample["response"])
        sample["teacher_response"] = text.responses[sample["prompt_index"]]
    summary = {"batches": sampled.batches, "sampled_tokens": sampled.sampled_tokens, "ended": sampled.ended}
    (out / "onpolicy_samples.json").write_text(json.dumps({**summary, "samples": sampled.samples}) + "\n")
    _save_model(ctx, student, out)
    row = evaluate(ctx, "generator (a)+(b) on-policy", student)
    row.notes.update(train=report.as_dict(), onpolicy=summary)
    return [row]


RUNNERS: dict[str, Callable[[GeneratorContext, Path], list[GeneratorRow]]] = {
    "gen_teacher": run_teacher_text,
    "gen_prune": run_prune,
    "gen_offpolicy": run_offpolicy,
    "gen_onpolicy": run_onpolicy,
}


def check_gates(settings: GeneratorSettings, rows: list[GeneratorRow]) -> None:
    """Raise ``BuildError`` when the final generator misses a gate of the recipe."""
    gates = settings.gates
    by_stage = {r.stage: r for r in rows}
    offpolicy, final = by_stage["generator (a) off-policy"], rows[-1]
    increase = final.kl_own_samples - offpolicy.kl_own_samples
    if gates.max_kl_increase is not None and not increase <= gates.max_kl_increase:
        raise BuildError(
            f"quality gate failed at stage {final.stage!r}: held-out KL on own samples "
            f"{final.kl_own_samples:.4f} is {increase:+.4f} from stage (a)'s {offpolicy.kl_own_samples:.4f}, "
            f"the recipe allows at most {gates.max_kl_increase:+.4f} (generator.gates.max_kl_increase); "
            f"nothing was published"
        )
    if gates.min_top1_agreement is not None and not final.top1_agreement >= gates.min_top1_agreement:
        raise BuildError(
            f"quality gate failed at stage {final.stage!r}: top-1 agreement with the teacher "
            f"{final.top1_agreement:.4f} is below {gates.min_top1_agreement:.4f} "
            f"(generator.gates.min_top1_agreement); nothing was published"
        )


def run_generator(ctx: GeneratorContext, seconds: dict[str, float]) -> list[GeneratorRow]:
    """Run (or skip, when done with the same settings) every generator stage, then check the gates."""
    rows: list[GeneratorRow] = []
    for stage in GENERATOR_STAGES:
        out, config = ctx.work / stage, stage_config(ctx.recipe, stage)
        if artifacts.is_done(out, config):
            log.info("stage %s: done before with the same settings, skipped", stage)
        else:
            started = time.perf_counter()
            artifacts.prepare_stage(out, config)
            log.info("stage %s: running", stage)
            stage_rows = RUNNERS[stage](ctx, out)
            (out / ROWS_FILE).write_text(json.dumps([r.as_dict() for r in stage_rows], indent=2) + "\n")
            artifacts.mark_done(out, config)
            seconds[stage] = time.perf_counter() - started
            log.info("stage %s: finished in %.0f s", stage, seconds[stage])
        rows += [GeneratorRow.from_dict(d) for d in json.loads((out / ROWS_FILE).read_text())]
    check_gates(ctx.settings, rows)
    return rows


def final_model_dir(recipe: Recipe) -> Path:
    """The distilled generator student's Hugging Face directory (weights, config, tokenizer.json)."""
    return recipe.resolved_work_dir() / FINAL_STAGE / "model"


def publish(ctx: GeneratorContext) -> Path:
    """Export the final student (FP32 greedy parity gate, optional weight-only quantization) and publish
    it as a new version of the Triton model ``generator``; returns the version directory."""
    from ..export.generator_parity import explanation_prompts
    from ..export.generator_repository import publish_generator

    settings = ctx.settings.publish
    return publish_generator(
        artifacts.load_causal_lm(final_model_dir(ctx.recipe)),
        ctx.tokenizer_file,
        ctx.recipe.publish.model_repository,
        quantize=None if settings.quantize == "none" else settings.quantize,
        source_model=f"{ctx.source} (generator student)",
        prompts=explanation_prompts(settings.parity_prompts),
        parity_tokens=settings.parity_tokens,
        max_new_tokens_limit=settings.max_new_tokens_limit,
        eos_token_ids=ctx.end_ids,
        max_active_sequences=settings.max_active_sequences,
        max_queued_requests=settings.max_queued_requests,
        stream_interval=settings.stream_interval,
        device=settings.device,
    )


def generator_context(recipe: Recipe, data: BuildData, loaded) -> GeneratorContext:
    """The generator stages' context, with a copy of the teacher taken before anything trains it."""
    import copy

    import torch

    from ..compression.generation_data import end_token_ids

    device = recipe.generator.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise UserError("generator.device: 'cuda' but torch sees no CUDA device (use 'cpu' or 'auto')")
    teacher = copy.deepcopy(loaded.model).eval().to(device)
    work = recipe.resolved_work_dir()
    end_ids = end_token_ids(loaded.tokenizer_file)
    return GeneratorContext(recipe, data, teacher, loaded.tokenizer_file, work, end_ids, loaded.name, device)


def standalone_context(recipe: Recipe) -> GeneratorContext:
    """The generator stages' context without the scorer's stages (data written or reused, teacher loaded)."""
    from ..export.teacher import load_teacher
    from .context import prepare_data
    from .runner import _dataset_dir

    work = recipe.resolved_work_dir()
    work.mkdir(parents=True, exist_ok=True)
    dataset = _dataset_dir(recipe, work)
    loaded = load_teacher(recipe.teacher.source, seed=recipe.teacher.seed)
    return generator_context(recipe, prepare_data(recipe, dataset, loaded.tokenizer_file), loaded)


def build_generator_only(recipe: Recipe) -> list[GeneratorRow]:
    """Run only the generator stages of ``recipe`` (no scorer, nothing published), e.g. to measure them;
    ``generator_table(rows)`` (``evaluation.generator_report``) prints the result."""
    return run_generator(standalone_context(recipe), {})
