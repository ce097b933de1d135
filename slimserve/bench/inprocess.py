"""In-process engines, the baselines of ``slimserve bench compare``: no server, no network, ideal batches.

- ONNX Runtime called directly on full batches of one length bucket (``measure_onnx_speed``): the floor
  no server running the same graph can beat;
- PyTorch/transformers in process on the same padded batches: what a data scientist would run instead.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..models.batching import padded_batches
from .workload import Workload

ORT_FLOOR = "onnxruntime in process"
PYTORCH = "pytorch in process"


@dataclass(frozen=True)
class EngineResult:
    """Items/s of an in-process engine at ``batch_size`` (for the floor: the best batch size it tried), and
    its single-item latency when measured."""

    variant: str
    engine: str
    items_per_s: float
    batch_size: int
    threads: int
    single_item_ms_p50: float | None = None
    single_item_ms_p99: float | None = None
    by_batch: dict[str, float] | None = None  # items/s per batch size tried (the floor keeps the best)

    def as_dict(self) -> dict:
        return asdict(self)


def onnx_floor(
    variant: str, onnx: Path, workload: Workload, seconds: float, batch_sizes: tuple[int, ...] = (8, 32)
) -> EngineResult:
    """ONNX Runtime on full batches of the workload's prompts (the Triton model's session options), at the
    best batch size: each of ``batch_sizes`` and 1 (from the single-item latency). On a CPU a bigger batch is
    not always faster per item, so the floor is the best of them, not the biggest."""
    from ..evaluation.throughput import measure_onnx_speed

    share = seconds / len(batch_sizes)
    speeds = [
        measure_onnx_speed(onnx, workload.sequences, workload.buckets, batch_size=size, seconds=share)
        for size in batch_sizes
    ]
    by_batch = {1: 1000.0 / min(s.single_item_latency_ms_p50 for s in speeds)}
    by_batch |= {s.batch_size: s.items_per_s_batch32 for s in speeds}
    best = max(by_batch, key=by_batch.get)
    single = min(speeds, key=lambda s: s.single_item_latency_ms_p50)
    return EngineResult(
        variant,
        ORT_FLOOR,
        by_batch[best],
        best,
        speeds[0].threads,
        single.single_item_latency_ms_p50,
        single.single_item_latency_ms_p99,
        {str(k): v for k, v in sorted(by_batch.items())},
    )


def load_torch_scorer(source: str, yes_token_id: int, no_token_id: int):
    """The scoring graph (PyTorch) of ``source``: 'tiny'/'default' teachers or a saved causal-LM directory."""
    from ..models.scorer_graph import ScorerGraph

    if source in ("tiny", "default"):
        from ..models.teacher import load_teacher

        model = load_teacher(source).model
    else:
        from ..buildstage.artifacts import load_causal_lm

        model = load_causal_lm(Path(source))
    return ScorerGraph(model, yes_token_id, no_token_id).eval()


def torch_speed(
    variant: str, graph, workload: Workload, seconds: float, batch_size: int = 32
) -> EngineResult:
    """Items/s of the PyTorch scoring graph on the same padded batches, after one warmup per shape."""
    import torch

    batches = [
        (torch.from_numpy(ids), torch.from_numpy(mask))
        for _, ids, mask in padded_batches(workload.sequences, workload.buckets, batch_size)
    ]
    full = [b for b in batches if len(b[0]) == batch_size] or batches
    with torch.inference_mode():
        for ids, mask in {tuple(b[0].shape): b for b in full}.values():
            graph(ids, mask)
        items, elapsed, runs = 0, 0.0, 0
        while runs == 0 or elapsed < seconds:
            ids, mask = full[runs % len(full)]
            started = time.perf_counter()
            graph(ids, mask)
            elapsed += time.perf_counter() - started
            items += len(ids)
            runs += 1
    return EngineResult(variant, PYTORCH, items / elapsed, batch_size, torch.get_num_threads())
