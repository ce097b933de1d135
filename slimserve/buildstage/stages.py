"""The model stages of a build. Each reads the previous stage's output and writes its own directory.

Every pass over examples (the teacher's cache, fine-tune and soft labels, distillation, pruning
calibration, re-distillation, evaluation) runs multi-item: a member's examples share one prefix pass.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..compression import precision
from ..compression.trainer import progress_bar
from ..evaluation.report import StageRow, quality_row
from ..models.scorer_graph import ScorerGraph
from . import artifacts
from .context import BuildData
from .recipe import Recipe
from .training import cached_logits, distill, finetune_top_layers, teacher_split

log = logging.getLogger(__name__)


def margins(logits: np.ndarray) -> np.ndarray:
    """logit(yes) - logit(no): the score the service ranks by."""
    return logits[:, 0] - logits[:, 1]


def evaluate(
    stage: str, logits: np.ndarray, data: BuildData, teacher_test: np.ndarray | None, model=None
) -> StageRow:
    """Test-split quality of a stage from its (yes, no) logits; see ``evaluate_scores``."""
    return evaluate_scores(stage, margins(logits), data, teacher_test, model)


def evaluate_scores(
    stage: str, scores: np.ndarray, data: BuildData, teacher_test: np.ndarray | None, model=None
) -> StageRow:
    """Test-split quality of a stage's scores (and its parameter counts when the model is given);
    ``teacher_test`` holds the teacher's (yes, no) logits on the same examples."""
    teacher = None if teacher_test is None else margins(teacher_test)
    row = quality_row(stage, scores, data.labels["test"], data.member_ids["test"], teacher)
    if model is not None:
        row.parameters, row.embedding_parameters = artifacts.parameter_counts(model)
    return row


def label_ids(data: BuildData) -> tuple[int, int]:
    """Token ids of the yes and no label words."""
    from ..prompts import NO_WORD, YES_WORD

    return data.tokenizer.token_id(YES_WORD), data.tokenizer.token_id(NO_WORD)


def run_teacher(recipe: Recipe, data: BuildData, loaded_model, out: Path) -> list[StageRow]:
    """Cache the frozen layers once (per member: its prefix once, each item), evaluate, fine-tune the
    top layers, evaluate, soft-label. The cache and the fine-tune run at the teacher's ``precision``;
    the evaluations and the soft labels are FP32."""
    settings = recipe.teacher
    with precision.logged(settings.precision, "teacher stage: frozen-layer cache and fine-tune"):
        return _teacher_passes(settings, data, loaded_model, out)


def _teacher_passes(settings, data: BuildData, loaded_model, out: Path) -> list[StageRow]:
    """``run_teacher``'s passes, inside its precision block."""
    from ..compression.split_scorer import MemberHiddenCache

    graph = ScorerGraph(loaded_model, *label_ids(data)).eval()
    split = teacher_split(graph, settings.train_top_layers)
    caches = {}
    for name in ("train", "validation", "test", "pool"):
        if data.sequences[name]:
            with (
                precision.compute(),
                progress_bar(len(data.sequences[name]), f"teacher layers 1-{split.cut}, {name}") as bar,
            ):
                caches[name] = MemberHiddenCache(split, data.groups[name], progress=bar.update)
    base = cached_logits(split, {"test": caches["test"]})["test"]
    rows = [evaluate("teacher", base, data, None, loaded_model)]
    if settings.finetune:
        validation = (caches["validation"], data.labels["validation"]) if "validation" in caches else None
        report = finetune_top_layers(
            split, caches["train"], data.labels["train"], settings.train, out / "checkpoint.pt", validation
        )
        log.info("teacher fine-tune: %s", report.as_dict())
    logits = cached_logits(split, caches)
    rows.append(evaluate("teacher fine-tuned", logits["test"], data, None, loaded_model))
    artifacts.save_causal_lm(loaded_model, out / "model")
    artifacts.save_arrays(out, base_test=base, **{f"logits_{k}": v for k, v in logits.items()})
    return rows


def _distill_on(
    student_lm, data: BuildData, teacher_dir: Path, settings, out: Path, desc: str
) -> ScorerGraph:
    from ..compression.batches import merge_groups

    graph = ScorerGraph(student_lm, *label_ids(data)).eval()
    groups = list(data.groups["train"])
    teacher = artifacts.load_array(teacher_dir, "logits_train")
    labels = data.labels["train"]
    if settings.use_pool and data.sequences["pool"]:
        offset = len(data.sequences["train"])
        groups += [group.shifted(offset) for group in data.groups["pool"]]
        teacher = np.concatenate([teacher, artifacts.load_array(teacher_dir, "logits_pool")])
        labels = np.concatenate([labels, data.labels["pool"]])
    # A train member's pool pairs join its labelled examples: one prefix pass for both.
    groups = merge_groups(groups)
    report = distill(graph, groups, teacher, labels, settings, out / "checkpoint.pt", desc)
    log.info("%s: %s", desc, report.as_dict())
    return graph


