"""``slimserve bench compare``: in-process engines and slimserve (gRPC -> Triton) side by side, one run.

Same machine, same model files, same prompts (one :class:`Workload`). For every variant (teacher FP32,
student FP32, student INT8): ONNX Runtime in process with ideal batches (the floor), PyTorch in process,
and the served path under closed-loop concurrency and open-loop Poisson load at half its saturation rate.
The last variant (the one slimserve publishes) is also served with dynamic batching off and with each
queue delay, and driven by perf_analyzer directly on Triton. The result carries the ratios the issue's
targets are stated in: on noisy machines, ratios from one run are what hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cache import cache_dir
from .config import CompareSettings
from .grpc_load import LoadPlan, LoadPoint, bench_service, open_loop, score_call, score_requests
from .inprocess import ORT_FLOOR, EngineResult, load_torch_scorer, onnx_floor, torch_speed
from .layouts import LayoutResult
from .perf_analyzer import PerfPoint, PerfSettings
from .variants import Batching, Variant, batching_configs, template_note, write_variant_repository
from .workload import Workload

log = logging.getLogger(__name__)

ORT_FLOOR_AGAIN = "onnxruntime in process (end of run)"


@dataclass
class ServedRun:
    """One variant served by slimserve with one batching config: gRPC load points and perf_analyzer points."""

    variant: str
    batching: str
    batching_text: str
    config_pbtxt: str
    points: list[LoadPoint] = field(default_factory=list)
    perf: list[PerfPoint] = field(default_factory=list)

    def closed(self) -> list[LoadPoint]:
        return [p for p in self.points if p.mode == "closed"]

    def best(self) -> LoadPoint | None:
        closed = [p for p in self.closed() if p.ok]
        return max(closed, key=lambda p: p.items_per_s) if closed else None

    def at_concurrency(self, concurrency: int) -> LoadPoint | None:
        return next((p for p in self.closed() if p.load == concurrency), None)

    def open_point(self) -> LoadPoint | None:
        return next((p for p in self.points if p.mode == "open"), None)


@dataclass
class CompareResult:
    """Everything one comparison measured, with the settings and workload it ran with."""

    workload: str
    settings: dict
    engines: list[EngineResult]
    served: list[ServedRun]
    seconds: float = 0.0
    stages: dict[str, str] = field(default_factory=dict)  # variant -> build-report stage
    notes: list[str] = field(default_factory=list)
    layouts: LayoutResult | None = None  # multi-item vs single-sequence of the published student

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(e.variant for e in self.engines))

    def engine(self, variant: str, engine: str) -> EngineResult | None:
        return next((e for e in self.engines if e.variant == variant and e.engine == engine), None)

    def floor_items_per_s(self, variant: str) -> float | None:
        """The ONNX Runtime floor of a variant (mean of the start and end measurements when both exist)."""
        values = [
            e.items_per_s
            for e in self.engines
            if e.variant == variant and e.engine in (ORT_FLOOR, ORT_FLOOR_AGAIN)
        ]
        return sum(values) / len(values) if values else None

    def run(self, variant: str, batching: str) -> ServedRun | None:
        return next((r for r in self.served if r.variant == variant and r.batching == batching), None)


def _serve_and_load(
    repository: Path,
    bundle_dir: Path,
    workload: Workload,
    settings: CompareSettings,
    run: ServedRun,
    perf: bool,
) -> None:
    from ..serving.triton.launcher import TritonServer, TritonServerConfig
    from .service import scoring_service
    from .triton_bench import run_triton_bench

    plan = LoadPlan(
        concurrencies=settings.concurrencies,
        max_requests=settings.max_requests,
        max_seconds=settings.max_seconds,
        timeout_s=settings.timeout_s,
    )
    config = TritonServerConfig(
        model_repository=repository,
        model_control_mode="explicit",
        load_models=("scorer",),
        startup_timeout_s=600,
    )
    requests = score_requests(workload.calls)
    with TritonServer(config) as triton:
        with scoring_service(bundle_dir, triton.grpc_url, default_timeout_s=settings.timeout_s) as target:
            run.points = asyncio.run(bench_service(target, "Score", requests, plan))
            best = max((p.requests_per_s for p in run.points), default=0.0)
            if best > 0 and settings.open_loop_fraction > 0:
                rate = best * settings.open_loop_fraction
                run.points.append(
                    asyncio.run(_open(target, requests, rate, plan, settings.open_loop_seconds))
                )
        if perf and settings.perf_concurrencies:
            groups = workload.by_bucket()
            dominant = max(groups, key=lambda b: len(groups[b]))  # most prompts pad to it
            run.perf = run_triton_bench(
                repository,
                workload,
                triton_url=triton.grpc_url,
                concurrencies=settings.perf_concurrencies,
                buckets=(dominant,),
                settings=PerfSettings(
                    window_requests=settings.perf_window_requests, timeout_s=settings.timeout_s * 5
                ),
            )


async def _open(target: str, requests: list, rate: float, plan: LoadPlan, seconds: float) -> LoadPoint:
    import grpc

    async with grpc.aio.insecure_channel(target) as channel:
        call = score_call(channel, requests, plan.timeout_s)
        return await open_loop(call, "Score", rate, plan.max_requests, seconds)


def serve_variant(
    variant: Variant,
    batching: Batching,
    bundle_dir: Path,
    workload: Workload,
    settings: CompareSettings,
    perf: bool,
) -> ServedRun:
    """Publish ``variant`` with ``batching`` into a temporary repository, serve it, load it."""
    with tempfile.TemporaryDirectory(prefix="bench-repo-", dir=cache_dir("bench")) as tmp:
        repository = Path(tmp) / "model_repository"
        variant_bundle = write_variant_repository(repository, bundle_dir, variant, batching)
        config_text = (repository / "scorer" / "config.pbtxt").read_text()
        run = ServedRun(variant.name, batching.name, batching.describe(), config_text)
        log.info("serving %s with %s", variant.name, batching.describe())
        _serve_and_load(repository, variant_bundle, workload, settings, run, perf)
    return run


def measure_engines(
    variant: Variant, workload: Workload, settings: CompareSettings, yes_no: tuple[int, int]
) -> list[EngineResult]:
    """The ONNX Runtime floor and (when the variant has a PyTorch source) the PyTorch baseline."""
    results = [
        onnx_floor(variant.name, variant.onnx, workload, settings.engine_seconds, settings.floor_batch_sizes)
    ]
    if settings.pytorch and variant.torch_source:
        graph = load_torch_scorer(variant.torch_source, *yes_no)
        results.append(
            torch_speed(variant.name, graph, workload, settings.engine_seconds, settings.batch_size)
        )
        del graph
    return results


def drift_note(engines: list[EngineResult], variant: str) -> str | None:
    """The published variant's floor before and after the served runs (the ratios use their mean)."""
    first = next((e for e in engines if e.variant == variant and e.engine == ORT_FLOOR), None)
    last = next((e for e in engines if e.variant == variant and e.engine == ORT_FLOOR_AGAIN), None)
    if first is None or last is None:
        return None
    change = (last.items_per_s - first.items_per_s) / first.items_per_s * 100 if first.items_per_s else 0.0
    return (
        f"ONNX Runtime floor of {variant}: {first.items_per_s:.1f} items/s at the start, {last.items_per_s:.1f} "
        f"after the served runs ({change:+.0f} %); the ratios to the floor use the mean of the two."
    )


