"""The TensorRT scorer's Triton model: a ``tensorrt_plan`` config from the shared typed generator.

One config serves every GPU type: ``cc_model_filenames`` maps each compute capability to its engine
(``"9.0": "model_sm90.plan"``) and no ``default_model_filename`` is set, so a GPU without its own engine
fails to load instead of running another architecture's plan. Warmup runs every profile at its bucket
length (batch 1, and optionally ``max_batch_size`` so memory is taken at load, not under traffic), with
token 0 and an all-ones attention mask read from ``<model>/warmup/`` (where Triton looks for warmup
files; an all-zero mask would gather the hidden state at index -1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ... import atomic
from ...bundle import TensorNames
from ..triton_config import (
    DynamicBatchingSpec,
    InstanceGroupSpec,
    ModelConfig,
    TensorSpec,
    TritonModelSpec,
    WarmupSpec,
)
from .profiles import BucketProfile, MultiItemProfile, Profile, profile_for_shapes

PLATFORM = "tensorrt_plan"
WARMUP_DIR = "warmup"
PROFILES_PARAMETER = "slimserve_tensorrt_profiles"


def warmup_mask_name(bucket: int) -> str:
    return f"attention_mask_ones_{bucket}"


def tensorrt_scorer_spec(
    name: str,
    profiles: Sequence[BucketProfile],
    cc_model_filenames: Mapping[str, str],
    max_queue_delay_us: int = 200,
    max_queue_size: int = 0,
    default_timeout_us: int = 0,
    instance_count: int = 1,
    warmup_max_batch: bool = True,
    parameters: Mapping[str, str] | None = None,
) -> TritonModelSpec:
    """Spec of the TensorRT scorer: token ids in, ``score`` out, one optimization profile per bucket."""
    if not profiles:
        raise ValueError("a TensorRT scorer needs at least one optimization profile")
    if not cc_model_filenames:
        raise ValueError("cc_model_filenames is empty: build at least one engine")
    names = TensorNames()
    max_batch = profiles[0].max_batch
    warmups = []
    for profile in profiles:
        batches = dict.fromkeys([1, max_batch] if warmup_max_batch else [1])
        for batch in batches:
            warmups.append(
                WarmupSpec(
                    name=f"profile{profile.index}_len{profile.bucket}_batch{batch}",
                    batch_size=batch,
                    inputs={
                        names.input_ids: ("TYPE_INT64", (profile.bucket,), "zero"),
                        names.attention_mask: (
                            "TYPE_INT64",
                            (profile.bucket,),
                            f"file:{warmup_mask_name(profile.bucket)}",
                        ),
                    },
                )
            )
    described = ";".join(f"{p.index}:{p.min_length}-{p.bucket}" for p in profiles)
    return TritonModelSpec(
        name=name,
        backend=None,
        platform=PLATFORM,
        max_batch_size=max_batch,
        inputs=(
            TensorSpec(names.input_ids, "TYPE_INT64", (-1,)),
            TensorSpec(names.attention_mask, "TYPE_INT64", (-1,)),
        ),
        outputs=(TensorSpec(names.score, "TYPE_FP32", (1,)),),
        dynamic_batching=DynamicBatchingSpec(
            max_queue_delay_us=max_queue_delay_us,
            max_queue_size=max_queue_size,
            default_timeout_us=default_timeout_us,
        ),
        instance_groups=(
            InstanceGroupSpec(
                count=instance_count, kind="KIND_GPU", profiles=tuple(str(p.index) for p in profiles)
            ),
        ),
        warmups=tuple(warmups),
        parameters={**(parameters or {}), PROFILES_PARAMETER: described},
        cc_model_filenames=dict(cc_model_filenames),
    )


def write_warmup_files(model_dir: Path, profiles: Sequence[BucketProfile]) -> list[Path]:
    """Write the warmup masks where Triton reads them: ``<model_dir>/warmup/`` (beside the versions).

    One sample each (raw little-endian int64; Triton repeats it for a warmup's batch size). The content
    depends only on the bucket, so rewriting them for a new version never changes what an older version
    reads; each file is written to a temp name and renamed.
    """
    directory = Path(model_dir) / WARMUP_DIR
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for profile in profiles:
        path = directory / warmup_mask_name(profile.bucket)
        atomic.write_bytes(path, np.ones(profile.bucket, dtype="<i8").tobytes())
        written.append(path)
    return written


def check_plan_config(cfg: ModelConfig, profiles: Sequence[Profile], plan_files: Sequence[str]) -> None:
    """The config agrees with the engines' profiles (single-sequence or multi-item); raise
    ``ValueError`` listing every disagreement."""
    problems = []
    if cfg.platform != PLATFORM:
        problems.append(f"platform is {cfg.platform!r}, expected {PLATFORM!r}")
    expected_batch = profiles[0].triton_max_batch
    if cfg.max_batch_size != expected_batch:
        problems.append(f"max_batch_size {cfg.max_batch_size} != profiles' max batch {expected_batch}")
    if cfg.default_model_filename:
        problems.append("default_model_filename is set: a GPU without its own engine would load another's")
    missing = sorted(set(cfg.cc_model_filenames.values()) - set(plan_files))
    if missing:
        problems.append(f"cc_model_filenames name engines that are not published: {missing}")
    for group in cfg.instance_group:
        unknown = sorted(set(group.profile) - {str(p.index) for p in profiles})
        if unknown:
            problems.append(f"instance_group uses profiles {unknown} the engine does not have")
    for warmup in cfg.model_warmup:
        batch = (warmup.batch_size,) if cfg.max_batch_size > 0 else ()
        shapes = {name: batch + tuple(entry.dims) for name, entry in warmup.inputs.items()}
        try:
            profile_for_shapes(profiles, shapes)
        except ValueError as exc:
            problems.append(f"warmup {warmup.name!r}: {exc}")
    if problems:
        raise ValueError(f"TensorRT config of model {cfg.name!r}: " + "; ".join(problems))


def tensorrt_multi_item_scorer_spec(
    name: str,
    profiles: Sequence[MultiItemProfile],
    cc_model_filenames: Mapping[str, str],
    instance_count: int = 1,
    parameters: Mapping[str, str] | None = None,
) -> TritonModelSpec:
    """Spec of the TensorRT multi-item scorer: one member per request (``prefix_ids``/``prefix_mask``
    ``[1, P]``, ``item_ids``/``item_mask`` ``[1, N, L]``) -> ``score`` ``[1, N]``, one optimization
    profile per item-length bucket.

    No Triton batching (``max_batch_size`` 0: the members axis is explicit): a TensorRT engine cannot
    stack requests of different prefix and item shapes, and one call already carries all its items.
    Warmup runs every profile once with zero data (the graph clamps an all-zero mask's last-token index
    and its attention stays finite).
    """
    if not profiles:
        raise ValueError("a TensorRT scorer needs at least one optimization profile")
    if not cc_model_filenames:
        raise ValueError("cc_model_filenames is empty: build at least one engine")
    names = TensorNames()
    warmups = tuple(
        WarmupSpec(
            name=f"profile{p.index}_items{p.opt_items}_len{p.bucket}",
            batch_size=1,
            inputs={
                names.prefix_ids: ("TYPE_INT64", (1, p.opt_prefix), "zero"),
                names.prefix_mask: ("TYPE_INT64", (1, p.opt_prefix), "zero"),
                names.item_ids: ("TYPE_INT64", (1, p.opt_items, p.bucket), "zero"),
                names.item_mask: ("TYPE_INT64", (1, p.opt_items, p.bucket), "zero"),
            },
        )
        for p in profiles
    )
    described = ";".join(f"{p.index}:{p.min_length}-{p.bucket}x{p.max_items}" for p in profiles)
    return TritonModelSpec(
        name=name,
        backend=None,
        platform=PLATFORM,
        max_batch_size=0,
        inputs=(
            TensorSpec(names.prefix_ids, "TYPE_INT64", (-1, -1)),
            TensorSpec(names.prefix_mask, "TYPE_INT64", (-1, -1)),
            TensorSpec(names.item_ids, "TYPE_INT64", (-1, -1, -1)),
            TensorSpec(names.item_mask, "TYPE_INT64", (-1, -1, -1)),
        ),
        outputs=(TensorSpec(names.score, "TYPE_FP32", (-1, -1)),),
        dynamic_batching=None,
        instance_groups=(
            InstanceGroupSpec(
                count=instance_count, kind="KIND_GPU", profiles=tuple(str(p.index) for p in profiles)
            ),
        ),
        warmups=warmups,
        parameters={**(parameters or {}), PROFILES_PARAMETER: described},
        cc_model_filenames=dict(cc_model_filenames),
    )


def request_problems(cfg: ModelConfig, inputs: Mapping[str, tuple[str, Sequence[int]]]) -> list[str]:
    """What a request gets wrong against a model's config: ``inputs`` maps each sent tensor's name to
    its (tritonclient data type such as ``INT64``, shape). Checks names (none unknown, none missing),
    data types, ranks and fixed dims, with the batch axis (<= ``max_batch_size``) only when it is > 0."""
    problems = []
    declared = {tensor.name: tensor for tensor in cfg.input}
    problems += [f"input {name!r} is not declared" for name in sorted(set(inputs) - set(declared))]
    problems += [f"input {name!r} is not sent" for name in sorted(set(declared) - set(inputs))]
    batched = cfg.max_batch_size > 0
    for name in sorted(set(inputs) & set(declared)):
        datatype, shape = inputs[name]
        tensor = declared[name]
        expected_type = mc.DataType.Name(tensor.data_type)
        if f"TYPE_{datatype}" != expected_type:
            problems.append(f"input {name!r} is sent as {datatype}, declared {expected_type}")
        dims = list(shape[1:] if batched else shape)
        if batched and not 1 <= shape[0] <= cfg.max_batch_size:
            problems.append(f"input {name!r}: batch {shape[0]} outside [1, {cfg.max_batch_size}]")
        if len(dims) != len(tensor.dims) or any(
            d not in (-1, s) for d, s in zip(tensor.dims, dims, strict=False)
        ):
            problems.append(
                f"input {name!r}: shape {list(shape)} does not fit dims {list(tensor.dims)}"
                + (" after the batch axis" if batched else " (no batch axis)")
            )
    return problems
