"""``slimserve bench triton``: perf_analyzer over concurrency and request-rate ranges, per model and bucket.

Each model of the repository that takes token tensors is driven with real prompts of the workload:
scorers (``input_ids`` and ``attention_mask``) with the scoring prompts, one ``--input-data`` file per
length bucket; generators (``input_ids`` and ``max_tokens``, decoupled) with the explanation prompts of
the same requests in the generator's chat format, unpadded, through ``--streaming``. Models with other
required inputs are skipped with the reason logged.
Triton is started on the repository unless ``triton_url`` names a running one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..export.repository import CONFIG_FILE
from ..export.triton_config import parse_config_pbtxt
from .perf_analyzer import (
    MULTI_ITEM_INPUTS,
    PerfPoint,
    PerfSettings,
    PerfTls,
    find_perf_analyzer,
    measure_point,
    multi_item_input_data_json,
    parse_perf_csv,
    perf_command,
    write_input_data,
    write_json,
)
from .workload import Workload

log = logging.getLogger(__name__)
SCORER_INPUTS = ("input_ids", "attention_mask")
GENERATOR_INPUTS = ("input_ids", "max_tokens")


@dataclass(frozen=True)
class BenchModel:
    """A model of the repository that perf_analyzer can drive with token data."""

    name: str
    inputs: tuple[str, ...]
    streaming: bool
    generator: bool = False
    multi_item: bool = False


def bench_models(repository: Path, names: tuple[str, ...] = ()) -> list[BenchModel]:
    """Models of ``repository`` (or only ``names``) that take token tensors; others are logged and skipped."""
    found = []
    for config_path in sorted(Path(repository).glob(f"*/{CONFIG_FILE}")):
        name = config_path.parent.name
        if names and name not in names:
            continue
        config = parse_config_pbtxt(config_path.read_text())
        required = {t.name for t in config.input if not t.optional}
        decoupled = config.model_transaction_policy.decoupled
        if required and required <= set(SCORER_INPUTS):
            inputs = tuple(t.name for t in config.input if t.name in SCORER_INPUTS)
            found.append(BenchModel(name, inputs, decoupled))
        elif required == set(MULTI_ITEM_INPUTS):
            inputs = tuple(t.name for t in config.input if t.name in MULTI_ITEM_INPUTS)
            found.append(BenchModel(name, inputs, decoupled, multi_item=True))
        elif required == set(GENERATOR_INPUTS):
            found.append(BenchModel(name, GENERATOR_INPUTS, decoupled, generator=True))
        else:
            log.warning(
                "perf_analyzer: skipping model %r: no real data for its inputs %s", name, sorted(required)
            )
    missing = sorted(set(names) - {m.name for m in found})
    if missing:
        raise ValueError(f"--models: {missing} are not token-input models in {repository}")
    return found


@contextlib.contextmanager
def triton_endpoint(repository: Path, triton_url: str | None, models: list[str]) -> Iterator[str]:
    """``triton_url`` as is, or a Triton started on ``repository`` for the duration (stopped after)."""
    if triton_url:
        yield triton_url
        return
    from ..serving.triton.launcher import TritonServer, TritonServerConfig

    config = TritonServerConfig(
        model_repository=Path(repository).resolve(),
        model_control_mode="explicit",
        load_models=tuple(models),
        startup_timeout_s=600,
    )
    with TritonServer(config) as server:
        yield server.grpc_url


def run_triton_bench(
    repository: Path,
    workload: Workload,
    *,
    triton_url: str | None = None,
    models: tuple[str, ...] = (),
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16),
    request_rates: tuple[float, ...] = (),
    buckets: tuple[int, ...] = (),
    settings: PerfSettings | None = None,
    max_tokens: int = 32,
    tls: PerfTls | None = None,
) -> list[PerfPoint]:
    """perf_analyzer points for every model x bucket x (concurrency | request rate).

    Generators have no buckets (their points carry bucket 0) and generate ``max_tokens`` per request.
    """
    settings = settings or PerfSettings()
    binary = find_perf_analyzer()
    targets = bench_models(repository, models)
    if not targets:
        raise ValueError(f"no model in {repository} takes token inputs")
    by_bucket = workload.by_bucket()
    chosen = [b for b in by_bucket if not buckets or b in buckets]
    if not chosen and any(not m.generator for m in targets):
        raise ValueError(f"--buckets {buckets}: the workload has prompts only in buckets {sorted(by_bucket)}")
    loads = [("concurrency", float(c)) for c in concurrencies] + [("request_rate", r) for r in request_rates]
    points: list[PerfPoint] = []
    with (
        triton_endpoint(repository, triton_url, [m.name for m in targets]) as url,
        tempfile.TemporaryDirectory(prefix="slimserve-perf-") as tmp,
    ):
        for model in targets:
            items_per_inference = 1.0
            if model.generator:
                path = Path(tmp) / f"{model.name}.json"
                inputs = [(0, generator_input_data(path, repository, model.name, workload, max_tokens))]
            elif model.multi_item:
                requests = multi_item_workload_requests(repository, model.name, workload)
                data = multi_item_input_data_json(requests, model.inputs)
                inputs = [(len(workload.calls[0].items), write_json(Path(tmp) / f"{model.name}.json", data))]
                items_per_inference = sum(len(r.indices) for r in requests) / len(requests)
            else:
                inputs = [
                    (
                        bucket,
                        write_input_data(
                            Path(tmp) / f"{model.name}-{bucket}.json", by_bucket[bucket], bucket, model.inputs
                        ),
                    )
                    for bucket in chosen
                ]
            for bucket, data in inputs:
                for mode, load in loads:
                    csv_path = Path(tmp) / f"{model.name}-{bucket}-{mode}-{load:g}.csv"

                    command = functools.partial(
                        perf_command,
                        binary,
                        model.name,
                        url,
                        data,
                        csv_path,
                        mode,
                        load,
                        streaming=model.streaming,
                        tls=tls,
                    )
                    log.info("perf_analyzer: %s bucket %d %s %g", model.name, bucket, mode, load)
                    text = measure_point(command, csv_path, settings)
                    points += parse_perf_csv(
                        text, model.name, bucket, settings.batch_size, items_per_inference
                    )
    return points


def multi_item_workload_requests(repository: Path, model: str, workload: Workload) -> list:
    """The multi-item requests the service would send for the workload's calls (the model's bundle:
    its item buckets and most items per request)."""
    from ..bundle import bundle_dir_for, load_bundle
    from ..scoring_tokens import multi_item_requests

    bundle = load_bundle(bundle_dir_for(repository, model))
    if not workload.tokens or not workload.tokens[0].prefix:
        raise ValueError(f"{model}: a multi-item scorer needs a workload tokenized with a member prefix")
    return [
        request
        for tokens in workload.tokens
        for request in multi_item_requests(tokens, bundle.item_length_buckets, bundle.max_items_per_request)
    ]


def generator_input_data(
    path: Path, repository: Path, model: str, workload: Workload, max_tokens: int
) -> Path:
    """``--input-data`` for a generator: each request's explanation prompt (chat format, the service's
    tokenization), unpadded, with ``max_tokens``."""
    from tokenizers import Tokenizer

    from ..bundle import TOKENIZER_FILE
    from ..generator_bundle import generator_bundle_dir, load_generator_bundle
    from ..prompts import render_chat_prompt, render_explain_request

    directory = generator_bundle_dir(repository, model)
    bundle = load_generator_bundle(directory)
    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    entries = []
    for call in workload.calls:
        text = render_chat_prompt(render_explain_request(call.member, call.items[0]))
        ids = tokenizer.encode(text, add_special_tokens=False).ids[-(bundle.max_context - max_tokens) :]
        entries.append(
            {
                "input_ids": {"content": ids, "shape": [len(ids)]},
                "max_tokens": {"content": [max_tokens], "shape": [1]},
            }
        )
    path.write_text(json.dumps({"data": entries}))
    return path


def format_perf_table(points: list[PerfPoint]) -> str:
    """Markdown table of perf_analyzer points."""
    lines = [
        "| model | bucket | mode | load | items/s | p50 ms | p95 ms | p99 ms | queue ms | compute ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.model} | {p.bucket} | {p.mode} | {p.load:g} | {p.items_per_s:.1f} | {p.p50_ms:.1f} | "
            f"{p.p95_ms:.1f} | {p.p99_ms:.1f} | {p.server_queue_ms:.2f} | {p.server_compute_ms:.1f} |"
        )
    return "\n".join(lines)
