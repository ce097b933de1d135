"""The ``slimserve bench ...`` subcommands: flags from each command's settings (``bench.config``), printing."""

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
from ..settings import add_config_arguments


def _config(model: type, args: argparse.Namespace):
    """The command's settings: defaults < ``--config`` file < environment < flags."""
    from ..settings import config_from_args

    return config_from_args(model, args, args.config)


def _write_json(path: Path | None, data) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _command_line() -> str:
    return shlex.join(["slimserve", *sys.argv[1:]])


def _add_configured(kinds, name: str, help_text: str, model: type, handler, json_help: str) -> None:
    """A subcommand whose flags are ``model``'s fields (plus ``--config``), with ``--json``."""
    parser = kinds.add_parser(name, help=help_text)
    add_config_arguments(parser, model)
    parser.add_argument("--json", type=Path, help=json_help)
    parser.set_defaults(handler=handler)


# -- latency -------------------------------------------------------------------------------------------
def _add_latency(kinds) -> None:
    from .config import LatencyBenchConfig

    parser = kinds.add_parser("latency", help="Score latency (p50/p99), one request at a time")
    add_config_arguments(parser, LatencyBenchConfig)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    add_client_security_flags(parser)
    parser.set_defaults(handler=_run_latency)


def _run_latency(args: argparse.Namespace) -> int:
    from .config import LatencyBenchConfig
    from .latency import format_latency_table, measure_score_latency

    config = _config(LatencyBenchConfig, args)
    security = security_from_args(args)
    results = measure_score_latency(
        config.target, list(config.candidates), config.requests, config.warmup, security=security
    )
    print(format_latency_table(results))
    _write_json(args.json, [r.as_dict() for r in results])
    return 0


# -- triton --------------------------------------------------------------------------------------------
def _add_triton(kinds) -> None:
    from .config import TritonBenchConfig

    parser = kinds.add_parser("triton", help="perf_analyzer against the repository's models on Triton")
    add_config_arguments(parser, TritonBenchConfig)
    parser.add_argument("--csv", type=Path, help="write the typed points to this CSV file")
    parser.add_argument("--json", type=Path, help="write the typed points to this JSON file")
    parser.set_defaults(handler=_run_triton)