def run_compare(
    variants: list[Variant], bundle_dir: Path, workload: Workload, settings: CompareSettings | None = None
) -> CompareResult:
    """Measure every variant in process and served; the last variant also gets the batching sweep."""
    from ..bundle import load_bundle

    settings = settings or CompareSettings()
    if not variants:
        raise ValueError("no variants to compare")
    bundle = load_bundle(bundle_dir)
    started = time.perf_counter()
    engines: list[EngineResult] = []
    for variant in variants:
        engines += measure_engines(variant, workload, settings, (bundle.yes_token_id, bundle.no_token_id))
    configs = batching_configs(settings.delays_us, bundle.max_batch_size)
    main = next(
        (b for b in configs if b.max_queue_delay_us == settings.main_delay_us and b.dynamic), configs[-1]
    )
    served = [serve_variant(v, main, bundle_dir, workload, settings, perf=False) for v in variants[:-1]]
    for batching in configs:
        served.append(
            serve_variant(variants[-1], batching, bundle_dir, workload, settings, perf=batching is main)
        )
    # The published variant's floor once more, after the served runs: how far the machine drifted.
    published = variants[-1]
    again = onnx_floor(
        published.name, published.onnx, workload, settings.engine_seconds, settings.floor_batch_sizes
    )
    engines.append(dataclasses.replace(again, engine=ORT_FLOOR_AGAIN))
    settings_dict = asdict(settings) | {"main_batching": main.name}
    stages = {v.name: v.stage for v in variants if v.stage}
    notes = [n for n in (template_note(bundle_dir), drift_note(engines, published.name)) if n]
    return CompareResult(
        workload.describe(), settings_dict, engines, served, time.perf_counter() - started, stages, notes
    )
