"""Linear-layer FLOPs counted as they run, and ``slimserve bench floor`` over a build's records."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from slimserve.bench.floor import FloorConfig, FloorReport, format_floor, run_floor, stage_work
from slimserve.buildstage.flops import LinearFlops
from slimserve.errors import UserError

TOKENS, IN, OUT = 6, 16, 32
FORWARD = 2 * TOKENS * IN * OUT


def test_forward_only_under_no_grad():
    layer = torch.nn.Linear(IN, OUT)
    with LinearFlops() as work, torch.no_grad():
        layer(torch.randn(2, 3, IN))
    assert work.flops == FORWARD


def test_training_counts_the_backward_products():
    layer = torch.nn.Linear(IN, OUT)
    frozen = torch.nn.Linear(IN, IN).requires_grad_(False)
    x = torch.randn(TOKENS, IN)
    with LinearFlops() as work:
        layer(x).sum().backward()  # weight gradient, no input gradient
    assert work.flops == 2 * FORWARD
    with LinearFlops() as work:
        layer(frozen(x)).sum().backward()  # the frozen layer: forward only (nothing needs its gradient)
    assert work.flops == 2 * FORWARD + 2 * TOKENS * IN * IN
    with LinearFlops() as work:
        layer(x.requires_grad_()).sum().backward()  # input and weight gradients
    assert work.flops == 3 * FORWARD


def test_an_exporter_trace_is_not_counted():
    """TorchScript tracing (what the ONNX export runs) makes sizes traced tensors: not work, not counted."""
    layer = torch.nn.Linear(IN, OUT)
    with LinearFlops() as work, torch.no_grad():
        traced = torch.jit.trace(layer, torch.randn(TOKENS, IN), check_trace=False)
        traced(torch.randn(TOKENS, IN))  # a traced module runs no nn.Linear call
        layer(torch.randn(TOKENS, IN))
    assert work.flops == FORWARD and type(work.flops) is int


def test_other_threads_and_closed_meters_are_not_counted():
    layer = torch.nn.Linear(IN, OUT)
    with LinearFlops() as work, torch.no_grad():
        thread = threading.Thread(target=lambda: layer(torch.randn(TOKENS, IN)))
        thread.start()
        thread.join()
    layer(torch.randn(TOKENS, IN))
    assert work.flops == 0


def _mark(work_dir, stage, seconds, flops):
    (work_dir / stage).mkdir(parents=True)
    (work_dir / stage / "done.json").write_text(json.dumps({"seconds": seconds, "linear_flops": flops}))


def test_floor_reads_the_stages_in_build_order(tmp_path):
    _mark(tmp_path, "distill", 20.0, 10**12)
    _mark(tmp_path, "teacher", 50.0, 4 * 10**12)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "done.json").write_text(json.dumps({"config_hash": "x"}))  # recorded nothing
    works = stage_work(tmp_path)
    assert [w.stage for w in works] == ["teacher", "distill"]
    report = FloorReport(10**11, {"576->1536": 10**11}, works)  # 100 GFLOP/s
    assert report.floor_seconds(works[0]) == pytest.approx(40.0)
    table = format_floor(report)
    assert "| teacher | 50 | 4.0 | 80 | 40 |" in table
    assert "| until the scorer is published | 70 | 5.0 | 71 | 50 |" in table


def test_floor_names_the_work_dir_without_records(tmp_path):
    with pytest.raises(UserError, match="work_dir"):
        run_floor(FloorConfig(work_dir=tmp_path))


def test_matmul_peak_is_measured():
    from slimserve.bench.floor import matmul_peak

    rates = matmul_peak(FloorConfig(hidden=32, intermediate=64, rows=64, seconds=0.05))
    assert set(rates) == {"32->64", "64->32", "32->32"} and min(rates.values()) > 0


def _trained_at(work, stage: str, config: dict) -> None:
    (work / stage / "config.json").write_text(json.dumps(config))


def test_floor_takes_bf16_training_stages_at_the_bf16_peak(tmp_path):
    """Each stage's precision is the one its config.json recorded (resolved when it ran)."""
    from slimserve.bench.floor import matmul_peak

    _mark(tmp_path, "teacher", 50.0, 4 * 10**12)
    _mark(tmp_path, "distill", 20.0, 10**12)
    _mark(tmp_path, "redistill", 5.0, 10**11)
    assert [w.precision for w in stage_work(tmp_path)] == ["fp32"] * 3  # no config.json: FP32
    _trained_at(tmp_path, "teacher", {"precision": "fp32"})
    _trained_at(tmp_path, "distill", {"precision": "fp32", "student": {"distill": {"precision": "bf16"}}})
    _trained_at(tmp_path, "redistill", {"precision": "bf16", "redistill": {"lr": 1}})  # its own: FP32
    assert [w.precision for w in stage_work(tmp_path)] == ["fp32", "bf16", "fp32"]
    _trained_at(tmp_path, "distill", {"precision": "bf16", "student": {"distill": {}}})
    _trained_at(tmp_path, "teacher", {"precision": "bf16"})
    works = stage_work(tmp_path)[:2]
    assert [w.precision for w in works] == ["bf16", "fp32"]
    report = FloorReport(10**11, {"576->1536": 10**11}, works, {"bf16": 4 * 10**11})
    assert report.floor_seconds(works[0]) == pytest.approx(10.0)  # at the BF16 peak
    table = format_floor(report)
    assert "BF16 peak here: 400 GFLOP/s" in table
    assert "| teacher (BF16) | 50 | 4.0 | 80 | 10 |" in table
    assert "| until the scorer is published | 70 | 5.0 | 71 | 20 |" in table
    small = FloorConfig(hidden=32, intermediate=64, rows=64, seconds=0.05)
    assert min(matmul_peak(small, "bf16").values()) > 0
