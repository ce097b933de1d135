"""``slimserve bench report``: a comparison written as markdown, CSV files and PNG plots in one folder.

Files: ``report.md`` (machine, versions, settings, tables, ratios against the targets, plots),
``engines.csv``, ``grpc_load.csv``, ``perf_analyzer.csv``, ``ratios.csv``, ``stages.csv`` (when a build
report is given), ``throughput_vs_p99.png``, ``quality_vs_throughput.png``, the Triton config of every
served variant under ``configs/``, and ``results.json`` with all of it. Written to a temporary folder
and renamed into place.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .compare import CompareResult
from .environment import machine_info, versions
from .grpc_load import LoadPoint, format_load_table
from .inprocess import ORT_FLOOR, PYTORCH
from .layouts import format_layouts, layout_rows
from .ratios import Ratio, compute_ratios, format_ratios
from .triton_bench import format_perf_table

PLOT_THROUGHPUT = "throughput_vs_p99.png"
PLOT_QUALITY = "quality_vs_throughput.png"


@dataclass(frozen=True)
class ReportInputs:
    """What the report records besides the measurements."""

    command: str
    machine: dict
    versions: dict
    build_report: dict | None = None
    note: str = ""


def load_build_report(path: Path | None) -> dict | None:
    """A build's ``report.json`` (stage rows with quality and in-process speed), or None."""
    if path is None:
        return None
    data = json.loads(Path(path).read_text())
    if "stages" not in data:
        raise ValueError(f"{path}: not a build report (no 'stages')")
    return data


def default_inputs(command: str, build_report: Path | None = None, note: str = "") -> ReportInputs:
    return ReportInputs(command, machine_info(), versions(), load_build_report(build_report), note)


# -- CSV -------------------------------------------------------------------------------------------------
def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows as CSV (columns in first-seen order; dicts and lists as JSON); nothing for no rows."""
    if not rows:
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})


def _load_rows(result: CompareResult) -> list[dict]:
    return [
        {"variant": r.variant, "batching": r.batching, **p.as_dict()} for r in result.served for p in r.points
    ]


def _perf_rows(result: CompareResult) -> list[dict]:
    return [
        {"variant": r.variant, "batching": r.batching, **p.as_dict()} for r in result.served for p in r.perf
    ]


def _stage_rows(build_report: dict | None, result: CompareResult) -> list[dict]:
    """Build stages with quality and in-process speed, plus this run's served items/s where mapped."""
    if not build_report:
        return []
    main = result.settings.get("main_batching")
    served = {}
    for variant, stage in result.stages.items():
        run = result.run(variant, main)
        best = run.best() if run else None
        if best:
            served[stage] = best.items_per_s
    names = [stage["stage"] for stage in build_report["stages"]]
    # A variant's figure goes to its own row: the row of that name, else the first row it prefixes ("INT8"
    # -> "INT8 (weight-only)"), never also to the multi-item row after it, which this run did not serve.
    row_of = {k: k if k in names else next((n for n in names if n.startswith(k)), None) for k in served}
    by_row = {row: served[k] for k, row in row_of.items() if row is not None}
    rows = []
    for stage in build_report["stages"]:
        name = stage["stage"]
        match = by_row.get(name)
        rows.append(
            {
                "stage": name,
                "test_auc": stage.get("test_auc"),
                "retention": stage.get("retention"),
                "parameters": stage.get("parameters"),
                "file_mb": stage.get("file_mb"),
                "build_items_per_s_batch32": stage.get("items_per_s_batch32"),
                "served_items_per_s": match,
            }
        )
    return rows


