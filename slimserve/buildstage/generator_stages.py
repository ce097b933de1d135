"""The generator stages of a build: grounded teacher fine-tune -> teacher text -> pruned student ->
(a) off-policy KL -> (b) on-policy KL.

They run after the scorer's stages when the recipe has a ``generator:`` section, each in
``<work_dir>/<stage>/`` with the build's conventions (``config.json``, ``done.json`` written last, resumable
checkpoints). The teacher is the original model (not the scorer's yes/no fine-tuned copy), fine-tuned on
explanations written from each pair's facts (``data.explanations``) when ``finetune.enabled``; from then
on the fine-tuned teacher is the teacher. Every student is evaluated on the same held-out prompts
(test-split members), see ``compression.generator_eval``: in its stage what a gate or the stage's line
reads (KL on the teacher's text; on its own samples where the KL gate compares them). The rest only the
stage table reads, so it runs in the report-only stage ``gen_report`` after the generator is published
(``slimserve up`` serves it meanwhile): every model's decode speed, the pruned student's own samples,
and every model's explanations of the same held-out pairs for the grounding evaluation
(``evaluation.grounding``), checked with the scoring student's decisions when its stages are in the same
work directory.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

from .. import atomic
from ..compression.generator_data import Sampling, TeacherText
from ..compression.trainer import progress_bar
from ..errors import BuildError, UserError
from ..evaluation.generator_report import GeneratorRow
from . import artifacts
from .context import BuildData, dataset_dir, prepare_data, stage_config, stage_inputs
from .generator_recipe import GeneratorSettings
from .recipe import Recipe
from .resumable import StageRunner

log = logging.getLogger(__name__)

GENERATOR_STAGES = ("gen_finetune", "gen_teacher", "gen_prune", "gen_offpolicy", "gen_onpolicy")
FINAL_STAGE = GENERATOR_STAGES[-1]
REPORT_STAGE = "gen_report"  # report-only: runs after the generator is published
ROWS_FILE = "generator_rows.json"
EXPLANATIONS_FILE = "explanations.json"  # in gen_report: held-out explanations per row {label: [{key, text}]}
FREE_PROMPT_KEY = "instruction"  # teacher-text key of a free instruction: instruction/<index>
FREE_PROMPT_TEXT_SEED_OFFSET = 41  # the teacher text's free instructions: teacher_text.seed + this
GROUNDING_FILE = "grounding.json"  # their per-pair checks, rewritten at every run
FINETUNE_SET_FILE = "finetune_set.json"  # the generator teacher's fine-tune texts: [{kind, text, ...}]
HELDOUT_POSITIONS_FILE = (
    "heldout_teacher.npz"  # in gen_teacher: the teacher on its held-out text (TeacherPositions)
)
ZERO_SHOT_ROW = "generator teacher (zero-shot)"
STUDENT_ROWS = {  # stage -> the label of its student's row
    "gen_prune": "generator pruned (osscar)",
    "gen_offpolicy": "generator (a) off-policy",
    "gen_onpolicy": "generator (a)+(b) on-policy",
}


@dataclass
class GeneratorContext:
    """What every generator stage reads."""

    recipe: Recipe
    data: BuildData
    load_teacher: Callable[[], object]  # the teacher (a causal LM in eval mode), loaded on first use
    tokenizer_file: Path
    work: Path
    end_ids: list[int]
    source: str  # the teacher's name (recorded in the published bundle)
    device: str = "cpu"
    load_original: Callable[[], object] = field(init=False, repr=False)  # the teacher as packaged
    _teacher: object = field(default=None, init=False, repr=False)
    _reference: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.load_original = self.load_teacher  # kept: ``replace_teacher`` changes ``load_teacher``

    @property
    def settings(self) -> GeneratorSettings:
        return self.recipe.generator

    @property
    def teacher(self):
        """The teacher of the stage that runs: the original model, then the fine-tuned one."""
        if self._teacher is None:
            self._teacher = self.load_teacher()
        return self._teacher

    @property
    def reference_teacher(self):
        """The teacher that the teacher-forced evaluations score against: its decoding copy at
        ``generation_precision`` (``precision.decoding_copy``: BF16 decoder weights where the CPU has
        BF16 units, the LM head FP32), made once per teacher."""
        from ..compression.precision import decoding_copy

        if self._reference is None:
            self._reference = decoding_copy(self.teacher.eval(), self.settings.generation_precision)
        return self._reference

    def replace_teacher(self, load: Callable[[], object]) -> None:
        """From now on the teacher is what ``load`` returns (loaded when a stage first needs it)."""
        self.load_teacher, self._teacher, self._reference = load, None, None

    def load_student(self, stage: str):
        """A stage's saved model, on the generator's device."""
        return artifacts.load_causal_lm(self.work / stage / "model").to(self.device)

    def text(self, name: str) -> TeacherText:
        return TeacherText.load(self.work / "gen_teacher", name)

    @property
    def teacher_label(self) -> str:
        return "generator teacher (fine-tuned)" if self.settings.finetune.enabled else "generator teacher"

    def grounding_examples(self) -> list:
        """The test-split pairs every model explains for the grounding evaluation."""
        from ..compression.generator_data import pick

        count = self.settings.evaluation.grounding_prompts
        return pick(self.data.examples["test"], count, self.settings.teacher_text.seed) if count else []

    def unseen_skill_examples(self) -> list:
        """The first ``evaluation.unseen_skill_prompts`` grounding pairs, their skills renamed to skills
        no training prompt uses (``data.renaming.HELD_OUT_SKILLS``) and their history titles varied with
        words no training prompt uses (``HELD_OUT_TITLE_WORDS``); seeded, the same for every model."""
        import random

        from ..data.renaming import HELD_OUT_SKILLS, HELD_OUT_TITLE_WORDS, renamed_skills, varied_titles

        rng = random.Random(self.settings.teacher_text.seed)
        count = self.settings.evaluation.unseen_skill_prompts
        return [
            varied_titles(renamed_skills(e, rng, HELD_OUT_SKILLS), rng, HELD_OUT_TITLE_WORDS)
            for e in self.grounding_examples()[:count]
        ]

    def full_match_examples(self) -> list:
        """Up to ``evaluation.full_match_prompts`` test-split pairs whose member has every required skill
        (seeded draw): the published graph explains them too (``generator_served``)."""
        from ..compression.generator_data import pick

        count = self.settings.evaluation.full_match_prompts
        if not count:
            return []
        return pick(full_matches(self.data.examples["test"]), count, self.settings.teacher_text.seed)

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_file))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


UNSEEN = " (unseen skills)"  # the label suffix of a model's explanations of the renamed pairs


def write_explanations(ctx: GeneratorContext, label: str, model, out: Path) -> None:
    """``model`` explains the grounding pairs and the pairs renamed to unseen skills (greedy, decoded
    together: one batch of 48 prompts is one decode where 32 and 16 were two); the texts go to
    ``out/explanations.json`` under ``label`` and ``label + UNSEEN``."""
    from ..compression.generator_data import explain_prompts, generate

    sets = [(ctx.grounding_examples(), label), (ctx.unseen_skill_examples(), label + UNSEEN)]
    sets = [(examples, key) for examples, key in sets if examples]
    if not sets:
        return
    settings = ctx.settings
    examples = [e for chosen, _ in sets for e in chosen]
    prompts = explain_prompts(examples, ctx.tokenizer_file, settings.teacher_text.max_prompt_tokens)
    with progress_bar(len(prompts), f"explanations of {label}") as bar:
        generated = generate(
            model,
            prompts,
            Sampling(settings.evaluation.max_new_tokens, precision=settings.generation_precision),
            ctx.end_ids,
            settings.evaluation.decode_batch_size,
            progress=bar.update,
        )
    path = out / EXPLANATIONS_FILE
    texts = json.loads(path.read_text()) if path.is_file() else {}
    start = 0
    for chosen, key in sets:
        responses = generated.responses[start : start + len(chosen)]
        start += len(chosen)
        texts[key] = [
            {"key": f"{e.member_id}/{e.item_id}", "text": ctx.tokenizer.decode(r, skip_special_tokens=True)}
            for e, r in zip(chosen, responses, strict=True)
        ]
    atomic.write_text(path, json.dumps(texts, indent=1) + "\n")


def _own_samples(ctx: GeneratorContext, label: str, model, row: GeneratorRow, heldout: TeacherText) -> None:
    """``row``'s KL to the teacher on ``model``'s own samples of the ``heldout`` prompts, and their length."""
    from ..compression.generator_eval import evaluate_own_samples

    settings = ctx.settings.evaluation
    sampling = Sampling(
        settings.max_new_tokens,
        settings.sample_temperature,
        seed=ctx.settings.teacher_text.seed,
        precision=ctx.settings.generation_precision,
    )
    with progress_bar(len(heldout.prompts), f"evaluate {label} on own samples") as bar:
        own, samples = evaluate_own_samples(
            model,
            ctx.reference_teacher,
            heldout.prompts,
            sampling,
            ctx.end_ids,
            settings.decode_batch_size,
            bar.update,
        )
    row.kl_own_samples = own.kl
    row.own_sample_tokens = own.tokens / len(samples)


def evaluate(
    ctx: GeneratorContext, label: str, model, own_samples: bool, out: Path | None = None
) -> GeneratorRow:
    """What a gate or the stage's line reads of ``model``: its held-out figures on the teacher's text, its
    size and, with ``own_samples``, its KL on its own samples (the rest of its row: ``run_report``). The
    teacher's own evaluation writes its kept positions to ``out`` (``HELDOUT_POSITIONS_FILE``); a
    student's reads them from stage ``gen_teacher`` instead of running the teacher on its text again."""
    from ..compression.generator_eval import TeacherPositions, evaluate_text, summarise_teacher

    heldout, reference = ctx.text("heldout"), ctx.reference_teacher
    batch_size = ctx.settings.evaluation.batch_size
    kept = ctx.work / "gen_teacher" / HELDOUT_POSITIONS_FILE
    with progress_bar(len(heldout.prompts), f"evaluate {label} on teacher text") as bar:
        if model is ctx.teacher:  # against itself: KL 0
            text, positions = summarise_teacher(
                reference, heldout.prompts, heldout.responses, batch_size, bar.update
            )
            if out is not None:
                positions.save(out / HELDOUT_POSITIONS_FILE)
        else:
            text = evaluate_text(
                model,
                reference,
                heldout.prompts,
                heldout.responses,
                batch_size,
                bar.update,
                TeacherPositions.load(kept) if kept.is_file() else None,
            )
    row = GeneratorRow(label, text.loss, text.kl, text.top1_agreement, notes={"heldout_tokens": text.tokens})
    if model is ctx.teacher:
        row.kl_own_samples = 0.0
    elif own_samples:
        _own_samples(ctx, label, model, row, heldout)
    row.parameters, row.embedding_parameters = artifacts.parameter_counts(model)
    log.info("generator %s: %s", label, row.as_dict())
    return row


