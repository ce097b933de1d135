"""``slimserve up``: build the default recipe if needed, start Triton and the services, demo, serve.

The one command of the README's quick start. By default it builds the ``cpu`` recipe (``--recipe``
another): teacher fine-tune, distill, prune, re-distill, INT8 for the scorer, the generator's stages,
each with a progress bar and a closing line, then a table teacher vs students. The scorer is published
and served as soon as its gates passed, while the generator stages still run; the generator is loaded
into Triton (explicit model control) and the reasoning service started when it is published. A rerun
finds the models this recipe published (still the repository's latest) and serves them at once; an
interrupted build resumes. ``--teacher-only`` serves what the repository holds, exporting the teacher
zero-shot when it holds nothing (the quick look at serving).

Triton runs as a child process (or is reached at ``--triton-url``); the services run in this process.
Ctrl-C or SIGTERM drains the services, then stops Triton, leaving no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from .bundle import BundleError, bundle_dir_for, load_bundle
from .errors import BuildError, StageError, UserError

if TYPE_CHECKING:
    from .up_config import UpConfig

log = logging.getLogger(__name__)


def ensure_exported(options: UpConfig) -> Path:
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


def up_recipe(options: UpConfig):
    """``options.recipe`` publishing into ``options.model_repository`` (and its work directory)."""
    from .buildstage.recipe import load_recipe

    recipe = load_recipe(options.recipe)
    publish = recipe.publish.model_copy(
        update={"model_repository": options.model_repository, "model_name": options.model_name}
    )
    updates = {"publish": publish}
    if options.work_dir is not None:
        updates["work_dir"] = options.work_dir
    return recipe.model_copy(update=updates)


def _cell(value, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def _size(row: dict) -> str:
    parameters, embedding = row.get("parameters") or 0, row.get("embedding_parameters") or 0
    if not parameters:
        return "-"
    size = f"{parameters / 1e6:.1f}M ({(parameters - embedding) / 1e6:.1f}M)"
    return size + (f", {row['file_mb']:.1f} MB" if _cell(row.get("file_mb")) != "-" else "")


def summary_table(report: dict) -> str:
    """Teacher vs students (quality, size, speed) from a build's ``report.json``."""
    lines = [
        "| model | quality (test split) | params (non-emb), file | speed |",
        "|---|---|---|---|",
    ]
    stages = {row["stage"]: row for row in report.get("stages", [])}
    scorer = [stages.get("teacher fine-tuned"), report["stages"][-1] if report.get("stages") else None]
    for label, row in zip(("teacher (scoring, FP32)", "scoring student (published)"), scorer, strict=True):
        if row is None:
            continue
        speed = "-"
        if _cell(row.get("items_per_s_batch32")) != "-":
            speed = f"{row['items_per_s_batch32']:.1f} items/s @32, 1 item {_cell(row.get('single_item_ms'), 1)} ms"
        auc = f"AUC {_cell(row['test_auc'])}"
        lines.append(f"| {label}: {row['stage']} | {auc} | {_size(row)} | {speed} |")
    lines += _generator_lines(report.get("generator_stages") or [])
    return "\n".join(lines)


def _grounding(row: dict) -> str:
    text = (
        f"hallucination {_cell(row.get('hallucination_rate'), 2)}, coverage {_cell(row.get('coverage'), 2)}"
    )
    if row.get("repetition_rate") is not None:  # reports from before the measure lack it
        text += f", sentence repeated {_cell(row['repetition_rate'], 2)}"
    return text


def _full_matches(row: dict) -> str:
    pairs = row.get("full_match_pairs")
    return (
        f"; on {pairs} full matches: hallucination {_cell(row.get('full_match_hallucination_rate'), 2)}"
        if pairs
        else ""
    )