# -- plots -----------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, grid, legend; save as PNG and close."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput_vs_p99(result: CompareResult, path: Path) -> None:
    """Closed-loop points of every served run: items/s (x) against p99 latency (y), labelled by concurrency."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for run in result.served:
        points = [p for p in run.closed() if p.ok]
        if not points:
            continue
        xs, ys = [p.items_per_s for p in points], [p.latency.p99_ms for p in points]
        ax.plot(xs, ys, marker="o", label=f"{run.variant}, {run.batching}")
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"c{p.load:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for engine in result.engines:
        if engine.engine == ORT_FLOOR:
            ax.axvline(engine.items_per_s, linestyle=":", linewidth=1, color="gray")
            ax.annotate(
                f"ORT floor {engine.variant}",
                (engine.items_per_s, ax.get_ylim()[0]),
                fontsize=7,
                rotation=90,
                va="bottom",
                ha="right",
                color="gray",
            )
    ax.set_yscale("log")
    _finish(
        plt,
        fig,
        ax,
        path,
        "items/s (slimserve gRPC -> Triton, closed loop)",
        "p99 latency per request (ms)",
        "Throughput vs p99 latency per variant",
    )


def plot_quality_vs_throughput(rows: list[dict], path: Path) -> bool:
    """Test AUC (y) against items/s (x) per build stage: in-process speed from the build, served speed here."""
    usable = [
        r
        for r in rows
        if r["test_auc"] is not None and (r["build_items_per_s_batch32"] or r["served_items_per_s"])
    ]
    if not usable:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, marker, label in (
        ("build_items_per_s_batch32", "s", "ONNX Runtime in process, batch 32 (build report)"),
        ("served_items_per_s", "o", "slimserve gRPC -> Triton, best concurrency (this run)"),
    ):
        points = [(r[key], r["test_auc"], r["stage"]) for r in usable if r[key]]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)
            for x, y, stage in points:
                ax.annotate(stage, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    _finish(plt, fig, ax, path, "items/s", "test AUC", "Quality vs throughput per build stage")
    return True


# -- markdown --------------------------------------------------------------------------------------------
def _engines_table(result: CompareResult) -> str:
    lines = [
        "| variant | engine | items/s | at batch | items/s by batch size | threads | 1-item p50 ms | 1-item p99 ms |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for e in result.engines:
        single = (
            f"{e.single_item_ms_p50:.1f} | {e.single_item_ms_p99:.1f}"
            if e.single_item_ms_p50 is not None and e.single_item_ms_p99 is not None
            else "- | -"
        )
        tried = ", ".join(f"{b}: {v:.1f}" for b, v in (e.by_batch or {}).items()) or "-"
        lines.append(
            f"| {e.variant} | {e.engine} | {e.items_per_s:.1f} | {e.batch_size} | {tried} | {e.threads} | {single} |"
        )
    return "\n".join(lines)


def _headline(result: CompareResult) -> str:
    """One row per variant: floor, PyTorch, slimserve best."""
    main = result.settings.get("main_batching")
    lines = [
        "| variant | ONNX Runtime floor items/s (mean of start and end where measured twice) | PyTorch items/s | slimserve items/s (best concurrency) | p99 ms there |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant in result.variants:
        floor = result.floor_items_per_s(variant)
        torch = result.engine(variant, PYTORCH)
        run = result.run(variant, main)
        best = run.best() if run else None
        cells = [
            f"{floor:.1f}" if floor else "-",
            f"{torch.items_per_s:.1f}" if torch else "-",
            f"{best.items_per_s:.1f} (c{best.load:g})" if best else "-",
            f"{best.latency.p99_ms:.0f}" if best else "-",
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stages_table(rows: list[dict]) -> str:
    def fmt(v, digits=1):
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [
        "| stage | test AUC | retention | file MB | in-process items/s @32 (build) | served items/s (this run) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {fmt(r['test_auc'], 3)} | {fmt(r['retention'], 3)} | {fmt(r['file_mb'])} | "
            f"{fmt(r['build_items_per_s_batch32'])} | {fmt(r['served_items_per_s'])} |"
        )
    return "\n".join(lines)


def render_summary(result: CompareResult) -> str:
    """The headline and engine tables, and every served run's load table (what ``bench compare`` prints)."""
    parts = [*(f"Note: {n}\n" for n in result.notes), _headline(result), "", _engines_table(result)]
    for run in result.served:
        parts += ["", f"{run.variant}, {run.batching_text}:", format_load_table(run.points)]
        if run.perf:
            parts += ["perf_analyzer on Triton:", format_perf_table(run.perf)]
    if result.layouts:
        parts += ["", "Multi-item vs single-sequence, same student:", format_layouts(result.layouts)]
    return "\n".join(parts)


LAYOUTS_TEXT = (
    "The build's single-sequence and multi-item INT8 graphs of the published student, each published into "
    "its own repository and served by its own Triton and ScoringService. Floor: ONNX Runtime in process on "
    "exactly the tensors the service sends for one call. Served: closed-loop Score calls, the best "
    "concurrency."
)


def _load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else []


