"""``slimserve bench floor``: a build's stages against this machine's matrix-multiply floor.

Each stage records its seconds and the FLOPs of its linear layers (``buildstage.flops``). This
measures the machine's peak rate for the linear layers' products (matrix multiplies at a
transformer's shapes, in PyTorch, on every core; FP32, and BF16 for a teacher stage that ran at BF16)
and prints, per stage, the rate it ran at and the seconds its linear-layer work would take at that peak: the floor no implementation of the same
stage with the same data can go below on this machine (at the same precision).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from ..settings import Settings

# The stages a Score call waits for (the scorer is published after int8), in build order.
SCORER_STAGES = ("teacher", "distill", "prune", "redistill", "int8")


class FloorConfig(Settings):
    """What ``slimserve bench floor`` reads and measures."""

    env_prefix: ClassVar[str] = "SLIMSERVE_FLOOR_"

    work_dir: Path = Field(Path("build_output/cpu"), description="A build's work directory (one per recipe).")
    hidden: int = Field(576, ge=8, description="Hidden size of the measured products (SmolLM2-135M: 576).")
    intermediate: int = Field(
        1536, ge=8, description="MLP width of the measured products (SmolLM2-135M: 1536)."
    )
    rows: int = Field(2048, ge=1, description="Tokens per measured product (a training micro-batch's order).")
    seconds: float = Field(2.0, gt=0, description="Seconds each shape is measured for.")


@dataclass
class StageWork:
    stage: str
    seconds: float
    linear_flops: int
    precision: str = "fp32"  # of its training passes (the teacher's and the distillations' may be bf16)


def stage_precision(work_dir: Path, stage: str) -> str:
    """The precision a finished stage's training passes ran at, from its ``config.json``."""
    from ..buildstage.context import trained_precision

    config = work_dir / stage / "config.json"
    return trained_precision(json.loads(config.read_text()), stage) if config.is_file() else "fp32"


def stage_work(work_dir: Path) -> list[StageWork]:
    """The finished stages of a build that recorded their work, in build order."""
    from ..buildstage.context import UPSTREAM

    found = []
    for stage in UPSTREAM:
        marker = work_dir / stage / "done.json"
        if not marker.is_file():
            continue
        done = json.loads(marker.read_text())
        if "seconds" in done and "linear_flops" in done:
            found.append(StageWork(stage, float(done["seconds"]), int(done["linear_flops"])))
    for work in found:
        work.precision = stage_precision(work_dir, work.stage)
    return found


def matmul_peak(config: FloorConfig, precision: str = "fp32") -> dict[str, float]:
    """FLOP/s of ``x @ W.T`` for the projections' and the MLP's shapes (``precision``: fp32 or bf16;
    PyTorch's threads)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]

    shapes = {
        f"{config.hidden}->{config.intermediate}": (config.hidden, config.intermediate),
        f"{config.intermediate}->{config.hidden}": (config.intermediate, config.hidden),
        f"{config.hidden}->{config.hidden}": (config.hidden, config.hidden),
    }
    rates = {}
    with torch.inference_mode():
        for name, (inputs, outputs) in shapes.items():
            x = torch.randn(config.rows, inputs, dtype=dtype)
            weight = torch.randn(outputs, inputs, dtype=dtype)
            for _ in range(3):
                x @ weight.T
            calls, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < config.seconds:
                x @ weight.T
                calls += 1
            rates[name] = 2 * config.rows * inputs * outputs * calls / elapsed
    return rates


@dataclass
class FloorReport:
    peak_flops_per_s: float  # FP32
    rates: dict[str, float]  # FP32, per shape
    stages: list[StageWork]
    other_peaks: dict[str, float] = field(default_factory=dict)  # precision -> peak, for stages not at FP32

    def peak(self, precision: str) -> float:
        return self.other_peaks.get(precision, self.peak_flops_per_s)

    def floor_seconds(self, work: StageWork) -> float:
        return work.linear_flops / self.peak(work.precision)

    def as_dict(self) -> dict:
        return {
            "peak_flops_per_s": self.peak_flops_per_s,
            "rates": self.rates,
            "stages": [{**asdict(w), "floor_seconds": self.floor_seconds(w)} for w in self.stages],
            "other_peaks": self.other_peaks,
        }


def run_floor(config: FloorConfig) -> FloorReport:
    from ..errors import UserError

    stages = stage_work(config.work_dir)
    if not stages:
        raise UserError(
            f"work_dir: {config.work_dir} holds no finished stage that recorded its work "
            "(stages record it from this version on; build there first)"
        )
    rates = matmul_peak(config)
    others = {w.precision for w in stages} - {"fp32"}
    other_peaks = {p: max(matmul_peak(config, p).values()) for p in sorted(others)}
    return FloorReport(max(rates.values()), rates, stages, other_peaks)


def _row(label: str, seconds: float, flops: int, floor: float) -> str:
    rate = flops / max(seconds, 1e-9) / 1e9
    return f"| {label} | {seconds:.0f} | {flops / 1e12:.1f} | {rate:.0f} | {floor:.0f} |"


def _total(label: str, works: list[StageWork], report: FloorReport) -> str:
    seconds, flops = sum(w.seconds for w in works), sum(w.linear_flops for w in works)
    return _row(label, seconds, flops, sum(report.floor_seconds(w) for w in works))


def _label(work: StageWork) -> str:
    return work.stage if work.precision == "fp32" else f"{work.stage} ({work.precision.upper()})"


def format_floor(report: FloorReport) -> str:
    shapes = ", ".join(f"{name} {rate / 1e9:.0f}" for name, rate in report.rates.items())
    lines = [
        f"matrix-multiply peak here: {report.peak_flops_per_s / 1e9:.0f} GFLOP/s (FP32; {shapes})",
        *(f"{p.upper()} peak here: {peak / 1e9:.0f} GFLOP/s" for p, peak in report.other_peaks.items()),
        "",
        "| stage | seconds | linear TFLOP | GFLOP/s | seconds at peak |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [_row(_label(w), w.seconds, w.linear_flops, report.floor_seconds(w)) for w in report.stages]
    scorer = [w for w in report.stages if w.stage in SCORER_STAGES]
    if scorer:
        lines.append(_total("until the scorer is published", scorer, report))
    lines.append(_total("all", report.stages, report))
    lines += [
        "",
        "seconds at peak: the stage's linear-layer FLOPs at the peak above, the least time that work takes "
        "here; the rest of a stage's time is attention, other operators, ONNX Runtime and I/O.",
    ]
    return "\n".join(lines)
