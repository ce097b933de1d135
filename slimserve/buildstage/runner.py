"""``slimserve build``: run a recipe's stages in order, resumable, gated, reported, then publish.

Every stage writes ``<work_dir>/<stage>/`` with its outputs, ``config.json`` (its resolved settings)
and a ``done.json`` marker written last; a rerun skips stages whose marker matches their settings, so an
interrupted build resumes from the last finished stage (and a stage resumes from its last checkpoint).
The scorer, generator (``generator_stages``) and TensorRT (``tensorrt_stage``) stages all run through
``resumable.StageRunner``, with the settings ``context.stage_config`` gives each.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import atomic
from ..errors import BuildError
from ..evaluation.report import StageRow, markdown_table
from . import artifacts, generator_stages, scorer_stages, stage_process
from .context import BuildData, dataset_dir, prepare_data, stage_config
from .generator_served import explain_copies_names, explain_penalty, served_check, served_rows
from .recipe import Recipe

log = logging.getLogger(__name__)

STAGES = (
    "data", "teacher", "distill", "prune", "redistill", "int8", "prune_baselines", "int8_single", "speed", "publish"
)  # fmt: skip
# a rerun of these alone publishes nothing (int8_single: multi-item recipes only)
REPORT_ONLY_STAGES = ("prune_baselines", "int8_single", artifacts.SPEED_STAGE)


@dataclass
class BuildResult:
    """The stage table, the published version and the time each stage took."""

    rows: list[StageRow]
    bayes_optimal_auc: float | None
    published: object | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    generator_rows: list = field(default_factory=list)  # GeneratorRow, when the recipe has a generator
    generator_published: Path | None = None

    def table(self) -> str:
        if not self.generator_rows:
            return markdown_table(self.rows)
        from ..evaluation.generator_report import generator_table

        return markdown_table(self.rows) + "\n\n" + generator_table(self.generator_rows)


def _gate(row: StageRow, minimum: float, teacher_auc: float) -> None:
    row.retention = row.test_auc / teacher_auc if teacher_auc else float("nan")
    if minimum > 0 and not row.retention >= minimum:
        raise BuildError(
            f"quality gate failed at stage {row.stage!r}: test AUC {row.test_auc:.4f} is "
            f"{row.retention:.4f} of the fine-tuned teacher's {teacher_auc:.4f}, the recipe requires "
            f"{minimum:.4f}; nothing was published"
        )


def run_build(
    recipe: Recipe,
    restart: bool = False,
    command: str = "slimserve build",
    on_scorer_published=None,
    on_generator_published=None,
) -> BuildResult:
    """Run every stage of ``recipe``; raise ``BuildError`` when a stage or a gate fails. Each stage that
    trains, decodes or measures runs in a process of its own (``stage_process``).

    With ``on_scorer_published`` (called with the ``BuildResult`` so far), the scorer is published as
    soon as its own gates passed, before the generator stages run (``slimserve up`` serves it
    meanwhile), and ``on_generator_published`` is called once the generator is, before the teacher's
    speed is measured for the report; without them, a failing generator gate publishes nothing."""
    from ..models.teacher import LazyTeacher
    from .int8_stage import publish

    if recipe.target == "tensorrt":
        from .tensorrt_stage import preflight

        preflight(recipe)
    work = recipe.resolved_work_dir()
    if restart and work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    atomic.write_text(work / "recipe.json", recipe.model_dump_json(indent=2) + "\n")
    seconds: dict[str, float] = {}
    stages = scorer_stages.stage_runner(work, seconds, stage_process.apart(recipe, "scorer", seconds))

    started = time.perf_counter()
    dataset = dataset_dir(recipe, work)
    seconds["data"] = time.perf_counter() - started
    loaded = LazyTeacher(recipe.teacher.source, seed=recipe.teacher.seed)  # weights load when a stage runs
    data: BuildData = prepare_data(recipe, dataset, loaded.tokenizer_file)
    generator = None
    if recipe.generator is not None:
        generator = generator_stages.generator_context(recipe, data, loaded)

    def timed(stage: str) -> list[StageRow]:
        function = scorer_stages.stage_function(recipe, data, loaded, stage)
        return stages.run(stage, stage_config(recipe, stage), function)

    rows = list(timed("teacher"))
    teacher_auc = rows[-1].test_auc
    rows[0].retention, rows[-1].retention = rows[0].test_auc / teacher_auc, 1.0
    distilled = timed("distill")
    _gate(distilled[0], recipe.gates.distilled, teacher_auc)
    pruned = [row for row in timed("prune") if not row.notes.get("baseline")]  # (kept there by older builds)
    for row in pruned:
        row.retention = row.test_auc / teacher_auc
    redistilled = timed("redistill")
    _gate(redistilled[0], recipe.gates.pruned_redistilled, teacher_auc)
    rows += distilled + pruned + redistilled

    def baselines(rows: list[StageRow]) -> None:
        """The magnitude-pruning baselines (stage ``prune_baselines``), in the table after OSSCAR's row."""
        if not recipe.prune.compare_magnitude:
            return
        found = timed("prune_baselines")
        for row in found:
            row.retention = row.test_auc / teacher_auc
        at = next(i for i, r in enumerate(rows) if r.stage == "pruned (osscar)") + 1
        rows[at:at] = found

    if recipe.target == "tensorrt":
        from .tensorrt_stage import tensorrt_tail

        in_process = scorer_stages.stage_runner(work, seconds)
        final, publisher = tensorrt_tail(recipe, data, in_process, loaded)
        _gate(final[0], recipe.gates.int8, teacher_auc)
        return _report_and_publish(
            recipe,
            rows + final,
            data,
            seconds,
            command,
            publisher,
            generator,
            (on_scorer_published, on_generator_published),
            baselines,
        )

    int8_rows = timed("int8")
    for row in int8_rows:  # the published graph's: multi-item or single-sequence
        _gate(row, recipe.gates.int8, teacher_auc)
    rows += int8_rows

    def report_only(rows: list[StageRow]) -> None:
        """The baselines, the single-sequence INT8 graph before the published multi-item one (stage
        ``int8_single``, multi-item recipes), then every model's speed and file size (stage ``speed``)
        into its row."""
        baselines(rows)
        if recipe.publish.multi_item:
            rows[-1:-1] = timed("int8_single")
        by_stage = {r.stage: r for r in timed(artifacts.SPEED_STAGE)}
        for row in rows:
            if row.stage in by_stage:
                found = by_stage[row.stage]
                row.items_per_s_batch32, row.single_item_ms = found.items_per_s_batch32, found.single_item_ms
                row.file_mb = found.file_mb

    graph = scorer_stages.chosen_graph
    return _report_and_publish(
        recipe,
        rows,
        data,
        seconds,
        command,
        lambda card: publish(
            recipe, data, graph(work), loaded.tokenizer_file, card, f"{loaded.name} (student)"
        ),
        generator,
        (on_scorer_published, on_generator_published),
        report_only,
    )


