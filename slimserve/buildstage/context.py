"""What every build stage shares: the settings its output depends on (``stage_config``), the dataset
(``dataset_dir``) and the data (examples per split, their tokens as member groups and single sequences,
labels and members)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compression.batches import MemberGroup, encode_member_groups
from ..tokenization import PromptTokenizer
from . import artifacts
from .recipe import Recipe

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test", "pool")


def _dump(model) -> dict:
    return model.model_dump(mode="json")


def _scorer_data(recipe: Recipe) -> dict:
    from ..prompts import SCORING_TEMPLATE_VERSION

    # The prompt template is upstream of everything: a new template re-runs every stage.
    return {"data": {**_dump(recipe.data), "prompt_template": SCORING_TEMPLATE_VERSION}}


def _on_this_machine(setting, device: str = "cpu") -> str:
    """What a precision setting means on this machine's ``device`` (a stage trained at another one
    re-runs)."""
    from ..compression.precision import resolve

    return resolve(setting, device)


def _training_settings(settings, device: str = "cpu") -> dict:
    """A training stage's settings, its precision as resolved here (on ``device``) and only where BF16
    (FP32 builds made before the setting existed keep their stage ids)."""
    dump = settings.model_dump(mode="json", exclude={"precision"})
    chosen = _on_this_machine(settings.precision, device)
    return dump if chosen == "fp32" else {**dump, "precision": chosen}


def _generator_training(recipe: Recipe, settings) -> dict:
    """A generator training stage's settings, its precision resolved on the generator's device."""
    return _training_settings(settings, recipe.generator.resolved_device())


# Evaluation settings only the published graph's check reads (``generator_served``): no stage depends on them.
_PUBLISH_CHECK_ONLY = {"full_match_prompts"}


def _generator_base(recipe: Recipe) -> dict:
    """What every generator stage depends on: the data, the original teacher, its text and evaluation,
    and its fine-tune (and the explain prompt template and the explanation writer's version: a new one
    re-runs every generator stage)."""
    from ..data.explanations import WRITER_VERSION
    from ..prompts import EXPLAIN_TEMPLATE_VERSION

    g = recipe.generator
    base = {
        "data": _dump(recipe.data),
        "prompt_template": EXPLAIN_TEMPLATE_VERSION,
        "explanation_writer": WRITER_VERSION,
        "teacher": {"source": recipe.teacher.source, "seed": recipe.teacher.seed},
        "teacher_text": _dump(g.teacher_text),
        "evaluation": g.evaluation.model_dump(mode="json", exclude=_PUBLISH_CHECK_ONLY),
        "finetune": _generator_training(recipe, g.finetune) if g.finetune.enabled else {"enabled": False},
    }
    generation = _on_this_machine(g.generation_precision, g.resolved_device())
    # FP32 generation keeps the stage ids of builds made before the setting existed
    return base if generation == "fp32" else {**base, "generation_precision": generation}


# The teacher-text settings the fine-tune reads (its prompts' length, its free answers' decode batch).
_FINETUNE_TEXT_FIELDS = {"max_prompt_tokens", "batch_size"}


def _generator_finetune(recipe: Recipe) -> dict:
    """The fine-tune's settings: the generator base without what it never reads (the evaluation, the
    teacher text's other fields), so a change of the distillation prompts keeps the fine-tuned teacher."""
    base = {k: v for k, v in _generator_base(recipe).items() if k != "evaluation"}
    text = recipe.generator.teacher_text.model_dump(mode="json", include=_FINETUNE_TEXT_FIELDS)
    return {**base, "teacher_text": text}