def _generator_lines(generator: list[dict]) -> list[str]:
    """The generator teacher and student rows; the student's with its published graph's grounding as
    served, when the report has that row."""
    from .evaluation.generator_report import is_served

    trained = [row for row in generator if not is_served(row["stage"])]
    if not trained:
        return []
    served = [row for row in generator if is_served(row["stage"])]
    teacher = next((r for r in trained if r["stage"] == "generator teacher (fine-tuned)"), trained[0])
    lines = []
    for label, row in (("generator teacher", teacher), ("generator student (published)", trained[-1])):
        quality = f"KL to teacher {_cell(row.get('kl_teacher_text'))}, {_grounding(row)}"
        if row is trained[-1] and served:
            quality += f" (its graph as served: {_grounding(served[-1])}{_full_matches(served[-1])})"
        speed = f"{_cell(row.get('decode_tokens_per_s'), 1)} tokens/s (PyTorch, 1 stream)"
        lines.append(f"| {label}: {row['stage']} | {quality} | {_size(row)} | {speed} |")
    return lines


def _print_summary(recipe) -> None:
    import json

    path = recipe.resolved_work_dir() / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    print(f"\nTeacher vs students (recipe {recipe.name}; the stage tables: {path.parent / 'report.md'}):")  # noqa: T201
    print(summary_table(report))  # noqa: T201


def published_generator(options: UpConfig) -> Path | None:
    """The bundle directory of the latest published generator, or None when the repository has none."""
    from .generator_bundle import generator_bundle_dir, load_generator_bundle

    try:
        directory = generator_bundle_dir(options.model_repository, options.generator_name)
        bundle = load_generator_bundle(directory)
    except BundleError as exc:
        if (options.model_repository / options.generator_name).exists():
            log.warning("not serving %r: %s", options.generator_name, exc)
        return None
    log.info(
        "using published %s version %d (%s)", bundle.model_name, bundle.model_version, bundle.source_model
    )
    return directory


def _export_teacher_generator(options: UpConfig) -> Path:
    """Publish the teacher itself (full precision) as the generator, so that ``up`` explains without a build."""
    from .export.generator_config import GeneratorExportConfig
    from .export.generator_repository import publish_generator
    from .generator_bundle import generator_bundle_dir
    from .models.teacher import load_teacher

    log.info(
        "no published %r in %s: exporting teacher %r as the generator",
        options.generator_name,
        options.model_repository,
        options.teacher,
    )
    loaded = load_teacher(options.teacher)
    config = GeneratorExportConfig(
        model_repository=options.model_repository,
        model_name=options.generator_name,
        quantize=None,
        source_model=loaded.name,
    )
    publish_generator(loaded.model, loaded.tokenizer_file, config)
    return generator_bundle_dir(options.model_repository, options.generator_name)


def _start_triton(options: UpConfig, models: tuple[str, ...], repository: Path | None = None):
    from .serving.triton.launcher import TritonServer

    server = TritonServer(options.triton_config(models, repository))
    started = time.perf_counter()
    server.start()
    log.info(
        "Triton ready in %.1f s: gRPC %s (log %s)",
        time.perf_counter() - started,
        server.grpc_url,
        server.log_path,
    )
    return server


async def _start_reasoning(options: UpConfig, triton_url: str, generator_dir: Path):
    """Start the reasoning service on the generator and wait until it serves."""
    from .serving.reasoning.server import ReasoningServer

    server = ReasoningServer(options.reasoning_config(triton_url, generator_dir))
    port = await server.start_ready(options.startup_timeout_s)
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
    text = ""
    async with grpc.aio.insecure_channel(target) as channel:
        async for chunk in reasoning_pb2_grpc.ReasoningServiceStub(channel).Explain(request, timeout=120):
            print(chunk.text, end="", flush=True)  # noqa: T201
            text += chunk.text
            if chunk.HasField("metadata"):
                print(f"\n\n{format_metadata(chunk.metadata)}")  # noqa: T201
    print(f"\n{_grounding_line(EXAMPLE_MEMBER, item, text)}")  # noqa: T201
    print(f"\nTry: slimserve explain --target {target}")  # noqa: T201


def _grounding_line(member, item, text: str) -> str:
    """The build's grounding check on one explanation, in a line."""
    from .evaluation.grounding import check_explanation

    problems = check_explanation(member, item, text).problems()
    said = "; ".join(problems) if problems else "every stated fact and the verdict match the pair"
    return f"Grounding check (the build's evaluation): {said}."