def _save_model(ctx: GeneratorContext, model, out: Path) -> None:
    """A standard Hugging Face directory: weights, config, generation config (end tokens) and tokenizer."""
    from ..export.generator_export import save_hf_model

    model.generation_config.eos_token_id = list(ctx.end_ids)
    model.generation_config.pad_token_id = ctx.end_ids[-1]
    save_hf_model(model, out / "model", ctx.tokenizer_file)


def pick_by_verdict(examples, count: int, seed: int) -> list:
    """``count`` training pairs spread evenly over the verdicts their facts call for (on the synthetic
    data a random draw is about 7% ``Strong fit``, too few for the teacher and student to learn it)."""
    from ..compression.generator_data import pick_balanced
    from ..pair_facts import verdict_for

    return pick_balanced(examples, count, seed, lambda e: verdict_for(e.member, e.item))


def full_matches(examples: list) -> list:
    """The pairs whose member has every required skill (and at least one is required)."""
    from ..pair_facts import pair_facts

    return [e for e in examples if pair_facts(e.member, e.item).full_match]


def finetune_set(ctx: GeneratorContext, teacher) -> tuple[list[list[int]], list[list[int]], list[dict]]:
    """(prompts, answers, records) of the teacher's fine-tune: explanations written from the facts of
    ``finetune.examples`` train-split pairs, and free instructions ``teacher`` answers itself (greedy)."""
    from ..compression.generator_data import chat_prompts, explain_prompts, generate
    from ..data.explanations import explanation_rng, general_instructions, write_explanation

    settings, max_prompt = ctx.settings.finetune, ctx.settings.teacher_text.max_prompt_tokens
    examples = pick_by_verdict(ctx.data.examples["train"], settings.examples, settings.seed)
    texts = [
        write_explanation(e.member, e.item, explanation_rng(settings.seed, e.member, e.item))
        for e in examples
    ]
    prompts = explain_prompts(examples, ctx.tokenizer_file, max_prompt)
    end = ctx.end_ids[0]  # end of turn
    answers = [[*e.ids, end] for e in ctx.tokenizer.encode_batch(texts, add_special_tokens=False)]
    records = [
        {"kind": "explanation", "key": f"{e.member_id}/{e.item_id}", "text": t}
        for e, t in zip(examples, texts, strict=True)
    ]
    instructions = general_instructions(settings.general_examples, settings.seed)
    if instructions:
        general = chat_prompts(instructions, ctx.tokenizer_file, max_prompt)
        sampling = Sampling(settings.general_max_new_tokens, precision=ctx.settings.generation_precision)
        with progress_bar(len(general), "teacher answers free instructions") as bar:
            generated = generate(
                teacher,
                general,
                sampling,
                ctx.end_ids,
                ctx.settings.teacher_text.batch_size,
                progress=bar.update,
            )
        prompts += general
        answers += generated.responses
        records += [
            {"kind": "instruction", "prompt": i, "text": ctx.decode(r)}
            for i, r in zip(instructions, generated.responses, strict=True)
        ]
    return prompts, answers, records


