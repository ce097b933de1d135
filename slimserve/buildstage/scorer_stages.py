"""The scorer's stages by name: what each runs, given only the recipe and the work directory.

A stage reads what it needs from the directories of the stages before it (the teacher's test logits
and rows, the previous student), so a build can run each in a process of its own
(``stage_process.run_apart``, which calls ``run_stage`` there) or in the build's process, alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .. import atomic
from ..evaluation.report import StageRow
from . import artifacts
from .context import BuildData, dataset_dir, prepare_data, stage_config, stage_inputs
from .recipe import Recipe
from .resumable import StageRunner

# a stage's rows, as its input stages saved them: the stages whose rows it reads
_ROWS_READ = {
    "int8": ("teacher",),
    "int8_single": ("teacher",),
    artifacts.SPEED_STAGE: ("teacher", "redistill", "int8", "int8_single"),
}
CHOSEN_FILE = "chosen.json"  # in int8/: the graph to publish


def quality(rows: list[StageRow]) -> str:
    """The closing words of a stage's line: the test AUC and retention of the model the stage carries
    on (its last row that is not a baseline, such as the magnitude-pruning comparisons)."""
    if not rows:
        return ""
    row = next((r for r in reversed(rows) if not r.notes.get("baseline")), rows[-1])
    retention = "" if row.retention != row.retention else f", retention {row.retention:.3f}"  # NaN: unset
    return f": {row.stage}, test AUC {row.test_auc:.3f}{retention}"


def stage_runner(work: Path, seconds: dict[str, float], apart=None) -> StageRunner:
    """The runner of the scorer's stages in ``work`` (``apart``: ``StageRunner.apart``)."""
    return StageRunner(work, seconds, quality=quality, inputs=stage_inputs, apart=apart)


def saved_rows(work: Path, stages) -> list[StageRow]:
    """The rows the ``stages`` saved in ``work``, in order (those that saved none skipped)."""
    return [
        row
        for s in stages
        if (work / s / artifacts.ROWS_FILE).is_file()
        for row in artifacts.load_rows(work / s)
    ]


def stage_function(recipe: Recipe, data: BuildData, loaded, stage: str) -> Callable[[Path], list[StageRow]]:
    """``fn(out)`` of ``StageRunner.run`` for the scorer's ``stage`` (``loaded``: the ``LazyTeacher``)."""
    from .int8_stage import run_int8_single, run_speeds
    from .stages import run_distill, run_prune, run_prune_baselines, run_redistill, run_teacher

    work = recipe.resolved_work_dir()
    teacher, multi_item = work / "teacher", recipe.publish.multi_item
    rows = lambda: saved_rows(work, _ROWS_READ.get(stage, ()))  # noqa: E731
    functions = {
        "teacher": lambda out: run_teacher(recipe, data, loaded.fresh(), out),
        "distill": lambda out: run_distill(recipe, data, teacher, out),
        "prune": lambda out: run_prune(recipe, data, teacher, work / "distill", out),
        "prune_baselines": lambda out: run_prune_baselines(recipe, data, teacher, work / "distill", out),
        "redistill": lambda out: run_redistill(recipe, data, teacher, work / "prune", out),
        "int8": lambda out: _int8(recipe, data, rows(), out),
        "int8_single": lambda out: run_int8_single(
            recipe, data, teacher, work / "redistill", work / "int8", rows(), out
        ),
        artifacts.SPEED_STAGE: lambda out: run_speeds(
            recipe,
            data,
            teacher,
            [work / "int8", *([work / "int8_single"] if multi_item else [])],
            rows(),
            out,
        ),
    }
    if stage not in functions:
        raise ValueError(f"unknown scorer stage {stage!r} (known: {', '.join(functions)})")
    return functions[stage]


def _int8(recipe: Recipe, data: BuildData, rows: list[StageRow], out: Path) -> list[StageRow]:
    """Stage ``int8``: ``int8_stage.run_int8``, the graph to publish recorded in ``CHOSEN_FILE``."""
    from .int8_stage import run_int8

    work = recipe.resolved_work_dir()
    int8_rows, path = run_int8(recipe, data, work / "teacher", work / "redistill", out, rows)
    atomic.write_text(out / CHOSEN_FILE, json.dumps({"path": str(path.resolve())}) + "\n")
    return int8_rows


def chosen_graph(work: Path) -> Path:
    """The INT8 graph stage ``int8`` chose to publish."""
    return Path(json.loads((work / "int8" / CHOSEN_FILE).read_text())["path"])


def run_stage(recipe: Recipe, stage: str, seconds: dict[str, float]) -> list[StageRow]:
    """Run (or skip, when done) the scorer's ``stage`` from the recipe and the work directory alone: the
    entry of its own process (``stage_process``)."""
    from ..models.teacher import LazyTeacher

    work = recipe.resolved_work_dir()
    loaded = LazyTeacher(
        recipe.teacher.source, seed=recipe.teacher.seed
    )  # weights load if the stage needs them
    data = prepare_data(recipe, dataset_dir(recipe, work), loaded.tokenizer_file)
    function = stage_function(recipe, data, loaded, stage)
    return stage_runner(work, seconds).run(stage, stage_config(recipe, stage), function)