async def _start_scoring(options: UpConfig, triton_url: str, bundle_dir: Path):
    """Start the scoring service on the published scorer and wait until it serves; returns the server."""
    from .serving.scoring.server import ScoringServer

    server = ScoringServer(options.scoring_config(triton_url, bundle_dir))
    port = await server.start_ready(options.startup_timeout_s)
    target = f"{options.host}:{port}"
    to_triton = server.core.client.security.transport
    print(  # noqa: T201
        f"\nScoringService on {target} (metrics :{server.metrics_port}), Triton at {triton_url} over {to_triton}"
    )
    print("plaintext, no token: for this machine only (TLS, mTLS, tokens: docs/security.md)")  # noqa: T201
    return server


async def _sample_ranking(target: str) -> None:
    from .client import build_request, format_ranking
    from .examples import EXAMPLE_MEMBER, example_candidates
    from .v1 import scoring_pb2_grpc

    candidates = example_candidates(10)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        response = await stub.Score(build_request(EXAMPLE_MEMBER, candidates, top_k=5), timeout=60)
    print("\nSample request: rank 10 jobs for the example member, top 5:")  # noqa: T201
    print(format_ranking(response, candidates))  # noqa: T201
    print(f"\nTry: slimserve score --target {target}")  # noqa: T201


async def _serve_reasoning(options: UpConfig, triton_url: str, generator_dir: Path):
    reasoning = await _start_reasoning(options, triton_url, generator_dir)
    if options.sample:
        try:
            await _sample_explanation(f"{options.host}:{reasoning.port}")
        except BaseException:
            await reasoning.stop(grace=0)
            raise
    return reasoning


async def _until_stopped(options: UpConfig, stop: asyncio.Event) -> int:
    if not options.exit_after_sample:
        print("Serving; Ctrl-C to stop.")  # noqa: T201
        await stop.wait()
    return 0


async def _serve(options: UpConfig, triton_url: str, bundle_dir: Path, generator_dir: Path | None) -> int:
    """Serve what is published: scoring (and reasoning when there is a generator), samples, then wait."""
    servers = []
    from .serving.server import stop_on_signals

    with stop_on_signals() as stop:
        try:
            servers.append(await _start_scoring(options, triton_url, bundle_dir))
            if options.sample:
                await _sample_ranking(f"{options.host}:{servers[0].port}")
            if generator_dir is not None:
                servers.append(await _serve_reasoning(options, triton_url, generator_dir))
            return await _until_stopped(options, stop)
        finally:
            await asyncio.gather(*(server.stop() for server in servers))


@dataclass
class _Build:
    """The build running in a thread: the scorer's publication, the generator's and the end, posted to
    the event loop."""

    loop: asyncio.AbstractEventLoop
    scorer: asyncio.Future
    generator: asyncio.Future
    done: asyncio.Future
    thread: threading.Thread | None = None
    # Set once the ScoringService answers (or failed to start): the build waits for it after publishing
    # the scorer, so that Triton's start and the sample request do not share the cores with the
    # generator stages (on 2 cores Triton took 157 s to load the scorer beside them, 14 s alone).
    scoring_started: threading.Event = field(default_factory=threading.Event)

    def post(self, future: asyncio.Future, value=None, error: BaseException | None = None) -> None:
        def settle():
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed: slimserve up is exiting (Ctrl-C, SIGTERM), nobody waits
            if not self.loop.is_closed():
                raise


SCORING_START_WAIT_S = 600.0  # the longest the build waits for the ScoringService before going on


def _start_build(recipe, loop) -> _Build:
    from .buildstage.runner import run_build

    build = _Build(loop, loop.create_future(), loop.create_future(), loop.create_future())
    milestones = (build.scorer, build.generator, build.done)
    for future in milestones:  # the build's error is raised from the first one awaited; the others
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # hold the same error

    def scorer_published(result) -> None:
        build.post(build.scorer, result)
        build.scoring_started.wait(timeout=SCORING_START_WAIT_S)

    def work():
        try:
            result = run_build(
                recipe,
                command=f"slimserve build --recipe {recipe.name}",
                on_scorer_published=scorer_published,
                on_generator_published=lambda result: build.post(build.generator, result),
            )
        except BaseException as exc:  # handed to the event loop, raised there
            for future in milestones:
                build.post(future, error=exc)
        else:
            for future in milestones:
                build.post(future, result)

    # A daemon thread: Ctrl-C stops the services and Triton, then the process exits without waiting
    # for the stage in progress (stages resume from their outputs and checkpoints).
    build.thread = threading.Thread(target=work, name="slimserve-build", daemon=True)
    build.thread.start()
    return build


