"""``slimserve bench layouts``: multi-item and single-sequence scoring of the same student, side by side.

For each layout (the single-sequence graph: one full sequence per candidate; the multi-item graph: the
member prefix once, the candidates as item suffixes) and each number of candidates per Score call
(1, 10, 50, 200 by default), on the same workload:

- the in-process engine floor: ONNX Runtime called directly with exactly the tensors the service would
  send for one call (single-sequence: one run per length bucket; multi-item: one run), no server;
- slimserve end to end: Triton (the real binary, python backend) and the ScoringService as a child
  process, closed-loop Score calls at each concurrency: items/s at the best one, and p50/p99 there.

The two layouts are published into their own temporary repositories with the build's own spec generator
and publisher, so no config is typed by hand; the graphs are the build's INT8 outputs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..bundle import SCORING_MULTI_ITEM, SCORING_SINGLE, TOKENIZER_FILE, load_bundle
from ..cache import cache_dir
from ..export.scoring_layout import ScoringLayout
from .config import LayoutSettings
from .grpc_load import LoadPlan, LoadPoint, bench_service, score_requests
from .workload import Workload, load_workload

log = logging.getLogger(__name__)

LAYOUTS = (SCORING_SINGLE, SCORING_MULTI_ITEM)
_LAYOUT_DEFAULTS = ScoringLayout.model_fields


@dataclass
class LayoutPoint:
    """One layout at one candidate count: its floor and what slimserve achieved."""

    layout: str
    candidates: int
    floor_items_per_s: float
    floor_call_ms: float
    served: list[LoadPoint] = field(default_factory=list)

    def best(self) -> LoadPoint | None:
        ok = [p for p in self.served if p.ok]
        return max(ok, key=lambda p: p.items_per_s) if ok else None

    def at(self, load: float) -> LoadPoint | None:
        """The served point at concurrency ``load`` (None when not run or nothing succeeded)."""
        return next((p for p in self.served if p.ok and p.load == load), None)

    def as_dict(self) -> dict:
        best = self.best()
        return {
            "layout": self.layout,
            "candidates": self.candidates,
            "floor_items_per_s": self.floor_items_per_s,
            "floor_call_ms": self.floor_call_ms,
            "best_concurrency": None if best is None else best.load,
            "served_items_per_s": None if best is None else best.items_per_s,
            "served_p50_ms": None if best is None else best.latency.p50_ms,
            "served_p99_ms": None if best is None else best.latency.p99_ms,
            "points": [p.as_dict() for p in self.served],
        }


@dataclass
class LayoutResult:
    points: list[LayoutPoint]
    settings: dict
    graphs: dict[str, str]
    seconds: float = 0.0

    def point(self, layout: str, candidates: int) -> LayoutPoint | None:
        return next((p for p in self.points if p.layout == layout and p.candidates == candidates), None)

    def as_dict(self) -> dict:
        return {
            "settings": self.settings,
            "graphs": self.graphs,
            "seconds": self.seconds,
            "points": [p.as_dict() for p in self.points],
        }


def graphs_from_build(work_dir: Path) -> dict[str, Path]:
    """The single-sequence and multi-item INT8 graphs of a multi-item ``slimserve build`` work directory."""
    int8 = Path(work_dir) / "int8"
    chosen_file = int8 / "chosen.json"
    if not chosen_file.is_file():
        raise FileNotFoundError(
            f"{work_dir}: no int8/chosen.json; is this a finished build's work directory?"
        )
    multi = Path(json.loads(chosen_file.read_text())["path"])
    prefix = "multi_item_"
    if not multi.parent.name.startswith(prefix):
        raise FileNotFoundError(
            f"{work_dir}: the build published a single-sequence graph; rebuild multi-item"
        )
    single = int8 / multi.parent.name[len(prefix) :] / multi.name
    missing = [str(p) for p in (single, multi) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{work_dir}: missing {missing}")
    return {SCORING_SINGLE: single, SCORING_MULTI_ITEM: multi}


def write_layout_repository(repository: Path, bundle_dir: Path, onnx: Path, layout: str) -> Path:
    """Publish ``onnx`` as the scorer of ``layout`` (bundle of ``bundle_dir`` re-laid out); its bundle dir."""
    from ..export.pipeline import scorer_spec
    from ..export.repository import publish_version
    from ..export.scorer_model import scorer_model_files
    from ..export.triton_config import check_against_onnx

    bundle = load_bundle(bundle_dir)
    if bundle.prompt_split is None:
        raise ValueError(
            f"{bundle_dir}: a whole-text ({bundle.prompt_template_version}) bundle has no prefix"
        )
    multi = layout == SCORING_MULTI_ITEM
    bundle = dataclasses.replace(
        bundle,
        scoring_mode=layout,
        max_batch_size=bundle.max_batch_size if multi else 64,
        item_length_buckets=bundle.item_length_buckets or _LAYOUT_DEFAULTS["item_length_buckets"].default,
        max_items_per_request=bundle.max_items_per_request
        or _LAYOUT_DEFAULTS["max_items_per_request"].default,
    )
    settings = _Publish(bundle.model_name)
    spec = scorer_spec(settings, bundle, {"source_model": bundle.source_model, "bench_layout": layout})
    check_against_onnx(spec, onnx, extra_outputs=(bundle.tensors.compute_ms,))
    published = publish_version(
        repository,
        spec,
        files=scorer_model_files(onnx),
        bundle=bundle,
        tokenizer_file=Path(bundle_dir) / TOKENIZER_FILE,
        model_card=f"# {layout} scorer\n\nBenchmark layout written by `slimserve bench layouts`.\n",
        link_files=True,
    )
    return published.path / "bundle"


@dataclass(frozen=True)
class _Publish:
    model_name: str
    max_queue_delay_us: int = 200
    max_queue_size: int = 0  # a queue policy brings 500 ms stalls (docs/bench.md, Tail latency)
    default_timeout_us: int = 0


def floor(onnx: Path, workload: Workload, layout: str, bundle, seconds: float) -> tuple[float, float]:
    """(items/s, ms per call) of ONNX Runtime on the tensors the service sends for the workload's calls."""
    from ..evaluation.throughput import scorer_session
    from ..models.batching import padded_batches
    from ..scoring_tokens import multi_item_requests

    session, _ = scorer_session(onnx)
    calls = []
    for tokens in workload.tokens:
        if layout == SCORING_MULTI_ITEM:
            requests = multi_item_requests(tokens, bundle.item_length_buckets, bundle.max_items_per_request)
            calls.append([r.feed() for r in requests])
        else:
            batches = padded_batches(tokens.sequences(), bundle.length_buckets, batch_size=len(tokens.items))
            calls.append([{"input_ids": ids, "attention_mask": mask} for _, ids, mask in batches])
    for feeds in calls[:2]:  # warm up
        for feed in feeds:
            session.run(None, feed)
    timings, deadline = [], time.perf_counter() + seconds
    while not timings or time.perf_counter() < deadline:
        feeds = calls[len(timings) % len(calls)]
        started = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        timings.append(time.perf_counter() - started)
    per_call = float(np.mean(timings))
    return len(workload.tokens[0].items) / per_call, per_call * 1e3