def render_markdown(
    result: CompareResult, inputs: ReportInputs, ratios: list[Ratio], stage_rows: list[dict], plots: list[str]
) -> str:
    machine = inputs.machine
    parts = [
        "# slimserve benchmark report",
        "",
        f"Command: `{inputs.command}`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB, {machine['os']}, "
        f"Python {machine['python']}; load average (1, 5, 15 min) at start {machine['load_average_1_5_15']}, "
        f"at the end {_load_average()}.",
    ]
    if inputs.note:
        parts += ["", f"**Note:** {inputs.note}"]
    for note in result.notes:
        parts += ["", f"**Note:** {note}"]
    parts += [
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in inputs.versions.items()) + ".",
        "",
        f"Workload: {result.workload}. Run time {result.seconds / 60:.1f} min.",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in result.settings.items()) + ".",
        "",
        "## Headline",
        "",
        _headline(result),
        "",
        "## Ratios and targets",
        "",
        "Ratios from one run hold better than absolute figures on a noisy machine.",
        "",
        format_ratios(ratios),
        "",
        "## In-process engines",
        "",
        _engines_table(result),
        "",
        "## slimserve: gRPC ScoringService -> Triton",
        "",
        "Closed loop: `load` concurrent clients back to back. Open loop: Poisson arrivals at `load` requests/s "
        "(latency from the scheduled arrival). One request scores all its candidates; items = candidates.",
        "",
    ]
    for run in result.served:
        parts += [f"### {run.variant}, {run.batching_text}", "", format_load_table(run.points), ""]
        if run.perf:
            parts += ["perf_analyzer directly on Triton (batch 1 per request, real prompts per bucket):", ""]
            parts += [format_perf_table(run.perf), ""]
    if result.layouts:
        parts += ["## Multi-item vs single-sequence scoring, same student", "", LAYOUTS_TEXT, ""]
        parts += [format_layouts(result.layouts), ""]
    if stage_rows:
        parts += ["## Quality vs throughput per build stage", "", _stages_table(stage_rows), ""]
    for plot in plots:
        parts += [f"![{plot}]({plot})", ""]
    parts += [
        "## Files",
        "",
        "`engines.csv`, `grpc_load.csv`, `perf_analyzer.csv`, `ratios.csv`, `stages.csv`, `layouts.csv`, "
        "`results.json`; the "
        "Triton config of each served variant in `configs/` (generated by `scorer_triton_spec`).",
        "",
    ]
    return "\n".join(parts)


def _results_json(
    result: CompareResult, inputs: ReportInputs, ratios: list[Ratio], stage_rows: list[dict]
) -> dict:
    return {
        "command": inputs.command,
        "machine": inputs.machine,
        "versions": inputs.versions,
        "note": inputs.note,
        "workload": result.workload,
        "notes": result.notes,
        "settings": result.settings,
        "seconds": result.seconds,
        "engines": [e.as_dict() for e in result.engines],
        "grpc_load": _load_rows(result),
        "perf_analyzer": _perf_rows(result),
        "ratios": [r.as_dict() for r in ratios],
        "stages": stage_rows,
        "layouts": result.layouts.as_dict() if result.layouts else None,
    }


def write_report(result: CompareResult, inputs: ReportInputs, out_dir: Path) -> Path:
    """Write the whole report into ``out_dir`` (replaced atomically); return the markdown path."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        ratios = compute_ratios(result)
        stage_rows = _stage_rows(inputs.build_report, result)
        write_csv(staging / "engines.csv", [e.as_dict() for e in result.engines])
        write_csv(staging / "grpc_load.csv", _load_rows(result))
        write_csv(staging / "perf_analyzer.csv", _perf_rows(result))
        write_csv(staging / "ratios.csv", [r.as_dict() for r in ratios])
        write_csv(staging / "stages.csv", stage_rows)
        write_csv(staging / "layouts.csv", layout_rows(result.layouts) if result.layouts else [])
        (staging / "configs").mkdir()
        for run in result.served:
            safe = f"{run.variant}-{run.batching}".replace(" ", "_")
            (staging / "configs" / f"{safe}.pbtxt").write_text(run.config_pbtxt)
        plots = []
        if any(r.points for r in result.served):
            plot_throughput_vs_p99(result, staging / PLOT_THROUGHPUT)
            plots.append(PLOT_THROUGHPUT)
        if plot_quality_vs_throughput(stage_rows, staging / PLOT_QUALITY):
            plots.append(PLOT_QUALITY)
        (staging / "report.md").write_text(render_markdown(result, inputs, ratios, stage_rows, plots))
        (staging / "results.json").write_text(
            json.dumps(_results_json(result, inputs, ratios, stage_rows), indent=2, default=str) + "\n"
        )
        if out_dir.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-old-", dir=out_dir.parent))
            os.rename(out_dir, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.md"


__all__ = [
    "LoadPoint",
    "ReportInputs",
    "default_inputs",
    "load_build_report",
    "render_summary",
    "write_csv",
    "write_report",
]
