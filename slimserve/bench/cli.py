"""The ``slimserve bench ...`` subcommands: argument parsing and printing over the bench modules."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

from ..channel import add_client_security_flags, security_from_args
from ..errors import UserError

DEFAULT_REPOSITORY = Path("model_repository")


def _numbers(kind, allow_zero: bool = False):
    def parse(text: str):
        if not text.strip():
            return ()
        try:
            values = tuple(kind(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if any(v < 0 or (v == 0 and not allow_zero) for v in values):
            kinds = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"expected {kinds} numbers, got {text!r}")
        return values

    return parse


def _add_workload_args(parser: argparse.ArgumentParser, candidates: bool = True) -> None:
    from .config import WorkloadConfig

    fields = WorkloadConfig.model_fields
    group = parser.add_argument_group("workload (real prompts)")
    group.add_argument("--dataset", type=Path, help=fields["dataset"].description)
    group.add_argument(
        "--requests", type=int, default=fields["requests"].default, help=fields["requests"].description
    )
    if candidates:
        group.add_argument(
            "--candidates",
            type=int,
            default=fields["candidates"].default,
            help=fields["candidates"].description,
        )


def _write_json(path: Path | None, data) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _command_line() -> str:
    return shlex.join(["slimserve", *sys.argv[1:]])


# -- latency -------------------------------------------------------------------------------------------
def _add_latency(kinds) -> None:
    latency = kinds.add_parser("latency", help="Score latency (p50/p99), one request at a time")
    latency.add_argument("--target", default="127.0.0.1:50051", help="scoring service host:port")
    latency.add_argument("--candidates", type=_numbers(int), default=(1, 50), help="comma-separated counts")
    latency.add_argument("--requests", type=int, default=100, help="measured requests per count")
    latency.add_argument("--warmup", type=int, default=5, help="unmeasured requests per count first")
    latency.add_argument("--json", type=Path, help="also write the results to this JSON file")
    add_client_security_flags(latency)
    latency.set_defaults(handler=_run_latency)


def _run_latency(args: argparse.Namespace) -> int:
    from .latency import format_latency_table, measure_score_latency

    security = security_from_args(args)
    results = measure_score_latency(
        args.target, list(args.candidates), args.requests, args.warmup, security=security
    )
    print(format_latency_table(results))
    _write_json(args.json, [r.as_dict() for r in results])
    return 0


# -- triton --------------------------------------------------------------------------------------------
def _add_triton(kinds) -> None:
    parser = kinds.add_parser("triton", help="perf_analyzer against the repository's models on Triton")
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--triton-url", help="use this running Triton (host:port) instead of starting one")
    parser.add_argument(
        "--models", default="", help="comma-separated model names (default: all token models)"
    )
    parser.add_argument(
        "--bundle-model", default="scorer", help="model whose serving bundle tokenizes prompts"
    )
    parser.add_argument("--concurrency", type=_numbers(int), default=(1, 2, 4, 8, 16), help="e.g. 1,4,16")
    parser.add_argument("--request-rate", type=_numbers(float), default=(), help="Poisson rates, e.g. 10,20")
    parser.add_argument("--buckets", type=_numbers(int), default=(), help="only these length buckets")
    parser.add_argument("--window-requests", type=int, default=100, help="requests per measurement window")
    parser.add_argument("--max-trials", type=int, default=3, help="measurement windows per load point")
    parser.add_argument("--stability", type=float, default=1000.0, help="perf_analyzer -s (percent)")
    parser.add_argument("--batch-size", type=int, default=1, help="perf_analyzer -b")
    parser.add_argument("--max-tokens", type=int, default=32, help="generators: tokens generated per request")
    parser.add_argument("--csv", type=Path, help="write the typed points to this CSV file")
    parser.add_argument("--json", type=Path, help="write the typed points to this JSON file")
    _add_workload_args(parser)
    parser.set_defaults(handler=_run_triton)


def _run_triton(args: argparse.Namespace) -> int:
    from ..bundle import BundleError, bundle_dir_for
    from .perf_analyzer import PerfSettings
    from .report import write_csv
    from .triton_bench import format_perf_table, run_triton_bench
    from .workload import Workload, load_calls, load_workload

    if not args.model_repository.is_dir():
        raise UserError(f"--model-repository {args.model_repository} does not exist")
    try:
        bundle_dir = bundle_dir_for(args.model_repository, args.bundle_model)
    except BundleError:
        bundle_dir = None  # no scorer: only generators can be driven (their prompts need no scoring bundle)
    if bundle_dir is not None:
        workload = load_workload(bundle_dir, args.dataset, requests=args.requests, candidates=args.candidates)
    else:
        calls, source = load_calls(args.dataset, requests=args.requests, candidates=args.candidates)
        workload = Workload(calls, [], (), source)
    print(f"workload: {workload.describe()}")
    settings = PerfSettings(args.window_requests, args.max_trials, args.stability, args.batch_size)
    models = tuple(m for m in args.models.split(",") if m)
    try:
        points = run_triton_bench(
            args.model_repository,
            workload,
            triton_url=args.triton_url,
            models=models,
            concurrencies=args.concurrency,
            request_rates=args.request_rate,
            buckets=args.buckets,
            settings=settings,
            max_tokens=args.max_tokens,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(format_perf_table(points))
    rows = [p.as_dict() for p in points]
    if args.csv:
        write_csv(args.csv, rows)
    _write_json(args.json, rows)
    return 0


# -- load bounds (grpc, generators) ---------------------------------------------------------------------
def _add_load_bounds(
    parser: argparse.ArgumentParser, max_requests: int, max_seconds: float, warmup: int, timeout: float
) -> None:
    parser.add_argument("--max-requests", type=int, default=max_requests, help="most requests per load level")
    parser.add_argument("--max-seconds", type=float, default=max_seconds, help="most seconds per load level")
    parser.add_argument("--warmup", type=int, default=warmup, help="unmeasured requests first")
    parser.add_argument("--timeout", type=float, default=timeout, help="deadline per request (s)")


def _load_plan(args: argparse.Namespace, concurrencies: tuple[int, ...], rates: tuple[float, ...] = ()):
    from .grpc_load import LoadPlan

    return LoadPlan(
        concurrencies=concurrencies,
        rates=rates,
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
        warmup_requests=args.warmup,
        timeout_s=args.timeout,
    )


# -- grpc ----------------------------------------------------------------------------------------------
def _add_grpc(kinds) -> None:
    parser = kinds.add_parser("grpc", help="asyncio load generator against a running service (loopback)")
    parser.add_argument("--target", default="127.0.0.1:50051", help="service host:port (loopback only)")
    parser.add_argument("--method", choices=("Score", "Explain"), default="Score", help="RPC to load")
    parser.add_argument("--concurrency", type=_numbers(int), default=(1, 4, 16), help="closed-loop levels")
    parser.add_argument("--rate", type=_numbers(float), default=(), help="open-loop Poisson rates (req/s)")
    _add_load_bounds(parser, max_requests=500, max_seconds=10.0, warmup=8, timeout=30.0)
    parser.add_argument("--max-tokens", type=int, default=32, help="Explain: tokens to generate")
    parser.add_argument("--json", type=Path, help="write the points to this JSON file")
    _add_workload_args(parser)
    add_client_security_flags(parser)
    parser.set_defaults(handler=_run_grpc)


def _run_grpc(args: argparse.Namespace) -> int:
    from .grpc_load import bench_service, explain_requests, format_load_table, score_requests
    from .workload import load_calls

    calls, source = load_calls(args.dataset, requests=args.requests, candidates=args.candidates)
    requests = score_requests(calls) if args.method == "Score" else explain_requests(calls, args.max_tokens)
    plan = _load_plan(args, args.concurrency, args.rate)
    print(f"workload: {len(calls)} requests from {source}")
    security = security_from_args(args)
    points = asyncio.run(bench_service(args.target, args.method, requests, plan, security=security))
    print(format_load_table(points))
    _write_json(args.json, [p.as_dict() for p in points])
    return 0


# -- compare / report ----------------------------------------------------------------------------------
def _add_compare_args(parser: argparse.ArgumentParser) -> None:
    from ..settings import add_config_flags
    from .config import CompareConfig

    parser.add_argument("--config", type=Path, help="YAML/JSON file with CompareConfig settings")
    add_config_flags(parser, CompareConfig)


def _compare_config(args: argparse.Namespace):
    from ..settings import config_from_args
    from .config import CompareConfig

    return config_from_args(CompareConfig, args, args.config)


def _variants(config):
    from .variants import Variant, variants_from_build

    found = variants_from_build(config.build_dir) if config.build_dir else []
    for text in config.variant:
        name, sep, rest = text.partition("=")
        if not sep or not name:
            raise UserError(f"--variant {text!r}: expected NAME=ONNX[@TORCH]")
        onnx, _, torch = rest.partition("@")
        if not Path(onnx).is_file():
            raise UserError(f"--variant {text!r}: {onnx} is not a file")
        found.append(Variant(name, Path(onnx), torch or None))
    if not found:
        raise UserError("give --build-dir or at least one --variant")
    return found


def _compare(config):
    from ..bundle import bundle_dir_for
    from .compare import run_compare
    from .workload import load_workload

    bundle_dir = bundle_dir_for(config.model_repository, config.model_name)
    variants = _variants(config)
    dataset = config.dataset
    if dataset is None and config.build_dir and (config.build_dir / "data" / "dataset").is_dir():
        dataset = config.build_dir / "data" / "dataset"
    workload = load_workload(bundle_dir, dataset, requests=config.requests, candidates=config.candidates)
    print(f"workload: {workload.describe()}")
    result = run_compare(variants, bundle_dir, workload, config.settings())
    result.layouts = _compare_layouts(config, bundle_dir, dataset)
    return result


def _compare_layouts(config, bundle_dir: Path, dataset: Path | None):
    """Multi-item vs single-sequence of the build's student, when the build published multi-item."""
    from .layouts import graphs_from_build, run_layouts

    if not config.layouts or not config.build_dir:
        return None
    try:
        graphs = graphs_from_build(config.build_dir)
    except FileNotFoundError as exc:
        print(f"layouts: skipped ({exc})")
        return None
    return run_layouts(bundle_dir, graphs, dataset, config.layout_settings())