def _report_and_publish(
    recipe: Recipe,
    rows,
    data: BuildData,
    seconds,
    command: str,
    publisher,
    generator=None,
    callbacks=(None, None),
    report_only=None,
) -> BuildResult:
    """Run the stages only the report reads (``report_only(rows)``, when given: the pruning baselines,
    the speeds), run the generator stages (when the recipe has them; their gates fail before anything
    is published), write the report and model card, then publish (``publisher(card)``, then the
    generator).

    With ``callbacks`` = (on_scorer_published, on_generator_published): publish the scorer first, call
    the first, run the generator stages, publish the generator, call the second, then run the
    report-only stages (the scorer's and ``gen_report``) and rewrite the report (they only fill the
    report's tables, so the services do not wait for them). A model published before from the same
    recipe and still the repository's latest is kept rather than published again when none of its
    stages ran."""
    on_scorer_published, on_generator_published = callbacks
    result = BuildResult(rows, data.bayes_optimal_auc, seconds=seconds)
    scorer_ran = bool(set(seconds) - {"data", *REPORT_ONLY_STAGES})
    fill_report = report_only or (lambda rows: None)

    def publish_scorer() -> None:
        card = _write_report(recipe, result, command)
        result.published = _publish_once(recipe, "scorer", lambda: publisher(card), scorer_ran)

    def publish_generator() -> None:
        if generator is None:
            return
        generator_ran = bool(set(seconds) & set(generator_stages.active_stages(generator.settings)))
        result.generator_published = _publish_once(
            recipe,
            "generator",
            lambda: generator_stages.publish(generator, served_check(generator)),
            generator_ran or scorer_ran,
        )
        result.generator_rows += served_rows(result.generator_published)

    apart = stage_process.apart(recipe, "generator", seconds)

    def run_generator() -> None:
        if generator is not None:
            result.generator_rows = generator_stages.run_generator(generator, seconds, apart)

    def report_generator() -> None:
        if generator is not None:
            generator_stages.report_generator(generator, seconds, result.generator_rows, apart)

    if on_scorer_published is None:  # everything measured and gated before anything is published
        fill_report(rows)
        run_generator()
        report_generator()
        publish_scorer()
        publish_generator()
        if result.generator_published is not None:
            _write_report(recipe, result, command)  # with the published graph's served row
        return result
    publish_scorer()
    on_scorer_published(result)
    run_generator()
    publish_generator()
    if on_generator_published is not None:
        on_generator_published(result)
    fill_report(rows)
    report_generator()
    _write_report(recipe, result, command)
    return result


def _write_report(recipe: Recipe, result: BuildResult, command: str) -> str:
    work = recipe.resolved_work_dir()
    card = build_card(recipe, result, command)
    atomic.write_text(work / "report.md", card)
    atomic.write_text(work / "report.json", json.dumps(report_json(result), indent=2) + "\n")
    return card