async def _first(stop: asyncio.Event, future: asyncio.Future) -> bool:
    """Wait for ``future`` or ``stop``; True when ``future`` finished first."""
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopped, future}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    return future.done()


def _load_generator(triton, name: str, timeout_s: float) -> None:
    """Load the just-published generator into the running Triton (explicit model control)."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.perf_counter()
    request = urllib.request.Request(
        f"{triton.http_url}/v2/repository/models/{name}/load", data=b"", method="POST"
    )
    with opener.open(request, timeout=timeout_s) as response:
        if response.status != 200:
            raise StageError(f"Triton did not load {name!r}: HTTP {response.status}")
    log.info("Triton loaded %r in %.1f s", name, time.perf_counter() - started)


async def _serve_scorer(options: UpConfig, recipe, result, state: dict, servers: list) -> str:
    """Print the scorer's stage table, start Triton (unless one is given) and the ScoringService on
    the published scorer, answer the sample; returns Triton's gRPC address."""
    print(f"\nBuild (recipe {recipe.name}), the scorer's stages:\n{result.table()}\n")  # noqa: T201
    bundle_dir = bundle_dir_for(options.model_repository, options.model_name, result.published.version)
    if options.triton_url is None:
        state["triton"] = await asyncio.to_thread(
            _start_triton, options, (options.model_name,), recipe.publish.model_repository
        )
    triton_url = options.triton_url or state["triton"].grpc_url
    servers.append(await _start_scoring(options, triton_url, bundle_dir))
    if options.sample:
        await _sample_ranking(f"{options.host}:{servers[0].port}")
    return triton_url


class _Interrupted(Exception):
    """Ctrl-C during the build: the services are stopped; the build thread is left to the exit."""


async def _build_and_serve(options: UpConfig, recipe, state: dict) -> int:
    """Build ``recipe`` in a thread; serve the scorer once published, then the generator; wait."""
    from .buildstage.runner import published_entry
    from .generator_bundle import generator_bundle_dir
    from .serving.server import stop_on_signals

    loop = asyncio.get_running_loop()
    servers = []
    with stop_on_signals() as stop:
        print(  # noqa: T201
            f"Building recipe {recipe.name!r} in {recipe.resolved_work_dir()} (resumes an interrupted build; "
            "each stage shows a progress bar and ends with a line: time, quality)"
        )
        build = _start_build(recipe, loop)
        state["build"] = build
        try:
            if not await _first(stop, build.scorer):
                raise _Interrupted
            try:
                result = build.scorer.result()  # raises the build's error, if it failed before
                triton_url = await _serve_scorer(options, recipe, result, state, servers)
            finally:
                build.scoring_started.set()  # the build goes on to the generator stages
            if recipe.generator is not None and not build.generator.done():
                print(  # noqa: T201
                    "\nScoringService is serving the scoring student; the generator stages run now: "
                    "ReasoningService starts when the generator is published."
                )
            if not await _first(stop, build.generator):
                raise _Interrupted
            try:
                result = build.generator.result()
            except BuildError as exc:  # a generator stage or gate: the scorer passed its own
                print(  # noqa: T201
                    f"\nThe generator was not published: {exc}\nScoringService keeps serving the "
                    "scoring student; ReasoningService does not start (the generator's gates: "
                    "docs/generator-build.md). Ctrl-C to stop."
                )
                await _until_stopped(options, stop)
                return 1
            if recipe.generator is not None:
                from .evaluation.generator_report import generator_table

                print(  # noqa: T201
                    f"\nBuild (recipe {recipe.name}), the generator's stages (the figures its gates read; "
                    "every model's grounding and speed come with the closing tables):"
                )
                print(generator_table(result.generator_rows))  # noqa: T201
                entry = published_entry(recipe, "generator")
                version = None if entry is None else entry["version"]
                generator_dir = generator_bundle_dir(
                    options.model_repository, options.generator_name, version
                )
                if "triton" in state:
                    await asyncio.to_thread(
                        _load_generator, state["triton"], options.generator_name, options.startup_timeout_s
                    )
                servers.append(await _serve_reasoning(options, triton_url, generator_dir))
            if not build.done.done():
                print(  # noqa: T201
                    "\nFor the closing tables: the magnitude-pruning baselines, the single-sequence INT8 graph, "
                    "every model's speed, every generator model's grounding (stages prune_baselines, "
                    "int8_single, speed, gen_report)."
                )
            if not await _first(stop, build.done):
                raise _Interrupted
            final = build.done.result()
            if recipe.prune.compare_magnitude:
                from .evaluation.report import markdown_table

                print(f"\nBuild (recipe {recipe.name}), the scorer's stages with the pruning baselines:")  # noqa: T201
                print(markdown_table(final.rows))  # noqa: T201
            if final.generator_rows:
                from .evaluation.generator_report import generator_table

                print(f"\nBuild (recipe {recipe.name}), the generator's stages:")  # noqa: T201
                print(generator_table(final.generator_rows))  # noqa: T201
            _print_summary(recipe)
            return await _until_stopped(options, stop)
        finally:
            await asyncio.gather(*(server.stop() for server in servers))