def _add_compare(kinds) -> None:
    parser = kinds.add_parser("compare", help="in-process engines vs slimserve, variants, batching; ratios")
    _add_compare_args(parser)
    parser.add_argument("--json", type=Path, help="write ratios and figures to this JSON file")
    parser.set_defaults(handler=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from .ratios import compute_ratios, format_ratios
    from .report import render_summary

    result = _compare(_compare_config(args))
    ratios = compute_ratios(result)
    print(render_summary(result))
    print()
    print(format_ratios(ratios))
    _write_json(args.json, {"ratios": [r.as_dict() for r in ratios], "summary": render_summary(result)})
    return 0


def _add_report(kinds) -> None:
    parser = kinds.add_parser("report", help="run the comparison and write markdown, CSV and PNG plots")
    _add_compare_args(parser)
    parser.add_argument("--out", type=Path, help="report folder (default reports/<date-time>)")
    parser.add_argument(
        "--build-report", type=Path, help="build report.json (default <build-dir>/report.json)"
    )
    parser.add_argument(
        "--note", default="", help="a remark printed at the top (e.g. the machine was shared)"
    )
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from .report import default_inputs, write_report

    config = _compare_config(args)
    build_report = args.build_report
    if build_report is None and config.build_dir and (config.build_dir / "report.json").is_file():
        build_report = config.build_dir / "report.json"
    out = args.out or Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    inputs = default_inputs(_command_line(), build_report, args.note)
    result = _compare(config)
    path = write_report(result, inputs, out)
    print(path.read_text())
    print(f"report written to {path.parent}")
    return 0


# -- layouts -------------------------------------------------------------------------------------------
def _add_layouts(kinds) -> None:
    parser = kinds.add_parser(
        "layouts",
        help="multi-item vs single-sequence scoring of the same student: floors and served, side by side",
    )
    parser.add_argument(
        "--build-dir", type=Path, required=True, help="a multi-item build's work directory (its INT8 graphs)"
    )
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY, help="holds the bundle")
    parser.add_argument("--model-name", default="scorer", help="model whose serving bundle is used")
    parser.add_argument(
        "--candidates", type=_numbers(int), default=(1, 10, 50, 200), help="candidates per Score call"
    )
    parser.add_argument("--concurrency", type=_numbers(int), default=(1, 2, 4), help="closed-loop levels")
    parser.add_argument(
        "--requests", type=int, default=16, help="distinct calls (members) per candidate count"
    )
    parser.add_argument("--floor-seconds", type=float, default=4.0, help="seconds per in-process floor")
    parser.add_argument("--max-requests", type=int, default=200, help="most calls per load level")
    parser.add_argument("--max-seconds", type=float, default=8.0, help="most seconds per load level")
    parser.add_argument("--dataset", type=Path, help="dataset directory (default: the build's)")
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.set_defaults(handler=_run_layouts)


