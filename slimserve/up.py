"""``slimserve up``: export the scorer if none is published, start Triton and the services, demo, serve.

The one command of the README's quick start. Triton runs as a child process (or is reached at
``--triton-url``); the scoring service runs in this process, and so does the reasoning service when the
repository also holds a ``generator`` model. Ctrl-C or SIGTERM drains the services, then stops Triton,
leaving no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from .bundle import BundleError, bundle_dir_for, load_bundle
from .errors import StageError

log = logging.getLogger(__name__)


@dataclass
class UpOptions:
    """What ``slimserve up`` starts and where."""

    teacher: str = "default"
    recipe: str | None = None  # build this recipe when nothing is published (else: export the teacher)
    work_dir: Path | None = None  # the build's stage outputs (default: the recipe's)
    model_repository: Path = Path("model_repository")
    model_name: str = "scorer"
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9090
    triton_url: str | None = None
    triton_grpc_port: int = 0
    triton_http_port: int = 0
    triton_metrics_port: int = 0
    startup_timeout_s: float = 300.0
    sample: bool = True
    exit_after_sample: bool = False
    generator_name: str = "generator"  # served by the reasoning service when published in the repository
    export_generator: bool = True  # without --recipe: also export the teacher as the generator if none
    reasoning_port: int = 50052
    reasoning_metrics_port: int = 9091


def ensure_exported(options: UpOptions) -> Path:
    """The bundle directory of the latest published scorer, exporting ``options.teacher`` first if none."""
    try:
        directory = bundle_dir_for(options.model_repository, options.model_name)
        bundle = load_bundle(directory)
        log.info(
            "using published %s version %d (%s)", bundle.model_name, bundle.model_version, bundle.source_model
        )
        return directory
    except BundleError:
        pass
    if options.recipe:
        return _build(options)
    from .export.pipeline import ScorerExportConfig, export_scorer

    log.info(
        "no published %r in %s: exporting teacher %r",
        options.model_name,
        options.model_repository,
        options.teacher,
    )
    config = ScorerExportConfig(
        teacher=options.teacher, model_repository=options.model_repository, model_name=options.model_name
    )
    result = export_scorer(config, command=f"slimserve export --teacher {options.teacher}")
    log.info("exported version %d in %.0f s", result.version, sum(result.seconds.values()))
    return bundle_dir_for(options.model_repository, options.model_name, result.version)


def _build(options: UpOptions) -> Path:
    from .buildstage.recipe import load_recipe
    from .buildstage.runner import run_build

    recipe = load_recipe(options.recipe)
    publish = recipe.publish.model_copy(
        update={"model_repository": options.model_repository, "model_name": options.model_name}
    )
    updates = {"publish": publish}
    if options.work_dir is not None:
        updates["work_dir"] = options.work_dir
    log.info(
        "no published %r in %s: building recipe %r",
        options.model_name,
        options.model_repository,
        options.recipe,
    )
    result = run_build(
        recipe.model_copy(update=updates), command=f"slimserve build --recipe {options.recipe}"
    )
    print(f"\nBuild (recipe {recipe.name}):\n{result.table()}\n")  # noqa: T201
    return bundle_dir_for(options.model_repository, options.model_name, result.published.version)


def published_generator(options: UpOptions) -> Path | None:
    """The bundle directory of the latest published generator, or None when the repository has none."""
    from .generation_bundle import generation_bundle_dir, load_generation_bundle

    try:
        directory = generation_bundle_dir(options.model_repository, options.generator_name)
        bundle = load_generation_bundle(directory)
    except BundleError as exc:
        if (options.model_repository / options.generator_name).exists():
            log.warning("not serving %r: %s", options.generator_name, exc)
        return None
    log.info(
        "using published %s version %d (%s)", bundle.model_name, bundle.model_version, bundle.source_model
    )
    return directory


def _export_teacher_generator(options: UpOptions) -> Path:
    """Publish the teacher itself (full precision) as the generator, so that ``up`` explains without a build."""
    from .export.generator_repository import publish_generator
    from .export.teacher import load_teacher
    from .generation_bundle import generation_bundle_dir

    log.info(
        "no published %r in %s: exporting teacher %r as the generator",
        options.generator_name,
        options.model_repository,
        options.teacher,
    )
    loaded = load_teacher(options.teacher)
    publish_generator(
        loaded.model,
        loaded.tokenizer_file,
        options.model_repository,
        quantize=None,
        name=options.generator_name,
        source_model=loaded.name,
    )
    return generation_bundle_dir(options.model_repository, options.generator_name)


def _start_triton(options: UpOptions, models: tuple[str, ...]):
    from .serving.triton.launcher import TritonServer, TritonServerConfig

    server = TritonServer(
        TritonServerConfig(
            model_repository=options.model_repository.resolve(),
            grpc_port=options.triton_grpc_port,
            http_port=options.triton_http_port,
            metrics_port=options.triton_metrics_port,
            model_control_mode="explicit",
            load_models=models,
            startup_timeout_s=options.startup_timeout_s,
        )
    )
    started = time.perf_counter()
    server.start()
    log.info(
        "Triton ready in %.1f s: gRPC %s (log %s)",
        time.perf_counter() - started,
        server.grpc_url,
        server.log_path,
    )
    return server


async def _start_reasoning(options: UpOptions, triton_url: str, generator_dir: Path):
    """Start the reasoning service on the generator and wait until it serves."""
    from .serving.reasoning.config import ReasoningServiceConfig
    from .serving.reasoning.server import ReasoningServer

    config = ReasoningServiceConfig(
        host=options.host,
        port=options.reasoning_port,
        metrics_port=options.reasoning_metrics_port,
        triton_url=triton_url,
        bundle_dir=generator_dir,
    )
    server = ReasoningServer(config)
    try:
        port = await server.start()
        if not await server.core.watcher.wait_until_ready(timeout=options.startup_timeout_s):
            raise StageError(f"reasoning service not ready: {server.core.watcher.last_error}")
    except BaseException:
        await server.stop(grace=0)
        raise
    print(f"ReasoningService on {options.host}:{port} (metrics :{server.metrics_port})")  # noqa: T201
    return server


async def _sample_explanation(target: str) -> None:
    """Stream one explanation for the example member and job to the terminal."""
    from .examples import EXAMPLE_MEMBER, example_candidates
    from .reasoning_client import build_options, explain_request, format_metadata
    from .v1 import reasoning_pb2_grpc

    item = example_candidates(1)[0]
    print(f"\nSample explanation: why {item.title} at {item.company} for the example member:\n")  # noqa: T201
    request = explain_request(EXAMPLE_MEMBER, item, build_options(max_tokens=64))
    async with grpc.aio.insecure_channel(target) as channel:
        async for chunk in reasoning_pb2_grpc.ReasoningServiceStub(channel).Explain(request, timeout=120):
            print(chunk.text, end="", flush=True)  # noqa: T201
            if chunk.HasField("metadata"):
                print(f"\n\n{format_metadata(chunk.metadata)}")  # noqa: T201
    print(f"\nTry: slimserve explain --target {target}")  # noqa: T201


async def _serve(options: UpOptions, triton_url: str, bundle_dir: Path, generator_dir: Path | None) -> int:
    from .client import build_request, format_ranking
    from .examples import EXAMPLE_MEMBER, example_candidates
    from .serving.config import ScoringServiceConfig
    from .serving.server import ScoringServer
    from .v1 import scoring_pb2_grpc

    config = ScoringServiceConfig(
        host=options.host,
        port=options.port,
        metrics_port=options.metrics_port,
        triton_url=triton_url,
        bundle_dir=bundle_dir,
    )
    server = ScoringServer(config)
    reasoning = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        port = await server.start()
        if not await server.core.watcher.wait_until_ready(timeout=options.startup_timeout_s):
            raise StageError(f"scoring service not ready: {server.core.watcher.last_error}")
        target = f"{options.host}:{port}"
        print(f"\nScoringService on {target} (metrics :{server.metrics_port}), Triton at {triton_url}")  # noqa: T201
        print("plaintext, no token: for this machine only (TLS, mTLS, tokens: docs/security.md)")  # noqa: T201
        if generator_dir is not None:
            reasoning = await _start_reasoning(options, triton_url, generator_dir)
        if options.sample:
            candidates = example_candidates(10)
            async with grpc.aio.insecure_channel(target) as channel:
                stub = scoring_pb2_grpc.ScoringServiceStub(channel)
                response = await stub.Score(build_request(EXAMPLE_MEMBER, candidates, top_k=5), timeout=60)
            print("\nSample request: rank 10 jobs for the example member, top 5:")  # noqa: T201
            print(format_ranking(response, candidates))  # noqa: T201
            print(f"\nTry: slimserve score --target {target}")  # noqa: T201
        if options.sample and reasoning is not None:
            await _sample_explanation(f"{options.host}:{reasoning.port}")
        if not options.exit_after_sample:
            print("Serving; Ctrl-C to stop.")  # noqa: T201
            await stop.wait()
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await asyncio.gather(server.stop(), *([reasoning.stop()] if reasoning else []))


def run_up(options: UpOptions) -> int:
    """Export if needed, start Triton (unless external), run the services until stopped."""
    from .serving.server import configure_logging

    configure_logging("INFO")
    bundle_dir = ensure_exported(options)
    generator_dir = published_generator(options)
    if generator_dir is None and options.export_generator and not options.recipe and not options.triton_url:
        generator_dir = _export_teacher_generator(options)
    models = (options.model_name,) + ((options.generator_name,) if generator_dir else ())
    triton = None if options.triton_url else _start_triton(options, models)
    try:
        triton_url = options.triton_url or triton.grpc_url
        return asyncio.run(_serve(options, triton_url, bundle_dir, generator_dir))
    finally:
        if triton is not None:
            with contextlib.suppress(Exception):
                triton.stop()
