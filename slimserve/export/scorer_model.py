"""The CPU scorer's Triton model: its config spec and the files that make one version.

The model itself is ``slimserve/triton_models/onnx_scorer.py`` (python backend running ONNX Runtime),
published as ``<version>/model.py`` next to ``<version>/model.onnx``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from slimserve.bundle import TensorNames
from slimserve.export.triton_config import (
    DynamicBatchingSpec,
    InstanceGroupSpec,
    TensorSpec,
    TritonModelSpec,
    WarmupSpec,
    batcher_prefetches,
)
from slimserve.onnx_files import external_data_locations

log = logging.getLogger(__name__)

MODEL_PY = "model.py"
MODEL_ONNX = "model.onnx"


def scorer_batching(
    max_queue_delay_us: int, max_queue_size: int, default_timeout_us: int
) -> DynamicBatchingSpec:
    """The scorers' dynamic batcher. Keep ``max_queue_size`` and ``default_timeout_us`` at 0: any queue
    policy turns off Triton 2.51's payload prefetching, and a request that arrives while the instance is
    busy then waits for the batcher's 500 ms idle timeout (docs/bench.md "Tail latency"). Deadlines still
    hold without one (the gRPC deadline cancels the request in Triton's queue) and the service bounds the
    work in flight itself (admission)."""
    spec = DynamicBatchingSpec(
        max_queue_delay_us=max_queue_delay_us,
        max_queue_size=max_queue_size,
        default_timeout_us=default_timeout_us,
    )
    if not batcher_prefetches(spec):
        log.warning(
            "scorer queue policy (max_queue_size %d, default_timeout_us %d) turns off Triton's batcher "
            "prefetching: expect 500 ms stalls under load (docs/bench.md, Tail latency)",
            max_queue_size,
            default_timeout_us,
        )
    return spec


def scorer_model_source() -> Path:
    """Path of the python-backend model file (``onnx_scorer.py``)."""
    from slimserve.triton_models import onnx_scorer

    return Path(onnx_scorer.__file__)


def _python_scorer_spec(
    name, max_batch_size, inputs, score_dims, warmups, batching, instances, threads, parameters
):
    """The parts both CPU scorers share: python backend, ``score`` + ``compute_ms`` outputs, the
    scorers' batcher, CPU instances and the ORT thread parameter."""
    names = TensorNames()
    params = dict(parameters or {})
    if threads is not None:
        params["intra_op_threads"] = str(threads)
    return TritonModelSpec(
        name=name,
        backend="python",
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=(
            TensorSpec(names.score, "TYPE_FP32", score_dims),
            TensorSpec(names.compute_ms, "TYPE_FP32", (1,)),
        ),
        dynamic_batching=scorer_batching(*batching),
        instance_groups=(InstanceGroupSpec(count=instances, kind="KIND_CPU"),),
        warmups=warmups,
        parameters=params,
    )


def scorer_triton_spec(
    name: str,
    max_batch_size: int,
    length_buckets: tuple[int, ...],
    max_queue_delay_us: int = 2000,
    max_queue_size: int = 0,
    default_timeout_us: int = 0,
    instance_count: int = 1,
    intra_op_threads: int | None = None,
    parameters: Mapping[str, str] | None = None,
    warmup_batch_size: int = 8,
) -> TritonModelSpec:
    """Spec of the CPU scorer: token ids in, ``score`` and ``compute_ms`` out, dynamically batched.

    One zero-data warmup per length bucket at batch 1, plus one batch of ``warmup_batch_size`` at the
    smallest bucket (the graph must accept an all-zero attention mask). Warmup at the full batch and the
    largest bucket would cost a minute per load for a 135M model on two cores. ``intra_op_threads``
    None lets the model share the CPUs among its instances.
    """
    if max_batch_size < 1:
        raise ValueError(
            f"max_batch_size must be >= 1 for a dynamically batched scorer, got {max_batch_size}"
        )
    if not length_buckets or any(b < 1 for b in length_buckets):
        raise ValueError(f"length_buckets must be positive sequence lengths, got {length_buckets}")
    names = TensorNames()
    shapes = [(length, 1) for length in sorted(set(length_buckets))]
    shapes.append((min(length_buckets), min(warmup_batch_size, max_batch_size)))
    warmups = tuple(
        WarmupSpec(
            name=f"len{length}_batch{batch}",
            batch_size=batch,
            inputs={
                names.input_ids: ("TYPE_INT64", (length,), "zero"),
                names.attention_mask: ("TYPE_INT64", (length,), "zero"),
            },
        )
        for length, batch in dict.fromkeys(shapes)
    )
    inputs = (
        TensorSpec(names.input_ids, "TYPE_INT64", (-1,)),
        TensorSpec(names.attention_mask, "TYPE_INT64", (-1,)),
    )
    batching = (max_queue_delay_us, max_queue_size, default_timeout_us)
    return _python_scorer_spec(
        name, max_batch_size, inputs, (1,), warmups, batching, instance_count, intra_op_threads, parameters
    )


def multi_item_scorer_triton_spec(
    name: str,
    max_members: int,
    item_length_buckets: tuple[int, ...],
    max_queue_delay_us: int = 2000,
    max_queue_size: int = 0,
    default_timeout_us: int = 0,
    instance_count: int = 1,
    intra_op_threads: int | None = None,
    parameters: Mapping[str, str] | None = None,
    warmup_prefix: int = 96,
    warmup_items: int = 8,
) -> TritonModelSpec:
    """Spec of the CPU multi-item scorer: per request one member's ``prefix_ids``/``prefix_mask`` [P]
    and its candidates' ``item_ids``/``item_mask`` [N, L] in, ``score`` [N] and ``compute_ms`` out.

    Every input allows ragged batches, so the dynamic batcher hands requests of different members
    (different P, N, L) to one ``execute``, which stacks those of one item length into one ONNX Runtime
    run. One zero-data warmup per item-length bucket (the graph accepts all-zero masks).
    """
    if max_members < 1:
        raise ValueError(f"max_members must be >= 1, got {max_members}")
    if not item_length_buckets or any(b < 1 for b in item_length_buckets):
        raise ValueError(f"item_length_buckets must be positive lengths, got {item_length_buckets}")
    names = TensorNames()
    warmups = tuple(
        WarmupSpec(
            name=f"prefix{warmup_prefix}_items{warmup_items}_len{length}",
            batch_size=1,
            inputs={
                names.prefix_ids: ("TYPE_INT64", (warmup_prefix,), "zero"),
                names.prefix_mask: ("TYPE_INT64", (warmup_prefix,), "zero"),
                names.item_ids: ("TYPE_INT64", (warmup_items, length), "zero"),
                names.item_mask: ("TYPE_INT64", (warmup_items, length), "zero"),
            },
        )
        for length in sorted(set(item_length_buckets))
    )
    inputs = (
        TensorSpec(names.prefix_ids, "TYPE_INT64", (-1,), allow_ragged_batch=True),
        TensorSpec(names.prefix_mask, "TYPE_INT64", (-1,), allow_ragged_batch=True),
        TensorSpec(names.item_ids, "TYPE_INT64", (-1, -1), allow_ragged_batch=True),
        TensorSpec(names.item_mask, "TYPE_INT64", (-1, -1), allow_ragged_batch=True),
    )
    batching = (max_queue_delay_us, max_queue_size, default_timeout_us)
    return _python_scorer_spec(
        name, max_members, inputs, (-1,), warmups, batching, instance_count, intra_op_threads, parameters
    )


def scorer_model_files(onnx_path: Path) -> dict[str, Path]:
    """Files of one scorer version: ``model.py``, ``model.onnx`` and the graph's external data files."""
    onnx_path = Path(onnx_path)
    files = {MODEL_PY: scorer_model_source(), MODEL_ONNX: onnx_path}
    for location in external_data_locations(onnx_path):
        parts = PurePosixPath(location).parts
        if PurePosixPath(location).is_absolute() or ".." in parts:
            raise ValueError(f"{onnx_path}: external data location {location!r} escapes the model directory")
        files[location] = onnx_path.parent / location
    return files
