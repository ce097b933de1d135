"""onnx2trt: a strongly typed TensorRT engine with one optimization profile per bucket and a timing cache.

The same builder serves the single-sequence graph (``input_ids``/``attention_mask`` [batch, length]) and
the multi-item graph (``prefix_*`` [members, P], ``item_*`` [members, N, L]): each profile names its
inputs and their min/opt/max shapes, checked against the parsed network's inputs before building.

Written against the TensorRT Python API so it works on 10.x (the 24.10 containers carry 10.5) and 11.x:
no precision builder flags (11.x removed them); the network is created STRONGLY_TYPED (required on 10.x,
the default on 11.x), so every layer runs in the type the Q/DQ ONNX gives it. The timing cache is read
before and written after each build (per compute capability), so rebuilding after a small change reuses
the tactic timings. Next to the plan, ``<plan>.json`` records what built it, and ``<plan>.trtexec.sh``
rebuilds it with ``trtexec``.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ... import atomic
from ...errors import BuildError
from .profiles import Profile, profile_input_problems, trtexec_shape_flags

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineBuildConfig:
    """Builder settings (no precision here: it is in the graph)."""

    workspace_gib: float = 4.0
    optimization_level: int = 3
    timing_cache: Path | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What an engine is and what built it."""

    plan: str
    onnx: str
    tensorrt_version: str
    compute_capability: str
    precision: str
    profiles: list[dict]
    strongly_typed: bool
    plan_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def import_tensorrt():
    """``import tensorrt`` with an error naming what is missing."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BuildError(
            "the tensorrt target needs TensorRT (Python package 'tensorrt', shipped in "
            f"nvcr.io/nvidia/tensorrt:24.10-py3) and an NVIDIA GPU: {exc}"
        ) from exc
    return trt


def strongly_typed_flags(trt) -> int:
    """Network creation flags: STRONGLY_TYPED where the enum has it (10.x; accepted, ignored on 11.x)."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def network_inputs(network) -> dict[str, int]:
    """A parsed network's inputs: name -> rank."""
    return {network.get_input(i).name: len(network.get_input(i).shape) for i in range(network.num_inputs)}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, data)


def trtexec_script(
    onnx_path: Path, plan_path: Path, profiles: Sequence[Profile], config: EngineBuildConfig
) -> str:
    """A shell script rebuilding the same engine with ``trtexec`` (the build step, reproducible alone)."""
    args = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={plan_path}",
        "--stronglyTyped",
        f"--memPoolSize=workspace:{int(config.workspace_gib * 1024)}M",
        f"--builderOptimizationLevel={config.optimization_level}",
        *trtexec_shape_flags(profiles),
    ]
    if config.timing_cache is not None:
        args.append(f"--timingCacheFile={config.timing_cache}")
    return (
        "#!/usr/bin/env bash\n# Rebuilds this engine (TensorRT 10.x; on 11.x --stronglyTyped is the default).\n"
        + " \\\n  ".join(shlex.quote(a) for a in args)
        + "\n"
    )


def _parse(trt, builder, flags: int, logger, onnx_path: Path, profiles: Sequence[Profile]):
    """(network, parser) of the ONNX graph; ``BuildError`` when it does not parse or the profiles miss
    or misname one of its inputs (rank 2 or 3)."""
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT could not parse {onnx_path}: {errors}")
    problems = profile_input_problems(network_inputs(network), profiles)
    if problems:
        raise BuildError(f"optimization profiles do not fit {onnx_path}: " + "; ".join(problems))
    return network, parser


def add_profiles(builder, builder_config, profiles: Sequence[Profile]) -> None:
    """One ``IOptimizationProfile`` per profile, each input's (min, opt, max) set by name, in order."""
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.shapes().items():
            trt_profile.set_shape(name, low, opt, high)
        builder_config.add_optimization_profile(trt_profile)


def build_engine(
    onnx_path: Path,
    plan_path: Path,
    profiles: Sequence[Profile],
    config: EngineBuildConfig,
    precision: str,
    compute_capability: str,
) -> EngineInfo:
    """Parse the Q/DQ ONNX, build the serialized engine, write it (atomically) with its info and script."""
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = strongly_typed_flags(trt)
    network, _parser = _parse(trt, builder, flags, logger, onnx_path, profiles)  # the parser owns weights
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config.workspace_gib * (1 << 30)))
    builder_config.builder_optimization_level = config.optimization_level
    cache_bytes = b""
    if config.timing_cache is not None and config.timing_cache.is_file():
        cache_bytes = config.timing_cache.read_bytes()
        log.info("timing cache: %s (%d bytes)", config.timing_cache, len(cache_bytes))
    cache = builder_config.create_timing_cache(cache_bytes)
    if not builder_config.set_timing_cache(cache, False):  # (cache, ignore_mismatch)
        raise BuildError(
            f"TensorRT rejected the timing cache {config.timing_cache} (another GPU or version?)"
        )
    add_profiles(builder, builder_config, profiles)
    log.info("building TensorRT %s engine: %d profiles, strongly typed", trt.__version__, len(profiles))
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise BuildError(f"TensorRT failed to build an engine from {onnx_path} (see the TensorRT log above)")
    _write_atomic(plan_path, bytes(serialized))
    if config.timing_cache is not None:
        _write_atomic(config.timing_cache, bytes(cache.serialize()))  # grown by this build
    info = EngineInfo(
        plan=plan_path.name,
        onnx=str(onnx_path),
        tensorrt_version=trt.__version__,
        compute_capability=compute_capability,
        precision=precision,
        profiles=[p.as_dict() for p in profiles],
        strongly_typed=bool(flags) or int(trt.__version__.split(".")[0]) >= 11,
        plan_bytes=plan_path.stat().st_size,
    )
    plan_path.with_name(plan_path.name + ".json").write_text(json.dumps(info.as_dict(), indent=2) + "\n")
    plan_path.with_name(plan_path.name + ".trtexec.sh").write_text(
        trtexec_script(onnx_path, plan_path, profiles, config)
    )
    return info
