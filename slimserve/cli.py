"""The ``slimserve`` command line: a thin layer of subcommands over Python functions.

Exit codes: 0 success, 1 user or configuration error (message only), 2 a stage failed (message and log).
Nothing heavy is imported until a subcommand runs, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from .errors import classify_failure
from .signals import exit_on_sigterm

EXIT_OK, EXIT_USER_ERROR, EXIT_STAGE_FAILED = 0, 1, 2
# What ``slimserve --help`` tells a user (the module docstring above is for developers).
DESCRIPTION = (
    "Distil a recommendation LLM into small students, publish them into a Triton model repository and "
    "serve them over gRPC: Score ranks candidates for a member, Explain says why one fits. "
    "`slimserve up` does it all (builds the default recipe unless it is published, starts Triton and the "
    "services, answers a sample request, serves); `build`, `export`, `triton`, `serve`, `score` and "
    "`bench` run one step at a time."
)

log = logging.getLogger("slimserve")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


# -- export -------------------------------------------------------------------------------------------
def _add_export(sub) -> None:
    from .export.pipeline import ScorerExportConfig
    from .settings import add_config_arguments

    parser = sub.add_parser("export", help="export a teacher as the scoring model into a Triton repository")
    add_config_arguments(parser, ScorerExportConfig)
    parser.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from .export.pipeline import ScorerExportConfig, export_scorer
    from .settings import config_from_args

    config = config_from_args(ScorerExportConfig, args, args.config)
    result = export_scorer(config)
    print(f"published {result.model_dir} (version {result.version}, bundle hash {result.content_hash[:12]})")
    print(
        f"parity: max abs diff {result.parity.max_abs_diff:.3g}, ranking identical: {result.parity.ranking_identical}"
    )
    print("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items()))
    return EXIT_OK


# -- build ------------------------------------------------------------------------------------------
def _add_build(sub) -> None:
    parser = sub.add_parser(
        "build", help="data -> teacher fine-tune -> distill -> prune -> re-distill -> INT8 -> publish"
    )
    parser.add_argument(
        "--recipe",
        default="cpu",
        help="tiny, cpu, gpu, tiny-gpu (shipped in slimserve/recipes) or a YAML path",
    )
    parser.add_argument("--teacher", help="override teacher.source: default, tiny or a HF model directory")
    parser.add_argument("--work-dir", type=Path, help="stage outputs (default build_output/<recipe>)")
    parser.add_argument("--model-repository", type=Path, help="override publish.model_repository")
    parser.add_argument("--restart", action="store_true", help="ignore finished stages and start over")
    parser.set_defaults(handler=_run_build)


def _run_build(args: argparse.Namespace) -> int:
    from .buildstage.recipe import load_recipe
    from .buildstage.runner import run_build

    recipe = load_recipe(args.recipe)
    updates = {}
    if args.teacher:
        updates["teacher"] = recipe.teacher.model_copy(update={"source": args.teacher})
    if args.work_dir:
        updates["work_dir"] = args.work_dir
    if args.model_repository:
        updates["publish"] = recipe.publish.model_copy(update={"model_repository": args.model_repository})
    recipe = recipe.model_copy(update=updates)
    result = run_build(recipe, restart=args.restart, command=f"slimserve build --recipe {args.recipe}")
    bayes = "n/a" if result.bayes_optimal_auc is None else f"{result.bayes_optimal_auc:.3f}"
    print(f"\nStages (recipe {recipe.name}; Bayes-optimal test AUC {bayes}):\n")
    print(result.table())
    print(f"\npublished {result.published.path} (version {result.published.version})")
    if result.generator_published is not None:
        print(f"published {result.generator_published} (generator)")
    print(f"report: {recipe.resolved_work_dir() / 'report.md'}")
    return EXIT_OK


# -- data -------------------------------------------------------------------------------------------
def _add_data(sub) -> None:
    from .data.cli import add_data_commands

    add_data_commands(sub)


# -- triton -------------------------------------------------------------------------------------------
def _add_triton(sub) -> None:
    from .settings import add_config_arguments
    from .triton_config import TritonConfig

    parser = sub.add_parser("triton", help="run the Triton server alone on a model repository")
    add_config_arguments(parser, TritonConfig)
    parser.set_defaults(handler=_run_triton)


def _run_triton(args: argparse.Namespace) -> int:
    from .serving.triton.launcher import TritonServer
    from .settings import config_from_args
    from .signals import wait_for_stop_signal
    from .triton_config import TritonConfig

    config = config_from_args(TritonConfig, args, args.config)
    with TritonServer(config.server_config()) as server:
        print(f"Triton ready: gRPC {server.grpc_url}, HTTP {server.http_url}, metrics {server.metrics_url}")
        print(f"log: {server.log_path}  (Ctrl-C to stop)")
        wait_for_stop_signal(server.is_running)
    return EXIT_OK


# -- serve --------------------------------------------------------------------------------------------
def _add_serve(sub) -> None:
    from .serving.scoring.config import ScoringServiceConfig
    from .settings import add_config_arguments

    parser = sub.add_parser("serve", help="run the scoring gRPC service against a running Triton")
    add_config_arguments(parser, ScoringServiceConfig)
    parser.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from .serving.scoring.config import ScoringServiceConfig
    from .serving.scoring.server import run_scoring_service
    from .settings import config_from_args

    run_scoring_service(config_from_args(ScoringServiceConfig, args, args.config))
    return EXIT_OK


# -- reasoning: serve-reasoning, explain, generate ------------------------------------------------------
def _add_reasoning(sub) -> None:
    from .reasoning_cli import add_reasoning_commands

    add_reasoning_commands(sub)


# -- up -----------------------------------------------------------------------------------------------
def _add_up(sub) -> None:
    from .settings import add_config_arguments
    from .up_config import UpConfig

    parser = sub.add_parser(
        "up",
        help="build the default recipe (or --recipe) unless already published, start Triton and the "
        "services, answer sample requests, serve; --teacher-only: the teacher zero-shot, no build",
    )
    add_config_arguments(parser, UpConfig)
    parser.set_defaults(handler=_run_up)


def _run_up(args: argparse.Namespace) -> int:
    from .settings import config_from_args
    from .up import run_up
    from .up_config import UpConfig

    return run_up(config_from_args(UpConfig, args, args.config))


# -- score --------------------------------------------------------------------------------------------
def _add_score(sub) -> None:
    from .channel import add_client_security_flags

    parser = sub.add_parser("score", help="rank candidates for a member through the scoring service")
    parser.add_argument("--target", default="127.0.0.1:50051", help="scoring service address host:port")
    parser.add_argument(
        "--input", type=Path, help="JSON file {member: {...}, candidates: [...]}; default: built-in example"
    )
    parser.add_argument("--candidates", type=int, default=10, help="built-in example: number of candidates")
    parser.add_argument("--top-k", type=int, default=0, help="items to return (0: all)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")
    add_client_security_flags(parser)
    parser.set_defaults(handler=_run_score)


def _run_score(args: argparse.Namespace) -> int:
    from .channel import security_from_args
    from .client import load_score_input, print_ranking, score_once

    member, candidates = load_score_input(args.input, args.candidates)
    security = security_from_args(args)
    result = score_once(
        args.target, member, candidates, top_k=args.top_k, timeout_s=args.timeout, security=security
    )
    print_ranking(result, candidates, as_json=args.json)
    return EXIT_OK


# -- bench ------------------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    from .bench.cli import add_bench_commands

    add_bench_commands(sub)


COMMANDS: tuple[Callable, ...] = (
    _add_data,
    _add_build,
    _add_export,
    _add_triton,
    _add_serve,
    _add_reasoning,
    _add_up,
    _add_score,
    _add_bench,
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser (each subcommand with its own ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="slimserve",
        description=DESCRIPTION,
        epilog="Each command has its own --help; `slimserve up` builds the default students and serves them "
        "(README.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``slimserve`` script."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    exit_on_sigterm()
    return run_handler(args)


def run_handler(args: argparse.Namespace) -> int:
    """Run a parsed command, turning known failures into exit codes and one-line messages."""
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        kind, message = classify_failure(exc)
        if kind is None:
            raise
        print(f"slimserve {args.command}: {message}", file=sys.stderr)
        return EXIT_USER_ERROR if kind == "user" else EXIT_STAGE_FAILED


if __name__ == "__main__":
    sys.exit(main())