def run_finetune(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Fine-tune the teacher on the written explanations (and its own answers to free instructions); the
    result is the teacher from now on. The row is the teacher as loaded (its size here; its grounding and
    speed: ``run_report``)."""
    from ..compression.generator_finetune import finetune_on_answers

    teacher = ctx.teacher
    nan = float("nan")
    row = GeneratorRow(ZERO_SHOT_ROW, nan, nan, nan)
    row.parameters, row.embedding_parameters = artifacts.parameter_counts(teacher)
    prompts, answers, records = finetune_set(ctx, teacher)
    (out / FINETUNE_SET_FILE).write_text(json.dumps(records, indent=1) + "\n")
    settings = ctx.settings.finetune
    report = finetune_on_answers(
        teacher,
        prompts,
        answers,
        settings.train,
        out / "checkpoint.pt",
        settings.train_top_layers,
        settings.precision,
    )
    teacher.eval()
    _save_model(ctx, teacher, out)
    row.notes["finetune"] = {**report.as_dict(), "examples": len(prompts)}
    return [row]


def run_teacher_text(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Write the teacher's text for train prompts (with top-k targets; ``free_prompts`` free
    instructions after the explanation prompts) and held-out prompts, once."""
    from ..compression.generator_data import chat_prompts, explain_prompts, generate, pick
    from ..data.explanations import general_instructions
    from ..data.renaming import renamed_copies, with_renamed_share, with_varied_titles

    settings = ctx.settings.teacher_text
    sampling = Sampling(
        settings.max_new_tokens,
        settings.temperature,
        seed=settings.seed,
        precision=ctx.settings.generation_precision,
    )
    for name, split, count, top_k in (
        ("train", "train", settings.prompts, settings.top_k),
        ("heldout", "test", settings.heldout_prompts, None),
    ):
        pool = ctx.data.examples[split]  # train prompts balanced by verdict, held-out ones as they come
        if name == "train":
            picked = pick_by_verdict(pool, count, settings.seed)
            examples = with_renamed_share(
                picked, settings.renamed_share, settings.seed, settings.invented_share
            )
            examples += renamed_copies(full_matches(picked), settings.full_match_copies, settings.seed + 17)
            examples = with_varied_titles(examples, settings.varied_title_share, settings.seed + 29)
        else:
            examples = pick(pool, count, settings.seed)
        prompts = explain_prompts(examples, ctx.tokenizer_file, settings.max_prompt_tokens)
        keys = [f"{e.member_id}/{e.item_id}" for e in examples]
        if name == "train" and settings.free_prompts:
            free = general_instructions(settings.free_prompts, settings.seed + FREE_PROMPT_TEXT_SEED_OFFSET)
            prompts += chat_prompts(free, ctx.tokenizer_file, settings.max_prompt_tokens)
            keys += [f"{FREE_PROMPT_KEY}/{i}" for i in range(len(free))]
        with progress_bar(len(prompts), f"teacher text, {name}") as bar:
            generated = generate(
                ctx.teacher, prompts, sampling, ctx.end_ids, settings.batch_size, top_k, bar.update
            )
        TeacherText(keys, prompts, generated).save(out, name, ctx.decode)
    return [evaluate(ctx, ctx.teacher_label, ctx.teacher, own_samples=False, out=out)]


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
    return [evaluate(ctx, STUDENT_ROWS["gen_prune"], pruned, own_samples=False)]  # its samples: the report


def run_offpolicy(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Stage (a): forward KL to the teacher on its cached text."""
    from ..compression.generator_distill import distill_offpolicy

    student = ctx.load_student("gen_prune")
    settings = ctx.settings.offpolicy
    report = distill_offpolicy(
        student, ctx.text("train"), settings.train, out / "checkpoint.pt", settings.precision
    )
    _save_model(ctx, student, out)
    row = evaluate(ctx, STUDENT_ROWS["gen_offpolicy"], student, own_samples=True)  # the KL gate's base
    row.notes["train"] = report.as_dict()
    return [row]


def run_onpolicy(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """Stage (b): forward KL on the student's own samples (mixed with teacher text), from stage (a)."""
    from ..compression.generator_distill import OnPolicySettings, distill_onpolicy

    settings = ctx.settings.onpolicy
    student = ctx.load_student("gen_offpolicy")
    text = ctx.text("train")
    policy = OnPolicySettings(
        Sampling(
            settings.max_new_tokens,
            settings.temperature,
            settings.top_p,
            precision=ctx.settings.generation_precision,
        ),
        settings.share,
        ctx.settings.teacher_text.top_k,
        ctx.end_ids,
        settings.rollout_batches,
    )
    report, sampled = distill_onpolicy(
        student,
        ctx.teacher,
        text,
        policy,
        settings.train,
        out / "checkpoint.pt",
        precision_setting=settings.precision,
    )
    for sample in sampled.samples:
        sample["text"] = ctx.decode(sample["response"])
        sample["teacher_response"] = text.responses[sample["prompt_index"]]
    summary = {"batches": sampled.batches, "sampled_tokens": sampled.sampled_tokens, "ended": sampled.ended}
    (out / "onpolicy_samples.json").write_text(json.dumps({**summary, "samples": sampled.samples}) + "\n")
    _save_model(ctx, student, out)
    row = evaluate(ctx, STUDENT_ROWS["gen_onpolicy"], student, own_samples=True)
    row.notes.update(train=report.as_dict(), onpolicy=summary)
    return [row]


RUNNERS: dict[str, Callable[[GeneratorContext, Path], list[GeneratorRow]]] = {
    "gen_finetune": run_finetune,
    "gen_teacher": run_teacher_text,
    "gen_prune": run_prune,
    "gen_offpolicy": run_offpolicy,
    "gen_onpolicy": run_onpolicy,
}


def report_models(ctx: GeneratorContext) -> list[tuple[str, Callable[[], object]]]:
    """(row label, loader) of every model of the generator table, in its order: the teacher as packaged
    (when it is fine-tuned), the teacher, each stage's student."""
    models = [(ZERO_SHOT_ROW, ctx.load_original)] if ctx.settings.finetune.enabled else []
    models.append((ctx.teacher_label, lambda: ctx.teacher))
    models += [(label, partial(ctx.load_student, stage)) for stage, label in STUDENT_ROWS.items()]
    return models


def run_report(ctx: GeneratorContext, out: Path) -> list[GeneratorRow]:
    """The report-only stage ``gen_report``: for every model of the generator table, its decode speed and
    its explanations of the grounding pairs (to ``out``); the pruned student's KL on its own samples (no
    gate reads it). A row each, with those figures only (``complete_rows`` merges them)."""
    from ..compression.generator_eval import decode_tokens_per_s

    nan, heldout = float("nan"), ctx.text("heldout")
    rows = []
    for label, load in report_models(ctx):
        model = load()
        row = GeneratorRow(label, nan, nan, nan)
        if label == STUDENT_ROWS["gen_prune"]:
            _own_samples(ctx, label, model, row, heldout)
        if ctx.settings.evaluation.speed_tokens:
            row.decode_tokens_per_s = decode_tokens_per_s(
                model, heldout.prompts[0], ctx.settings.evaluation.speed_tokens
            )
        write_explanations(ctx, label, model, out)
        rows.append(row)
    return rows


def complete_rows(rows: list[GeneratorRow], measured: list[GeneratorRow]) -> None:
    """Fill ``rows`` with the figures ``run_report`` ``measured`` of the same models."""
    by_label = {r.stage: r for r in measured}
    for row in rows:
        found = by_label.get(row.stage)
        if found is None:
            continue
        row.decode_tokens_per_s = found.decode_tokens_per_s
        if math.isnan(row.kl_own_samples):
            row.kl_own_samples, row.own_sample_tokens = found.kl_own_samples, found.own_sample_tokens


def _gate_failed(stage: str, what: str, gate: str) -> BuildError:
    return BuildError(
        f"quality gate failed at stage {stage!r}: {what} (generator.gates.{gate}); nothing was published"
    )


def check_gates(settings: GeneratorSettings, rows: list[GeneratorRow]) -> None:
    """Raise ``BuildError`` when the final generator misses a KL gate of the recipe. Its grounding gates
    apply to the published graph as served (``generator_served.served_check``: the graph, its head and the
    engine's name copying are what Explain serves); here they fail only a recipe that gives
    them no held-out pairs to measure."""
    gates = settings.gates
    by_stage = {r.stage: r for r in rows}
    offpolicy, final = by_stage["generator (a) off-policy"], rows[-1]
    increase = final.kl_own_samples - offpolicy.kl_own_samples
    if gates.max_kl_increase is not None and not increase <= gates.max_kl_increase:
        raise _gate_failed(
            final.stage,
            f"held-out KL on own samples {final.kl_own_samples:.4f} is {increase:+.4f} from stage (a)'s "
            f"{offpolicy.kl_own_samples:.4f}, the recipe allows at most {gates.max_kl_increase:+.4f}",
            "max_kl_increase",
        )
    if gates.min_top1_agreement is not None and not final.top1_agreement >= gates.min_top1_agreement:
        raise _gate_failed(
            final.stage,
            f"top-1 agreement with the teacher {final.top1_agreement:.4f} is below {gates.min_top1_agreement:.4f}",
            "min_top1_agreement",
        )
    if not settings.evaluation.grounding_prompts:  # else they gate the published graph as served
        check_grounding_gates(settings, final)


def check_grounding_gates(settings: GeneratorSettings, final: GeneratorRow) -> None:
    """Raise ``BuildError`` when ``final``'s grounding figures miss a gate of the recipe."""
    gates = settings.gates
    measured = f"on {final.grounding_pairs} held-out explanations"
    unseen = f"on {final.unseen_pairs} held-out pairs renamed to unseen skills"
    checks = [
        (final.hallucination_rate, gates.max_hallucination_rate, "hallucination rate", "max_hallucination_rate", measured),
        (final.coverage, gates.min_coverage, "coverage of shared skills", "min_coverage", measured),
        (final.verdict_agreement, gates.min_verdict_agreement, "verdict agreement with the facts",
         "min_verdict_agreement", measured),
        (final.decision_agreement, gates.min_decision_agreement, "verdict agreement with the scoring student",
         "min_decision_agreement", measured),
        (final.unseen_hallucination_rate, gates.max_unseen_hallucination_rate, "hallucination rate",
         "max_unseen_hallucination_rate", unseen),
        (final.unseen_coverage, gates.min_unseen_coverage, "coverage of shared skills", "min_unseen_coverage",
         unseen),
    ]  # fmt: skip
    if final.full_match_pairs:  # only the published graph's check explains the full matches
        checks.append((final.full_match_hallucination_rate, gates.max_full_match_hallucination_rate,
                       "hallucination rate", "max_full_match_hallucination_rate",
                       f"on {final.full_match_pairs} test-split full matches"))  # fmt: skip
    for value, limit, name, gate, where in checks:
        if limit is None:
            continue
        upper = gate.startswith("max_")
        if not (value <= limit if upper else value >= limit):
            relation = "above" if upper else "below"
            raise _gate_failed(final.stage, f"{name} {value:.3f} {where} is {relation} {limit:.3f}", gate)


def active_stages(settings: GeneratorSettings) -> tuple[str, ...]:
    """The generator stages a recipe runs (``gen_finetune`` only when ``finetune.enabled``)."""
    return tuple(s for s in GENERATOR_STAGES if s != "gen_finetune" or settings.finetune.enabled)


def scorer_decisions(ctx: GeneratorContext, examples: list) -> tuple[list[bool] | None, str]:
    """The scoring student's decision (engage: score = logit(yes) - logit(no) > 0) for test-split
    ``examples``, from its test-split logits when the scorer's stages ran in the same work directory:
    the pruned + re-distilled student (INT8 is its quantized copy). (None, reason) otherwise."""
    path = ctx.work / "redistill" / "logits_test.npy"
    if not path.is_file():
        return None, "no scoring student in the work directory"
    logits = artifacts.load_array(path.parent, "logits_test")
    test = ctx.data.examples["test"]
    if len(logits) != len(test):
        return None, "the scoring student's test logits do not match the test split"
    index = {(e.member_id, e.item_id): i for i, e in enumerate(test)}
    rows = [index[(e.member_id, e.item_id)] for e in examples]
    return [bool(logits[i, 0] - logits[i, 1] > 0) for i in rows], "redistill (pruned + re-distilled scorer)"


def attach_grounding(ctx: GeneratorContext, rows: list[GeneratorRow]) -> None:
    """Check every row's held-out explanations (``gen_report``'s) against the pairs' facts (and the
    scorer's decisions), and its explanations of the pairs renamed to unseen skills: fills the rows'
    grounding figures and writes the per-pair checks to ``gen_report/grounding.json``."""
    examples = ctx.grounding_examples()
    if not examples:
        return
    decisions, source = scorer_decisions(ctx, examples)
    unseen = ctx.unseen_skill_examples()
    path = ctx.work / REPORT_STAGE / EXPLANATIONS_FILE
    texts = json.loads(path.read_text()) if path.is_file() else {}
    checks_out = {}
    for row in rows:
        summary = _grounding_of(texts.get(row.stage, []), examples, decisions, checks_out, row.stage)
        if summary is not None:
            row.set_grounding(summary, source if decisions is not None else None)
        label = row.stage + UNSEEN
        summary = _grounding_of(texts.get(label, []), unseen, None, checks_out, label) if unseen else None
        if summary is not None:
            row.set_unseen_grounding(summary)
    if checks_out:
        atomic.write_text(path.parent / GROUNDING_FILE, json.dumps(checks_out, indent=1) + "\n")


def _grounding_of(written: list[dict], examples: list, decisions, checks_out: dict, label: str):
    """The ``GroundingSummary`` of explanations ``written`` of ``examples`` (their checks go to
    ``checks_out[label]``), or None when they explain other pairs (stale) or none."""
    from ..evaluation.grounding import evaluate_grounding

    texts = {t["key"]: t["text"] for t in written}
    keys = [f"{e.member_id}/{e.item_id}" for e in examples]
    if [k for k in keys if k in texts] != keys:
        return None
    pairs = [(e.member, e.item) for e in examples]
    summary, checks = evaluate_grounding(pairs, [texts[k] for k in keys], decisions)
    checks_out[label] = [
        {"key": k, "text": texts[k], **c.as_dict()} for k, c in zip(keys, checks, strict=True)
    ]
    return summary


def _quality(rows: list[GeneratorRow]) -> str:
    """The closing words of a stage's line: its (last) model's KL to the teacher on the teacher's text."""
    if not rows:
        return ""
    row = rows[-1]
    finetune = row.notes.get("finetune")
    if finetune is not None:  # the teacher's fine-tune: no teacher text to compare with yet
        loss = finetune.get("final_loss")
        return (
            f": generator teacher fine-tuned on {finetune['examples']} examples, {finetune['steps']} steps, "
            f"final loss {float('nan') if loss is None else loss:.3f} (its grounding: the generator table)"
        )
    return f": {row.stage}, KL to teacher {row.kl_teacher_text:.3f}, top-1 agreement {row.top1_agreement:.3f}"


def load_rows(stage_dir: Path, name: str = ROWS_FILE) -> list[GeneratorRow]:
    """A generator stage's saved rows."""
    return [GeneratorRow.from_dict(d) for d in json.loads((stage_dir / name).read_text())]


def _report_quality(rows: list[GeneratorRow]) -> str:
    """The closing words of ``gen_report``'s line."""
    return f": {len(rows)} models' explanations and decode speeds (their grounding: the generator table)"


def _stage_runner(ctx: GeneratorContext, seconds: dict[str, float], stage: str, apart=None) -> StageRunner:
    quality = _report_quality if stage == REPORT_STAGE else _quality
    return StageRunner(
        ctx.work,
        seconds,
        rows_file=ROWS_FILE,
        load_rows=load_rows,
        quality=quality,
        inputs=stage_inputs,
        apart=apart,
    )


def _run_stage(
    ctx: GeneratorContext, seconds: dict[str, float], stage: str, apart=None
) -> list[GeneratorRow]:
    """Run (or skip, when done with the same settings) one generator stage, ``gen_report`` included; with
    ``apart`` (``StageRunner.apart``) in a process of its own."""
    function = run_report if stage == REPORT_STAGE else RUNNERS[stage]
    runner = _stage_runner(ctx, seconds, stage, apart)
    return runner.run(stage, stage_config(ctx.recipe, stage), partial(function, ctx))


def run_generator(ctx: GeneratorContext, seconds: dict[str, float], apart=None) -> list[GeneratorRow]:
    """Run (or skip, when done with the same settings) every generator stage, then check the KL gates;
    with ``apart`` (``StageRunner.apart``) each stage that has to run does in a process of its own. The
    rows lack what only the report reads until ``report_generator`` completes them."""
    for stage in active_stages(ctx.settings):
        _run_stage(ctx, seconds, stage, apart)
        if stage == "gen_finetune":  # the fine-tuned teacher is the teacher of every later stage
            use_finetuned_teacher(ctx)
    rows = saved_rows(ctx)
    check_gates(ctx.settings, rows)
    return rows


def run_stage(recipe: Recipe, stage: str, seconds: dict[str, float]) -> list[GeneratorRow]:
    """Run (or skip, when done) the generator's ``stage`` from the recipe and the work directory alone:
    the entry of its own process (``stage_process``)."""
    ctx = standalone_context(recipe)
    if stage != "gen_finetune" and "gen_finetune" in active_stages(ctx.settings):
        use_finetuned_teacher(ctx)
    return _run_stage(ctx, seconds, stage)


def use_finetuned_teacher(ctx: GeneratorContext) -> None:
    """From now on ``ctx``'s teacher is the one stage ``gen_finetune`` saved."""
    ctx.replace_teacher(lambda: ctx.load_student("gen_finetune").eval())


def saved_rows(ctx: GeneratorContext) -> list[GeneratorRow]:
    """Every active stage's rows as saved (whether the stage ran now or before)."""
    return [row for stage in active_stages(ctx.settings) for row in load_rows(ctx.work / stage)]


def report_generator(
    ctx: GeneratorContext, seconds: dict[str, float], rows: list[GeneratorRow], apart=None
) -> None:
    """Run (or skip) the report-only stage ``gen_report`` after ``run_generator`` (with ``apart``, in a
    process of its own); complete its ``rows`` with the stage's figures and every model's grounding."""
    measured = _run_stage(ctx, seconds, REPORT_STAGE, apart)
    complete_rows(rows, measured)
    attach_grounding(ctx, rows)


def final_model_dir(recipe: Recipe) -> Path:
    """The distilled generator student's Hugging Face directory (weights, config, tokenizer.json)."""
    return recipe.resolved_work_dir() / FINAL_STAGE / "model"


def publish(ctx: GeneratorContext, check_graph: Callable[[Path], dict] | None = None) -> Path:
    """Export the final student (FP32 greedy parity gate, optional weight-only quantization), run
    ``check_graph`` on the graph (the build passes ``generator_served.served_check``: its grounding as
    served, gated) and publish it as a new version of the Triton model ``generator``; returns the
    version directory."""
    from ..export.generator_config import GeneratorExportConfig
    from ..export.generator_repository import publish_generator

    settings = ctx.settings.publish
    config = GeneratorExportConfig(
        **settings.model_dump(exclude={"quantize"}),
        quantize=None if settings.quantize == "none" else settings.quantize,
        model_repository=ctx.recipe.publish.model_repository,
        source_model=f"{ctx.source} (generator student)",
        eos_token_ids=ctx.end_ids,
    )
    return publish_generator(
        artifacts.load_causal_lm(final_model_dir(ctx.recipe)),
        ctx.tokenizer_file,
        config,
        written_tokens(ctx) if config.output_vocab is not None else (),
        check_graph,
    )


def written_tokens(ctx: GeneratorContext) -> set[int]:
    """Every token id of the texts the generator learned to write: the teacher's training text and the
    teacher's own fine-tune answers (kept in a shortlisted LM head, ``publish.output_vocab``)."""
    ids = {token for response in ctx.text("train").responses for token in response}
    finetune = ctx.work / "gen_finetune" / FINETUNE_SET_FILE
    if finetune.is_file():
        texts = [record["text"] for record in json.loads(finetune.read_text())]
        ids |= {token for e in ctx.tokenizer.encode_batch(texts, add_special_tokens=False) for token in e.ids}
    return ids


def generator_context(recipe: Recipe, data: BuildData, loaded) -> GeneratorContext:
    """The generator stages' context; its teacher is an own copy of ``loaded`` (a ``LazyTeacher``),
    taken when a stage first needs it."""
    import torch

    from ..compression.generator_data import end_token_ids

    device = recipe.generator.resolved_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("generator.device: 'cuda' but torch sees no CUDA device (use 'cpu' or 'auto')")
    work = recipe.resolved_work_dir()
    end_ids = end_token_ids(loaded.tokenizer_file)
    return GeneratorContext(
        recipe,
        data,
        lambda: loaded.fresh().to(device),
        loaded.tokenizer_file,
        work,
        end_ids,
        loaded.name,
        device,
    )


def standalone_context(recipe: Recipe) -> GeneratorContext:
    """The generator stages' context without the scorer's stages (data written or reused, teacher loaded)."""
    from ..models.teacher import LazyTeacher

    work = recipe.resolved_work_dir()
    work.mkdir(parents=True, exist_ok=True)
    dataset = dataset_dir(recipe, work)
    loaded = LazyTeacher(recipe.teacher.source, seed=recipe.teacher.seed)
    return generator_context(recipe, prepare_data(recipe, dataset, loaded.tokenizer_file), loaded)


def build_generator_only(recipe: Recipe) -> list[GeneratorRow]:
    """Run only the generator stages of ``recipe`` and their report (no scorer, nothing published), e.g.
    to measure them; ``generator_table(rows)`` (``evaluation.generator_report``) prints the result."""
    ctx, seconds = standalone_context(recipe), {}
    rows = run_generator(ctx, seconds)
    report_generator(ctx, seconds, rows)
    return rows
