"""The one loop that runs a build stage resumably, for the scorer, generator and TensorRT stages.

A stage runs in ``<work_dir>/<stage>/``: skipped when its ``done.json`` matches its settings and the
runs of the stages whose outputs it reads (the rows it saved are read back), else it resumes from a
checkpoint started with the same settings or starts from an empty directory, saves its rows, writes
``config.json`` and the done-marker last (with the run's seconds and its linear-layer FLOPs,
``flops.LinearFlops``). A stage that runs again thus runs the stages after it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import artifacts

log = logging.getLogger(__name__)


def _no_quality(rows: list) -> str:
    return ""


def _no_inputs(stage: str) -> tuple[str, ...]:
    return ()


def _work(flops: int, seconds: float) -> str:
    """The stage's linear-layer work and rate, for its log line (nothing when it ran none)."""
    if flops <= 0:
        return ""
    from .flops import format_flops

    return f" ({format_flops(flops)} in linear layers, {flops / max(seconds, 1e-9) / 1e9:.0f} GFLOP/s)"


@dataclass
class StageRunner:
    """Runs stages in ``work``, recording each run's seconds in ``seconds``; ``rows_file`` and
    ``load_rows`` say where and how a stage's rows are kept, ``quality`` the closing words of its log line.
    With ``apart``, a stage that has to run runs through ``apart(stage)`` instead (in a process of its
    own, where a runner without ``apart`` runs it: ``stage_process``) and its saved rows are read back."""

    work: Path
    seconds: dict[str, float]
    rows_file: str = artifacts.ROWS_FILE
    load_rows: Callable[[Path, str], list] = artifacts.load_rows
    quality: Callable[[list], str] = _no_quality
    inputs: Callable[[str], tuple[str, ...]] = _no_inputs  # the stages whose outputs a stage reads
    apart: Callable[[str], None] | None = None

    def _config(self, stage: str, config: dict) -> dict:
        """``config`` with the runs of the stage's input stages (a new run of one re-runs it)."""
        return {**config, "input_runs": {s: artifacts.run_id(self.work / s) for s in self.inputs(stage)}}

    def done(self, stage: str, config: dict) -> bool:
        """Whether ``run`` would skip the stage (finished before with the same settings and inputs)."""
        return artifacts.is_done(self.work / stage, self._config(stage, config))

    def run(self, stage: str, config: dict, fn: Callable[[Path], list]) -> list:
        """``fn(out)``'s rows, or the saved rows of an earlier run that finished with the same ``config``
        after the same runs of its input stages."""
        out = self.work / stage
        config = self._config(stage, config)
        if artifacts.is_done(out, config):
            log.info("stage %s: done before with the same settings, skipped", stage)
            return self.load_rows(out, self.rows_file)
        if self.apart is not None:
            self.apart(stage)
            return self.load_rows(out, self.rows_file)
        started = time.perf_counter()
        artifacts.prepare_stage(out, config)
        log.info("stage %s: running", stage)
        from .flops import LinearFlops

        with LinearFlops() as work:
            rows = fn(out)
        artifacts.save_rows(out, rows, self.rows_file)
        seconds = time.perf_counter() - started
        artifacts.mark_done(out, config, {"seconds": round(seconds, 1), "linear_flops": work.flops})
        self.seconds[stage] = seconds
        log.info(
            "stage %s: finished in %.0f s%s%s", stage, seconds, self.quality(rows), _work(work.flops, seconds)
        )
        return rows