# stage -> (the stage whose settings it builds on, the settings it adds)
UPSTREAM: dict[str, tuple[str | None, Callable[[Recipe], dict]]] = {
    "data": (None, _scorer_data),
    "teacher": (
        "data",
        lambda r: {"teacher": _dump(r.teacher), "precision": _on_this_machine(r.teacher.precision)},
    ),
    "distill": (
        "teacher",
        lambda r: {"student": {**_dump(r.student), "distill": _training_settings(r.student.distill)}},
    ),
    "prune": ("distill", lambda r: {"prune": r.prune.model_dump(mode="json", exclude={"redistill"})}),
    "prune_baselines": ("prune", lambda r: {}),
    "redistill": ("prune", lambda r: {"redistill": _training_settings(r.prune.redistill)}),
    "int8": (
        "redistill",
        lambda r: {
            "quantize": _dump(r.quantize),
            "buckets": list(r.publish.length_buckets),
            "onnx_exporter": r.publish.onnx_exporter,
            # multi-item: the published graph is gated against the student's scores, the single-sequence
            # INT8 graph is report-only (stage int8_single); builds before this re-run the stage once
            "multi_item_reference": "re-distilled student",
        },
    ),
    "int8_single": ("int8", lambda r: {}),
    "speed": ("int8", lambda r: {"speed_seconds": r.speed_seconds}),
    "tensorrt": (
        "redistill",
        lambda r: {
            "tensorrt": r.tensorrt.model_dump(mode="json", exclude={"instance_count", "warmup_max_batch"}),
            "buckets": list(r.publish.length_buckets),
            "max_batch_size": r.publish.max_batch_size,
            "onnx_exporter": r.publish.onnx_exporter,
        },
    ),
    "gen_finetune": (None, _generator_finetune),
    "gen_teacher": (None, _generator_base),
    "gen_prune": ("gen_teacher", lambda r: {"student": _dump(r.generator.student)}),
    "gen_offpolicy": ("gen_prune", lambda r: {"offpolicy": _generator_training(r, r.generator.offpolicy)}),
    "gen_onpolicy": ("gen_offpolicy", lambda r: {"onpolicy": _generator_training(r, r.generator.onpolicy)}),
    "gen_report": ("gen_onpolicy", lambda r: {}),
}


# stage -> where its settings (``stage_config``) hold the precision it trained at, resolved on the
# machine that ran it; absent: FP32. ``gen_teacher`` trains nothing: its work is the teacher's text,
# decoded at ``generator.generation_precision``.
TRAINED_PRECISION_KEYS: dict[str, tuple[str, ...]] = {
    "teacher": ("precision",),
    "distill": ("student", "distill", "precision"),
    "redistill": ("redistill", "precision"),
    "gen_finetune": ("finetune", "precision"),
    "gen_teacher": ("generation_precision",),
    "gen_offpolicy": ("offpolicy", "precision"),
    "gen_onpolicy": ("onpolicy", "precision"),
}


def trained_precision(config: dict, stage: str) -> str:
    """The precision (fp32 or bf16) that ``stage``'s settings ``config`` say its training passes ran at."""
    value = config
    for key in TRAINED_PRECISION_KEYS.get(stage, ()):
        value = value.get(key) if isinstance(value, dict) else None
    return value if value in ("fp32", "bf16") else "fp32"


# stage -> the stages whose outputs it reads (besides the data): when one of them runs again, it does too
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "teacher": ("data",),
    "distill": ("teacher",),
    "prune": ("teacher", "distill"),
    "redistill": ("teacher", "prune"),
    "prune_baselines": ("teacher", "distill"),
    "int8": ("redistill",),
    "int8_single": ("teacher", "redistill", "int8"),
    "speed": ("teacher", "int8", "int8_single"),
    "gen_finetune": ("data",),
    "gen_teacher": ("data", "gen_finetune"),
    "gen_prune": ("gen_teacher",),
    "gen_offpolicy": ("gen_teacher", "gen_prune"),
    "gen_onpolicy": ("gen_teacher", "gen_offpolicy"),
    "gen_report": ("gen_finetune", "gen_teacher", "gen_prune", "gen_offpolicy", "gen_onpolicy"),
}


def stage_inputs(stage: str) -> tuple[str, ...]:
    """The stages whose outputs ``stage`` reads (``tensorrt_sm<cc>`` reads the re-distilled student)."""
    return ("teacher", "redistill") if stage.startswith("tensorrt") else STAGE_INPUTS.get(stage, ())


def stage_config(recipe: Recipe, stage: str) -> dict:
    """The settings a stage's output depends on: its own and everything upstream (a changed setting
    re-runs its stage and the stages after it, not those before)."""
    if stage not in UPSTREAM:
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join(UPSTREAM)})")
    parent, own = UPSTREAM[stage]
    return {**(stage_config(recipe, parent) if parent else {}), **own(recipe)}