def run_layouts(
    bundle_dir: Path,
    graphs: dict[str, Path],
    dataset_dir: Path | None = None,
    settings: LayoutSettings | None = None,
) -> LayoutResult:
    """Every layout at every candidate count: floor, then served (one Triton and service per layout)."""
    from ..serving.triton.launcher import TritonServer, TritonServerConfig
    from .service import scoring_service

    settings = settings or LayoutSettings()
    started = time.perf_counter()
    workloads = {
        n: load_workload(bundle_dir, dataset_dir, requests=settings.requests, candidates=n)
        for n in settings.candidates
    }
    points = []
    with tempfile.TemporaryDirectory(dir=cache_dir("bench")) as tmp:
        for layout in LAYOUTS:
            repository = Path(tmp) / layout
            served_bundle_dir = write_layout_repository(repository, bundle_dir, graphs[layout], layout)
            bundle = load_bundle(served_bundle_dir)
            layout_points = []
            for n, workload in workloads.items():
                items_per_s, call_ms = floor(graphs[layout], workload, layout, bundle, settings.floor_seconds)
                log.info(
                    "%s, %d candidates: floor %.1f items/s (%.1f ms/call)", layout, n, items_per_s, call_ms
                )
                layout_points.append(LayoutPoint(layout, n, items_per_s, call_ms))
            config = TritonServerConfig(
                model_repository=repository, model_control_mode="explicit", load_models=(bundle.model_name,)
            )
            with (
                TritonServer(config) as triton,
                scoring_service(
                    served_bundle_dir, triton.grpc_url, max_candidates=max(settings.candidates)
                ) as target,
            ):
                for point in layout_points:
                    plan = LoadPlan(
                        concurrencies=settings.concurrencies,
                        max_requests=settings.max_requests,
                        max_seconds=settings.max_seconds,
                        warmup_requests=2,
                        timeout_s=settings.timeout_s,
                    )
                    requests = score_requests(workloads[point.candidates].calls)
                    point.served = asyncio.run(bench_service(target, "Score", requests, plan))
                    best = point.best()
                    log.info(
                        "%s, %d candidates: served %.1f items/s",
                        layout,
                        point.candidates,
                        best.items_per_s if best else 0,
                    )
            points += layout_points
    return LayoutResult(
        points,
        asdict(settings),
        {k: str(v) for k, v in graphs.items()},
        time.perf_counter() - started,
    )