def _serve_published(options: UpConfig, bundle_dir: Path, generator_dir: Path | None, recipe=None) -> int:
    models = (options.model_name,) + ((options.generator_name,) if generator_dir else ())
    triton = None if options.triton_url else _start_triton(options, models)
    try:
        if recipe is not None:
            _print_summary(recipe)
        triton_url = options.triton_url or triton.grpc_url
        return asyncio.run(_serve(options, triton_url, bundle_dir, generator_dir))
    finally:
        if triton is not None:
            with contextlib.suppress(Exception):
                triton.stop()


def run_up(options: UpConfig) -> int:
    """Build the recipe unless already published (or export the teacher with ``teacher_only``), start
    Triton (unless external), run the services until stopped."""
    from .serving.server import configure_logging

    configure_logging("INFO")
    with contextlib.suppress(AttributeError, ValueError):  # printed lines interleave with the log's
        sys.stdout.reconfigure(line_buffering=True)
    if options.teacher_only:
        bundle_dir = ensure_exported(options)
        generator_dir = published_generator(options)
        if generator_dir is None and options.generator and not options.triton_url:
            generator_dir = _export_teacher_generator(options)
        return _serve_published(options, bundle_dir, generator_dir)

    from .buildstage.runner import published_build
    from .generator_bundle import generator_bundle_dir

    recipe = up_recipe(options)
    published = published_build(recipe)
    if published is not None:
        print(  # noqa: T201
            f"Recipe {recipe.name!r} built before: serving the models it published in "
            f"{options.model_repository} ("
            + ", ".join(f"{kind} version {entry['version']}" for kind, entry in published.items())
            + ")"
        )
        scorer = bundle_dir_for(options.model_repository, options.model_name, published["scorer"]["version"])
        generator = published.get("generator")
        generator_dir = (
            None
            if generator is None
            else generator_bundle_dir(options.model_repository, options.generator_name, generator["version"])
        )
        return _serve_published(options, scorer, generator_dir, recipe)

    state: dict = {}
    code = 0
    try:
        return asyncio.run(_build_and_serve(options, recipe, state))
    except _Interrupted:
        from .buildstage.stage_process import stop_all

        stop_all()  # the build thread is left to the exit: its stage's process ends now
        print(  # noqa: T201
            f"\nInterrupted: the next `slimserve up` resumes the build where it stopped "
            f"({recipe.resolved_work_dir()})",
            flush=True,
        )
        code = 130
        return code
    except BaseException as exc:
        code = 1
        if not _build_running(state):
            raise
        log.error("%s", exc, exc_info=not isinstance(exc, UserError))
        return code
    finally:
        if "triton" in state:
            with contextlib.suppress(Exception):
                state["triton"].stop()
        if _build_running(state):
            # The stage in progress is abandoned (its checkpoint and outputs stay for the resume).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _build_running(state: dict) -> bool:
    build = state.get("build")
    if build is None:
        return False
    build.thread.join(timeout=2)  # a failed build posts its error just before its thread ends
    return build.thread.is_alive()