def dataset_dir(recipe: Recipe, work: Path) -> Path:
    """The recipe's dataset directory, or the synthetic dataset written once into ``<work>/data``."""
    if recipe.data.dataset is not None:
        return recipe.data.dataset
    from ..data.synth import SynthConfig, write_synthetic

    target = work / "data" / "dataset"
    config = stage_config(recipe, "data")
    if not artifacts.is_done(work / "data", config):
        artifacts.reset(work / "data")
        write_synthetic(SynthConfig(**recipe.data.synth), target)
        artifacts.mark_done(work / "data", config)
    return target


@dataclass
class BuildData:
    """Examples, tokens, labels (-1 in the pool) and member ids per split.

    ``groups``: each split's examples grouped by member (member prefix tokens, item suffix tokens, the
    examples' indices), what multi-item scoring runs; ``sequences``: every example's single sequence
    ``prefix + item`` (the same tokens, for the single-sequence graph, the export and INT8).
    """

    tokenizer: PromptTokenizer
    examples: dict[str, list]
    sequences: dict[str, list[list[int]]]
    labels: dict[str, np.ndarray]
    member_ids: dict[str, list[str]]
    bayes_optimal_auc: float | None
    groups: dict[str, list[MemberGroup]] = field(default_factory=dict)

    def calibration(self, count: int) -> list[list[int]]:
        """The first ``count`` training prompts (real prompts for pruning and INT8 calibration)."""
        return self.sequences["train"][:count]

    def calibration_groups(self, count: int) -> list[MemberGroup]:
        """The same ``count`` training examples as ``calibration``, as member groups."""
        chosen = []
        for group in self.groups["train"]:
            keep = group.indices < count
            if keep.any():
                items = [item for item, k in zip(group.items, keep, strict=True) if k]
                chosen.append(MemberGroup(group.prefix, items, group.indices[keep]))
        return chosen


def prepare_data(recipe: Recipe, dataset_dir: Path, tokenizer_file: Path) -> BuildData:
    """Load the dataset, split by member, cap each split, tokenize."""
    from ..data.records import load_dataset
    from ..data.splits import split_dataset

    settings = recipe.data
    dataset = load_dataset(dataset_dir)
    splits = split_dataset(dataset, seed=settings.split_seed)
    caps = {
        "train": settings.max_train,
        "validation": settings.max_validation,
        "test": settings.max_test,
        "pool": settings.max_pool,
    }
    tokenizer = PromptTokenizer(tokenizer_file, max_length=max(recipe.publish.length_buckets))
    examples = {name: splits.by_name(name)[: caps[name]] for name in SPLITS if name != "pool"}
    examples["pool"] = trained_members_pool(splits.pool, examples["train"], caps["pool"])
    split = recipe.publish.prompt_split()
    encoded = {name: encode_member_groups(items, tokenizer, split) for name, items in examples.items()}
    groups = {name: value[0] for name, value in encoded.items()}
    sequences = {name: value[1] for name, value in encoded.items()}
    labels = {
        name: np.array([-1 if e.label is None else e.label for e in items], dtype=np.int64)
        for name, items in examples.items()
    }
    member_ids = {name: [e.member_id for e in items] for name, items in examples.items()}
    bayes = _bayes_optimal_auc(dataset_dir, examples["test"], labels["test"])
    log.info("data: %s", ", ".join(f"{n} {len(examples[n])} ({len(groups[n])} members)" for n in SPLITS))
    return BuildData(tokenizer, examples, sequences, labels, member_ids, bayes, groups)


def trained_members_pool(pool: list, train: list, count: int) -> list:
    """The first ``count`` pool pairs of members in ``train``: distillation then reads each member once
    for its labelled and its pool pairs (one multi-item prefix pass), instead of once more per pool pair
    of a member seen nowhere else."""
    members = {e.member_id for e in train}
    return [e for e in pool if e.member_id in members][:count]


def _bayes_optimal_auc(dataset_dir: Path, examples: list, labels: np.ndarray) -> float | None:
    """AUC of the generator's true probabilities on exactly these test examples (synthetic data only)."""
    from ..data.records import load_manifest
    from ..data.synth import oracle_probabilities
    from ..evaluation.metrics import auc

    manifest = load_manifest(dataset_dir)
    if not manifest or not examples:
        return None
    return auc(labels, oracle_probabilities(examples, manifest))