# -- what a build published: lets a rerun (and ``slimserve up``) keep it instead of publishing again --
PUBLISH_DIR = "publish"


def _publish_config(recipe: Recipe, kind: str) -> dict:
    """What a published ``kind`` depends on: the scorer on the recipe but its ``generator`` section (a
    generator setting changed must not publish a new scorer version), the generator on all of it."""
    from ..prompts import EXPLAIN_TEMPLATE_VERSION, SCORING_TEMPLATE_VERSION

    if kind == "scorer":
        dumped = recipe.model_dump(mode="json", exclude={"work_dir", "generator"})
        return {"recipe": dumped, "prompt_template": SCORING_TEMPLATE_VERSION}
    return {
        "recipe": recipe.model_dump(mode="json", exclude={"work_dir"}),
        "prompt_template": SCORING_TEMPLATE_VERSION,
        "explain_template": EXPLAIN_TEMPLATE_VERSION,
        "served_gate": {  # how Explain decodes, so how the graph was gated
            "explain_repetition_penalty": explain_penalty(),
            "explain_copy_names": explain_copies_names(),
        },
    }


def _model_name(recipe: Recipe, kind: str) -> str:
    return recipe.publish.model_name if kind == "scorer" else "generator"


def _latest(recipe: Recipe, kind: str):
    """The latest bundle of the scorer (``kind="scorer"``) or the generator in the recipe's repository."""
    from ..bundle import BundleError, bundle_dir_for, load_bundle
    from ..generator_bundle import load_generator_bundle

    repository, name = recipe.publish.model_repository, _model_name(recipe, kind)
    try:
        if kind == "scorer":
            return load_bundle(bundle_dir_for(repository, name))
        return load_generator_bundle(bundle_dir_for(repository, name))
    except (BundleError, OSError):
        return None


def published_entry(recipe: Recipe, kind: str) -> dict | None:
    """What this recipe's build published as ``kind`` ("scorer", "generator"), when it is still the
    latest version in the repository (same content hash); else None."""
    path = recipe.resolved_work_dir() / PUBLISH_DIR / f"{kind}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if entry.get("config_hash") != artifacts.config_hash(_publish_config(recipe, kind)):
        return None
    latest = _latest(recipe, kind)
    if latest is None or (latest.model_version, latest.content_hash) != (
        entry["version"],
        entry["content_hash"],
    ):
        return None
    return entry


def published_build(recipe: Recipe) -> dict[str, dict] | None:
    """The models a finished build of ``recipe`` published (scorer, and generator when the recipe has
    one), when they are all still the latest in the repository; None when something must be built."""
    kinds = ("scorer", "generator") if recipe.generator is not None else ("scorer",)
    entries = {kind: published_entry(recipe, kind) for kind in kinds}
    return None if None in entries.values() else entries


def _publish_once(recipe: Recipe, kind: str, publish, stages_ran: bool):
    from ..export.repository import CONFIG_FILE, PublishedVersion

    entry = None if stages_ran else published_entry(recipe, kind)
    if entry is not None:
        log.info(
            "%s version %d: published before from this recipe and unchanged, kept", kind, entry["version"]
        )
        path = Path(entry["path"])
        if kind == "generator":
            return path
        return PublishedVersion(path, entry["version"], entry["content_hash"], path.parent / CONFIG_FILE)
    published = publish()
    latest = _latest(recipe, kind)
    if published is not None and latest is not None:
        path = published if kind == "generator" else published.path
        record = {
            "config_hash": artifacts.config_hash(_publish_config(recipe, kind)),
            "version": latest.model_version,
            "content_hash": latest.content_hash,
            "path": str(path),
        }
        out = recipe.resolved_work_dir() / PUBLISH_DIR
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / f"{kind}.json", json.dumps(record, indent=2) + "\n")
    return published


def report_json(result: BuildResult) -> dict:
    return {
        "bayes_optimal_test_auc": result.bayes_optimal_auc,
        "stages": [r.as_dict() for r in result.rows],
        "generator_stages": [r.as_dict() for r in result.generator_rows],
        "seconds": result.seconds,
    }


def build_card(recipe: Recipe, result: BuildResult, command: str) -> str:
    """The model card of a built student: the stage table and how to reproduce it."""
    bayes = "-" if result.bayes_optimal_auc is None else f"{result.bayes_optimal_auc:.3f}"
    return (
        f"# Model card: {recipe.publish.model_name} (recipe {recipe.name})\n\n"
        f"Student distilled, pruned (OSSCAR-style) and quantized to INT8 from teacher `{recipe.teacher.source}`.\n"
        f"Bayes-optimal test AUC of the data generator: {bayes}. Retention = test AUC / fine-tuned teacher's.\n\n"
        f"{result.table()}\n\nReproduce: `{command}`\n"
    )