def layout_rows(result: LayoutResult) -> list[dict]:
    """One CSV row per layout and candidate count (the best served point; every point is in the JSON)."""
    return [{k: v for k, v in p.as_dict().items() if k != "points"} for p in result.points]


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def _latency_ratio(single: LayoutPoint, multi: LayoutPoint) -> str:
    """p50 of single over multi-item at the lowest concurrency both ran (their best concurrencies differ,
    and a p50 taken at a higher one is mostly queueing), e.g. ``2.33x (c=1)``."""
    loads = sorted({p.load for p in single.served if p.ok} & {p.load for p in multi.served if p.ok})
    if not loads:
        return "-"
    s, m = single.at(loads[0]), multi.at(loads[0])
    return f"{_ratio(s.latency.p50_ms, m.latency.p50_ms)} (c={loads[0]:g})"


def format_layouts(result: LayoutResult) -> str:
    """Markdown: per candidate count, both layouts' floor and served figures, and the ratios."""
    lines = [
        "| candidates | layout | floor items/s | floor ms/call | served items/s (best conc.) | p50 ms | p99 ms | "
        "served / floor |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = [
        "",
        "| candidates | multi-item / single items/s (served) | p50 single / multi (same concurrency) | "
        "multi-item / single (floor) |",
        "|---:|---:|---:|---:|",
    ]
    for n in result.settings["candidates"]:
        pair = {layout: result.point(layout, n) for layout in LAYOUTS}
        for layout, point in pair.items():
            if point is None:
                continue
            best = point.best()
            served = "-" if best is None else f"{best.items_per_s:.1f} (c={best.load:g})"
            p50 = "-" if best is None else f"{best.latency.p50_ms:.0f}"
            p99 = "-" if best is None else f"{best.latency.p99_ms:.0f}"
            lines.append(
                f"| {n} | {layout} | {point.floor_items_per_s:.1f} | {point.floor_call_ms:.1f} | {served} | "
                f"{p50} | {p99} | {_ratio(best.items_per_s if best else None, point.floor_items_per_s)} |"
            )
        single, multi = pair[SCORING_SINGLE], pair[SCORING_MULTI_ITEM]
        if single and multi:
            sb, mb = single.best(), multi.best()
            ratios.append(
                f"| {n} | {_ratio(mb.items_per_s if mb else None, sb.items_per_s if sb else None)} | "
                f"{_latency_ratio(single, multi)} | "
                f"{_ratio(multi.floor_items_per_s, single.floor_items_per_s)} |"
            )
    return "\n".join(lines + ratios) + "\n"