def _run_layouts(args: argparse.Namespace) -> int:
    from ..bundle import bundle_dir_for
    from .layouts import LayoutSettings, format_layouts, graphs_from_build, run_layouts

    dataset = args.dataset
    if dataset is None and (args.build_dir / "data" / "dataset").is_dir():
        dataset = args.build_dir / "data" / "dataset"
    try:
        graphs = graphs_from_build(args.build_dir)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    settings = LayoutSettings(
        candidates=args.candidates,
        concurrencies=args.concurrency,
        requests=args.requests,
        floor_seconds=args.floor_seconds,
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
    )
    result = run_layouts(bundle_dir_for(args.model_repository, args.model_name), graphs, dataset, settings)
    print(format_layouts(result))
    print(f"command: {_command_line()}")
    _write_json(args.json, {"command": _command_line(), **result.as_dict()})
    return 0


# -- generators ----------------------------------------------------------------------------------------
def _add_generators(kinds) -> None:
    parser = kinds.add_parser(
        "generators", help="the repository's generator (student) vs its teacher, Explain streams, same stack"
    )
    parser.add_argument(
        "--model-repository", type=Path, default=DEFAULT_REPOSITORY, help="holds the student as 'generator'"
    )
    teacher = parser.add_mutually_exclusive_group()
    teacher.add_argument(
        "--teacher",
        default="default",
        help="teacher to export at the student's precision (default, tiny, dir)",
    )
    teacher.add_argument(
        "--teacher-repository", type=Path, help="a repository already holding the teacher as 'generator'"
    )
    parser.add_argument(
        "--teacher-precision",
        choices=("fp32", "int8", "int4"),
        help="precision of the exported teacher (default: the student's)",
    )
    parser.add_argument("--streams", type=_numbers(int), default=(1, 8), help="concurrent Explain streams")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per explanation (greedy)")
    _add_load_bounds(parser, max_requests=48, max_seconds=60.0, warmup=2, timeout=300.0)
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    _add_workload_args(parser, candidates=False)
    parser.set_defaults(handler=_run_generators)


