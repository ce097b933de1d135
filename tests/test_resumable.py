"""The resumable stage loop: a finished stage is skipped, one that ran again runs the ones after it again."""

from __future__ import annotations

import os

import pytest

from slimserve import atomic
from slimserve.buildstage.context import stage_inputs
from slimserve.buildstage.resumable import StageRunner
from slimserve.evaluation.report import StageRow


def _row(name: str) -> StageRow:
    nan = float("nan")
    return StageRow(name, nan, nan, nan)


def test_a_stage_run_again_runs_the_stages_that_read_it_again(tmp_path):
    ran: list[str] = []
    inputs = {"student": ("teacher",), "int8": ("student",)}.get

    def build(seconds: dict) -> None:
        stages = StageRunner(tmp_path, seconds, inputs=lambda stage: inputs(stage, ()))
        for stage in ("teacher", "student", "int8"):
            stages.run(stage, {"lr": 1}, lambda out, stage=stage: ran.append(stage) or [_row(stage)])

    build({})
    assert ran == ["teacher", "student", "int8"]
    build({})
    assert ran == ["teacher", "student", "int8"]  # all done before: nothing runs
    (tmp_path / "student" / "done.json").unlink()  # as if it had been removed
    seconds: dict = {}
    build(seconds)
    assert ran[3:] == ["student", "int8"] and set(seconds) == {"student", "int8"}


def test_every_stage_that_reads_another_stage_names_it():
    assert stage_inputs("int8") == ("redistill",)
    assert "gen_finetune" in stage_inputs("gen_teacher")  # the fine-tuned teacher writes the text
    assert stage_inputs("tensorrt_sm89") == ("teacher", "redistill")


def test_a_stage_records_its_seconds_and_linear_flops(tmp_path):
    import json

    import torch

    layer = torch.nn.Linear(8, 4)

    def stage(out):
        with torch.no_grad():
            layer(torch.zeros(3, 5, 8))  # 15 tokens
        return [_row("teacher")]

    StageRunner(tmp_path, {}).run("teacher", {"lr": 1}, stage)
    done = json.loads((tmp_path / "teacher" / "done.json").read_text())
    assert done["linear_flops"] == 2 * 15 * 8 * 4 and done["seconds"] >= 0


def test_a_rewritten_build_file_is_replaced_whole_and_leaves_a_hard_linked_copy_alone(tmp_path):
    path, copy = tmp_path / "report.json", tmp_path / "copy.json"
    atomic.write_text(path, "old\n")
    os.link(path, copy)  # a build copied with `cp -al`
    atomic.write_text(path, "new\n")
    assert path.read_text() == "new\n" and copy.read_text() == "old\n"

    with pytest.raises((OSError, TypeError)):
        atomic.write_text(path, object())  # the write fails
    assert path.read_text() == "new\n"
    with pytest.raises((OSError, TypeError)):
        atomic.write_bytes(path, object())  # the write fails half-way, its temp file open
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.json", "report.json"]  # no temp file left