def _test_logits(graph: ScorerGraph, data: BuildData) -> np.ndarray:
    from ..compression.split_scorer import multi_item_logits

    with progress_bar(len(data.sequences["test"]), "evaluate on test") as bar:
        return multi_item_logits(graph, data.groups["test"], progress=bar.update)


def _prune(model, data: BuildData, recipe: Recipe, **sizes):
    """Prune on the calibration examples run multi-item (prefix and item tokens both calibrate)."""
    from ..compression.batches import multi_item_batch, pack_groups
    from ..compression.calibration import MultiItemCalibration
    from ..compression.prune import PruneConfig, prune_model

    groups = data.calibration_groups(recipe.data.calibration_examples)
    packed = pack_groups([len(g) for g in groups], range(len(groups)), 8)
    batches = [MultiItemCalibration(*multi_item_batch(groups, chosen).tensors()) for chosen in packed]
    pruned, report = prune_model(model, batches, PruneConfig(**sizes))
    return pruned, report


def run_distill(recipe: Recipe, data: BuildData, teacher_dir: Path, out: Path) -> list[StageRow]:
    """Student = the fine-tuned teacher's most important layers, distilled on train + pool."""
    teacher_lm = artifacts.load_causal_lm(teacher_dir / "model")
    student = recipe.student
    student_lm, _ = _prune(
        teacher_lm,
        data,
        recipe,
        layers_keep=student.layers,
        layer_calibration_tokens=student.layer_calibration_tokens,
    )
    graph = _distill_on(student_lm, data, teacher_dir, recipe.student.distill, out, "distill")
    logits = _test_logits(graph, data)
    artifacts.save_causal_lm(student_lm, out / "model")
    artifacts.save_arrays(out, logits_test=logits)
    return [
        evaluate(
            "student distilled", logits, data, artifacts.load_array(teacher_dir, "logits_test"), student_lm
        )
    ]


def run_prune(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path
) -> list[StageRow]:
    """OSSCAR-style pruning of the distilled student (the baselines beside it: ``run_prune_baselines``)."""
    student_lm = artifacts.load_causal_lm(student_dir / "model")
    pruned, logits, row = _pruned_and_evaluated(student_lm, data, recipe, teacher_dir, "osscar")
    artifacts.save_causal_lm(pruned, out / "model")
    artifacts.save_arrays(out, logits_test=logits)
    return [row]


def run_prune_baselines(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path
) -> list[StageRow]:
    """The baselines of OSSCAR's size: magnitude with the same closed-form re-fit of the kept weights
    (the fair one: only the choice of units differs) and plain magnitude (original weights). Only the
    stage table reads them, so ``slimserve up`` runs them after the scorer is published."""
    rows = []
    for method in ("magnitude+refit", "magnitude"):
        student_lm = artifacts.load_causal_lm(student_dir / "model")
        *_, row = _pruned_and_evaluated(student_lm, data, recipe, teacher_dir, method)
        row.notes["baseline"] = True  # compared, not carried on
        rows.append(row)
    return rows


def _pruned_and_evaluated(student_lm, data: BuildData, recipe: Recipe, teacher_dir: Path, method: str):
    """(pruned model, its test logits, its row) for one pruning ``method`` at the recipe's sizes."""
    settings = recipe.prune
    sizes = {"mlp_keep": settings.mlp_keep, "heads_per_kv_group": settings.heads_per_kv_group}
    pruned, _ = _prune(student_lm, data, recipe, method=method, **sizes)
    logits = _test_logits(ScorerGraph(pruned, *label_ids(data)).eval(), data)
    teacher_test = artifacts.load_array(teacher_dir, "logits_test")
    return pruned, logits, evaluate(f"pruned ({method})", logits, data, teacher_test, pruned)


def run_redistill(
    recipe: Recipe, data: BuildData, teacher_dir: Path, pruned_dir: Path, out: Path
) -> list[StageRow]:
    """Re-distill the pruned student."""
    student_lm = artifacts.load_causal_lm(pruned_dir / "model")
    graph = _distill_on(student_lm, data, teacher_dir, recipe.prune.redistill, out, "re-distill")
    logits = _test_logits(graph, data)
    artifacts.save_causal_lm(student_lm, out / "model")
    artifacts.save_arrays(out, logits_test=logits)
    teacher_test = artifacts.load_array(teacher_dir, "logits_test")
    return [evaluate("pruned + re-distilled", logits, data, teacher_test, student_lm)]
