"""In-process speed of an ONNX scorer graph: batch throughput and single-item latency on CPU.

A benchmark helper for the build report, not a test oracle. The session is configured as the Triton
python model configures it (``slimserve.triton_models.onnx_scorer``): intra-op threads = cores, one
inter-op thread, all graph optimizations, sequential execution, no spinning. Inputs are padded to
their length bucket as the service pads them. Each phase warms up once per shape, then runs until a
time budget or a run count is reached, whichever comes first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..models.batching import padded_batches

MAX_RUNS = 10_000


@dataclass(frozen=True)
class SpeedResult:
    """Throughput at ``batch_size`` (32 by default) and single-item latency percentiles."""

    items_per_s_batch32: float
    single_item_latency_ms_p50: float
    single_item_latency_ms_p99: float
    threads: int
    batch_size: int = 32
    batch_runs: int = 0
    single_runs: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def scorer_session(onnx_path: Path, threads: int | None = None):
    """An ONNX Runtime CPU session with the Triton model's options; returns (session, threads)."""
    import onnxruntime as ort

    threads = threads or os.cpu_count() or 1
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
    return session, threads


def _timed_runs(
    session, feeds: list[dict], seconds: float, max_runs: int, items=lambda f: len(f["input_ids"])
) -> list[tuple[int, float]]:
    """Warm up once per input shape, then cycle through the feeds: (items scored, seconds) per run."""
    for feed in {tuple(a.shape for a in f.values()): f for f in feeds}.values():
        session.run(None, feed)
    timings: list[tuple[int, float]] = []
    deadline = time.perf_counter() + seconds
    while len(timings) < max_runs and (not timings or time.perf_counter() < deadline):
        feed = feeds[len(timings) % len(feeds)]
        started = time.perf_counter()
        session.run(None, feed)
        timings.append((items(feed), time.perf_counter() - started))
    return timings


def _speed_result(batch_timings, single_timings, threads: int, batch_size: int) -> SpeedResult:
    items = sum(rows for rows, _ in batch_timings)
    elapsed = sum(t for _, t in batch_timings)
    latencies_ms = np.array([t for _, t in single_timings]) * 1000.0
    return SpeedResult(
        items_per_s_batch32=items / elapsed,
        single_item_latency_ms_p50=float(np.percentile(latencies_ms, 50)),
        single_item_latency_ms_p99=float(np.percentile(latencies_ms, 99)),
        threads=threads,
        batch_size=batch_size,
        batch_runs=len(batch_timings),
        single_runs=len(single_timings),
    )


def multi_item_feeds(members: Sequence, count: int, item_buckets: Sequence[int]) -> list[dict]:
    """One feed per member: its prefix and ``count`` of its items (cycled when it has fewer), padded as
    the service pads a call (``members`` have ``prefix`` and ``items`` token lists)."""
    from ..scoring_tokens import ScoringTokens, multi_item_requests

    feeds = []
    for member in members:
        items = [member.items[i % len(member.items)] for i in range(count)]
        (request,) = multi_item_requests(ScoringTokens(member.prefix, items), item_buckets, count)
        feeds.append(request.feed())
    return feeds


def measure_multi_item_speed(
    onnx_path: Path,
    members: Sequence,
    item_buckets: Sequence[int],
    *,
    batch_size: int = 32,
    threads: int | None = None,
    seconds: float = 10.0,
    max_runs: int = MAX_RUNS,
) -> SpeedResult:
    """The multi-item graph's items/s with ``batch_size`` candidates per call (one member) and its
    one-candidate latency, each phase taking ~``seconds``/2."""
    if not members:
        raise ValueError("measure_multi_item_speed needs at least one member")
    session, threads = scorer_session(onnx_path, threads)

    def items(feed):
        return feed["item_ids"].shape[1]

    batch = _timed_runs(
        session, multi_item_feeds(members, batch_size, item_buckets), seconds / 2, max_runs, items
    )
    single = _timed_runs(session, multi_item_feeds(members, 1, item_buckets), seconds / 2, max_runs, items)
    return _speed_result(batch, single, threads, batch_size)


def measure_onnx_speed(
    onnx_path: Path,
    sequences: list[list[int]],
    buckets: Sequence[int],
    *,
    batch_size: int = 32,
    threads: int | None = None,
    seconds: float = 10.0,
    max_runs: int = MAX_RUNS,
    pad_token_id: int = 0,
) -> SpeedResult:
    """Items/s on ``batch_size`` batches and single-item latency, each phase taking ~``seconds``/2."""
    if not sequences:
        raise ValueError("measure_onnx_speed needs at least one sequence")
    if seconds <= 0 or max_runs < 1 or batch_size < 1:
        raise ValueError("seconds, max_runs and batch_size must be positive")
    session, threads = scorer_session(onnx_path, threads)
    names = {i.name for i in session.get_inputs()}

    def feeds(size: int) -> list[dict]:
        return [
            {k: v for k, v in (("input_ids", ids), ("attention_mask", mask)) if k in names}
            for _, ids, mask in padded_batches(sequences, buckets, size, pad_token_id)
        ]

    # Full batches only where the prompts allow: a short last chunk per bucket would understate throughput.
    batches = feeds(batch_size)
    full = [f for f in batches if len(f["input_ids"]) == batch_size] or batches
    batch_timings = _timed_runs(session, full, seconds / 2, max_runs)
    single_timings = _timed_runs(session, feeds(1), seconds / 2, max_runs)
    return _speed_result(batch_timings, single_timings, threads, batch_size)