def _run_generators(args: argparse.Namespace) -> int:
    from .generators import compare_generators, format_comparison
    from .workload import load_calls

    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    calls, source = load_calls(args.dataset, requests=args.requests, candidates=1)
    plan = _load_plan(args, args.streams)
    print(f"workload: {len(calls)} explanation prompts from {source}")
    result = compare_generators(
        args.model_repository,
        calls,
        plan,
        args.max_tokens,
        args.teacher,
        args.teacher_repository,
        args.teacher_precision,
    )
    print(format_comparison(result))
    _write_json(args.json, {"command": _command_line(), **result.as_dict()})
    return 0


# -- faults ---------------------------------------------------------------------------------------------
def _add_faults(kinds) -> None:
    from ..settings import add_config_flags
    from .faults.config import FaultsConfig

    parser = kinds.add_parser(
        "faults",
        help="fuzz, overload, Triton killed/frozen, SIGTERM, publish (and soak) against a stack it starts",
    )
    parser.add_argument("--config", type=Path, help="YAML/JSON file with FaultsConfig settings")
    add_config_flags(parser, FaultsConfig)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.set_defaults(handler=_run_faults)


def _run_faults(args: argparse.Namespace) -> int:
    from ..settings import config_from_args
    from .faults import FaultsConfig, format_faults_table, run_faults

    config = config_from_args(FaultsConfig, args, args.config)
    results = run_faults(config, on_result=lambda r: print(format_faults_table([r]), flush=True))
    missed = [r.case for r in results if not r.met]
    print(f"\n{format_faults_table(results)}\n\ncommand: {_command_line()}")
    print("targets: all met" if not missed else f"targets missed in: {', '.join(missed)}")
    _write_json(args.json, {"command": _command_line(), "cases": [r.as_dict() for r in results]})
    return 0


def add_bench_commands(subparsers) -> None:
    """``slimserve bench {latency,triton,grpc,compare,report,layouts,generators,faults}``."""
    parser = subparsers.add_parser("bench", help="benchmarks: perf_analyzer, gRPC load, comparison, report")
    kinds = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for add in (
        _add_latency,
        _add_triton,
        _add_grpc,
        _add_compare,
        _add_report,
        _add_layouts,
        _add_generators,
        _add_faults,
    ):
        add(kinds)