def _run_triton(args: argparse.Namespace) -> int:
    from ..bundle import BundleError, bundle_dir_for
    from .config import TritonBenchConfig
    from .report import write_csv
    from .triton_bench import format_perf_table, run_triton_bench
    from .workload import Workload, load_calls, load_workload

    config = _config(TritonBenchConfig, args)
    if not config.model_repository.is_dir():
        raise UserError(f"--model-repository {config.model_repository} does not exist")
    try:
        bundle_dir = bundle_dir_for(config.model_repository, config.bundle_model)
    except BundleError:
        bundle_dir = None  # no scorer: only generators can be driven (their prompts need no scoring bundle)
    counts = {"requests": config.requests, "candidates": config.candidates}
    if bundle_dir is not None:
        workload = load_workload(bundle_dir, config.dataset, **counts)
    else:
        calls, source = load_calls(config.dataset, **counts)
        workload = Workload(calls, [], (), source)
    print(f"workload: {workload.describe()}")
    try:
        points = run_triton_bench(
            config.model_repository,
            workload,
            triton_url=config.triton_url,
            models=config.models,
            concurrencies=config.concurrency,
            request_rates=config.request_rate,
            buckets=config.buckets,
            settings=config.perf_settings(),
            max_tokens=config.max_tokens,
            tls=config.perf_tls(),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(format_perf_table(points))
    rows = [p.as_dict() for p in points]
    if args.csv:
        write_csv(args.csv, rows)
    _write_json(args.json, rows)
    return 0


# -- grpc ----------------------------------------------------------------------------------------------
def _add_grpc(kinds) -> None:
    from .config import GrpcBenchConfig

    parser = kinds.add_parser("grpc", help="asyncio load generator against a running service (loopback)")
    add_config_arguments(parser, GrpcBenchConfig)
    parser.add_argument("--json", type=Path, help="write the points to this JSON file")
    add_client_security_flags(parser)
    parser.set_defaults(handler=_run_grpc)


def _run_grpc(args: argparse.Namespace) -> int:
    from .config import GrpcBenchConfig
    from .grpc_load import bench_service, explain_requests, format_load_table, score_requests
    from .workload import load_calls

    config = _config(GrpcBenchConfig, args)
    calls, source = load_calls(config.dataset, requests=config.requests, candidates=config.candidates)
    if config.method == "Score":
        requests = score_requests(calls)
    else:
        requests = explain_requests(calls, config.max_tokens)
    print(f"workload: {len(calls)} requests from {source}")
    security = security_from_args(args)
    points = asyncio.run(
        bench_service(config.target, config.method, requests, config.load_plan(), security=security)
    )
    print(format_load_table(points))
    _write_json(args.json, [p.as_dict() for p in points])
    return 0


# -- compare / report ----------------------------------------------------------------------------------
def _add_compare_args(parser: argparse.ArgumentParser) -> None:
    from .config import CompareConfig

    add_config_arguments(parser, CompareConfig)


def _compare_config(args: argparse.Namespace):
    from .config import CompareConfig

    return _config(CompareConfig, args)


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
    from .config import LayoutsConfig

    _add_configured(
        kinds,
        "layouts",
        "multi-item vs single-sequence scoring of the same student: floors and served, side by side",
        LayoutsConfig,
        _run_layouts,
        "write every figure to this JSON file",
    )


def _run_layouts(args: argparse.Namespace) -> int:
    from ..bundle import bundle_dir_for
    from .config import LayoutsConfig
    from .layouts import format_layouts, graphs_from_build, run_layouts

    config = _config(LayoutsConfig, args)
    if config.build_dir is None:
        raise UserError("give --build-dir: a multi-item build's work directory (build_dir)")
    dataset = config.dataset
    if dataset is None and (config.build_dir / "data" / "dataset").is_dir():
        dataset = config.build_dir / "data" / "dataset"
    try:
        graphs = graphs_from_build(config.build_dir)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    bundle_dir = bundle_dir_for(config.model_repository, config.model_name)
    result = run_layouts(bundle_dir, graphs, dataset, config.settings())
    print(format_layouts(result))
    print(f"command: {_command_line()}")
    _write_json(args.json, {"command": _command_line(), **result.as_dict()})
    return 0


# -- generators ----------------------------------------------------------------------------------------
def _add_generators(kinds) -> None:
    from .config import GeneratorsBenchConfig

    _add_configured(
        kinds,
        "generators",
        "the repository's generator (student) vs its teacher, Explain streams, same stack",
        GeneratorsBenchConfig,
        _run_generators,
        "write the figures to this JSON file",
    )


def _run_generators(args: argparse.Namespace) -> int:
    from .config import GeneratorsBenchConfig
    from .generators import compare_generators, format_comparison
    from .workload import load_calls

    config = _config(GeneratorsBenchConfig, args)
    calls, source = load_calls(config.dataset, requests=config.requests, candidates=1)
    print(f"workload: {len(calls)} explanation prompts from {source}")
    result = compare_generators(
        config.model_repository,
        calls,
        config.load_plan(),
        config.max_tokens,
        config.teacher,
        config.teacher_repository,
        config.teacher_precision,
    )
    print(format_comparison(result))
    _write_json(args.json, {"command": _command_line(), **result.as_dict()})
    return 0


# -- faults ---------------------------------------------------------------------------------------------
def _add_faults(kinds) -> None:
    from .faults.config import FaultsConfig

    _add_configured(
        kinds,
        "faults",
        "fuzz, overload, Triton killed/frozen, SIGTERM, publish (and soak) against a stack it starts",
        FaultsConfig,
        _run_faults,
        "also write the figures to this JSON file",
    )


def _run_faults(args: argparse.Namespace) -> int:
    from .faults import FaultsConfig, format_faults_table, run_faults

    config = _config(FaultsConfig, args)
    results = run_faults(config, on_result=lambda r: print(format_faults_table([r]), flush=True))
    missed = [r.case for r in results if not r.met]
    print(f"\n{format_faults_table(results)}\n\ncommand: {_command_line()}")
    print("targets: all met" if not missed else f"targets missed in: {', '.join(missed)}")
    _write_json(args.json, {"command": _command_line(), "cases": [r.as_dict() for r in results]})
    return 0


# -- floor ---------------------------------------------------------------------------------------------
def _add_floor(kinds) -> None:
    from .floor import FloorConfig

    _add_configured(
        kinds,
        "floor",
        "a build's stages: seconds, linear-layer FLOPs, and their time at this machine's peak",
        FloorConfig,
        _run_floor,
        "also write the figures to this JSON file",
    )


def _run_floor(args: argparse.Namespace) -> int:
    from .floor import FloorConfig, format_floor, run_floor

    report = run_floor(_config(FloorConfig, args))
    print(f"{format_floor(report)}\n\ncommand: {_command_line()}")
    _write_json(args.json, {"command": _command_line(), **report.as_dict()})
    return 0


def add_bench_commands(subparsers) -> None:
    """``slimserve bench {latency,triton,grpc,compare,report,layouts,generators,faults,floor}``."""
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
        _add_floor,
    ):
        add(kinds)
