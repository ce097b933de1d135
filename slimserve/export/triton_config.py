"""Typed Triton model descriptions, rendered to ``config.pbtxt`` through Triton's own ``ModelConfig`` schema.

A model is described with frozen dataclasses (:class:`TritonModelSpec` and its parts), converted to the
``ModelConfig`` protobuf that Triton itself parses (``tritonclient.grpc.model_config_pb2``), and printed
with protobuf ``text_format``. Nothing is hand-typed: every field name, enum value and type is checked by
the schema, and :func:`check_config` adds the semantic checks the schema cannot express.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ModelConfig = mc.ModelConfig

# "zero", "random", or "file:<name>": raw bytes of one sample in <version>/warmup/<name>.
WarmupData = str


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor. ``dims`` exclude the batch dimension when ``max_batch_size > 0``."""

    name: str
    data_type: str  # a Triton DataType name: "TYPE_INT64", "TYPE_FP32", ...
    dims: tuple[int, ...]
    optional: bool = False  # inputs only: a request may omit it
    # Inputs only: the dynamic batcher may put requests of different shapes in one execution (the
    # model pads them itself); without it Triton only merges requests of equal shape.
    allow_ragged_batch: bool = False


@dataclass(frozen=True)
class DynamicBatchingSpec:
    """Triton's dynamic batcher and its default queue policy."""

    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no queue timeout
    # None: only when default_timeout_us is set (Triton 2.51 ignores a request's timeout otherwise). Any
    # queue policy (a bound, a timeout or this override) turns off the batcher's payload prefetching, and
    # then a request that arrives while the instance is busy waits up to 500 ms (docs/bench.md "Tail latency").
    allow_timeout_override: bool | None = None
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    priority_levels: int = 0  # 0: priorities disabled
    default_priority_level: int = 0
    preserve_ordering: bool = False


def batcher_prefetches(spec: DynamicBatchingSpec) -> bool:
    """Whether Triton 2.51's dynamic batcher prefetches payloads for ``spec`` (core r24.10,
    ``PriorityQueue``: no priority levels, no default timeout, no timeout override, no queue bound).

    Without prefetching the batcher hands a batch over only to an instance waiting for one, and nothing
    wakes it when a busy instance comes back: a request that came meanwhile waits for the batcher's idle
    timeout, 500 ms.
    """
    override = spec.allow_timeout_override
    override = spec.default_timeout_us > 0 if override is None else override
    return not (spec.priority_levels or spec.default_timeout_us or override or spec.max_queue_size)


@dataclass(frozen=True)
class InstanceGroupSpec:
    """A group of model instances (each python-backend instance is one process)."""

    count: int = 1
    kind: str = "KIND_CPU"  # "KIND_CPU", "KIND_GPU", "KIND_AUTO", "KIND_MODEL"
    gpus: tuple[int, ...] = ()
    profiles: tuple[str, ...] = ()  # TensorRT optimization profiles the instances use (empty: all)


@dataclass(frozen=True)
class WarmupSpec:
    """A warmup request Triton runs at load. ``inputs``: name -> (data_type, dims without batch, data)."""

    name: str
    batch_size: int
    inputs: Mapping[str, tuple[str, tuple[int, ...], WarmupData]]
    count: int = 1


@dataclass(frozen=True)
class VersionPolicySpec:
    """Which versions Triton serves: the latest ``num_versions``, all, or the listed ones."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def latest(cls, num_versions: int = 1) -> VersionPolicySpec:
        return cls(kind="latest", num_versions=num_versions)

    @classmethod
    def all(cls) -> VersionPolicySpec:
        return cls(kind="all")

    @classmethod
    def specific(cls, *versions: int) -> VersionPolicySpec:
        return cls(kind="specific", versions=tuple(versions))


@dataclass(frozen=True)
class TritonModelSpec:
    """A whole Triton model configuration.

    The default ``version_policy`` is ``latest { num_versions: 1 }``: one ``config.pbtxt`` covers all the
    versions of a model, and the serving-bundle hash stamped in it is that of the newest version, so
    Triton serves only that version.
    """

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    backend: str | None = "python"
    platform: str | None = None
    dynamic_batching: DynamicBatchingSpec | None = None
    instance_groups: tuple[InstanceGroupSpec, ...] = (InstanceGroupSpec(),)
    warmups: tuple[WarmupSpec, ...] = ()
    version_policy: VersionPolicySpec = field(default_factory=VersionPolicySpec)
    parameters: Mapping[str, str] = field(default_factory=dict)
    cc_model_filenames: Mapping[str, str] = field(default_factory=dict)
    default_model_filename: str | None = None
    decoupled: bool = False  # model_transaction_policy: any number of responses per request (streaming)


def _enum(enum_type, value: str, what: str) -> int:
    try:
        return enum_type.Value(value)
    except ValueError:
        allowed = ", ".join(enum_type.keys())
        raise ValueError(f"{what}: unknown value {value!r} (allowed: {allowed})") from None


def _data_type(value: str, what: str) -> int:
    if value == "TYPE_INVALID":
        raise ValueError(f"{what}: data type TYPE_INVALID is not allowed")
    return _enum(mc.DataType, value, what)


def _tensor(message, spec: TensorSpec, what: str) -> None:
    message.name = spec.name
    message.data_type = _data_type(spec.data_type, f"{what} {spec.name!r}")
    message.dims.extend(spec.dims)
    if spec.optional:
        message.optional = True
    if spec.allow_ragged_batch:
        message.allow_ragged_batch = True


def to_model_config(spec: TritonModelSpec) -> ModelConfig:
    """Build Triton's ``ModelConfig`` protobuf from a spec (enum names checked by the schema)."""
    cfg = ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size)
    if spec.backend:
        cfg.backend = spec.backend
    if spec.platform:
        cfg.platform = spec.platform
    if spec.default_model_filename:
        cfg.default_model_filename = spec.default_model_filename
    for key, value in spec.cc_model_filenames.items():
        cfg.cc_model_filenames[key] = value
    if spec.decoupled:
        cfg.model_transaction_policy.decoupled = True
    policy = spec.version_policy
    if policy.kind == "latest":
        cfg.version_policy.latest.num_versions = policy.num_versions
    elif policy.kind == "all":
        cfg.version_policy.all.SetInParent()
    elif policy.kind == "specific":
        cfg.version_policy.specific.versions.extend(policy.versions)
    else:
        raise ValueError(f"version_policy: unknown kind {policy.kind!r} (allowed: latest, all, specific)")
    for tensor in spec.inputs:
        _tensor(cfg.input.add(), tensor, "input")
    for tensor in spec.outputs:
        _tensor(cfg.output.add(), tensor, "output")
    if spec.dynamic_batching is not None:
        _dynamic_batching(cfg.dynamic_batching, spec.dynamic_batching)
    for index, group in enumerate(spec.instance_groups):
        message = cfg.instance_group.add(count=group.count)
        message.kind = _enum(mc.ModelInstanceGroup.Kind, group.kind, f"instance_group[{index}].kind")
        message.gpus.extend(group.gpus)
        message.profile.extend(group.profiles)
    for warmup in spec.warmups:
        _warmup(cfg.model_warmup.add(), warmup)
    for key, value in spec.parameters.items():
        if not isinstance(value, str):
            raise ValueError(f"parameter {key!r}: value must be a string, got {type(value).__name__}")
        cfg.parameters[key].string_value = value
    return cfg


def _dynamic_batching(message, spec: DynamicBatchingSpec) -> None:
    message.max_queue_delay_microseconds = spec.max_queue_delay_us
    message.preferred_batch_size.extend(spec.preferred_batch_sizes)
    message.preserve_ordering = spec.preserve_ordering
    if spec.priority_levels:
        message.priority_levels = spec.priority_levels
        message.default_priority_level = spec.default_priority_level
    policy = message.default_queue_policy
    policy.timeout_action = _enum(
        mc.ModelQueuePolicy.TimeoutAction, spec.timeout_action, "dynamic_batching.timeout_action"
    )
    policy.default_timeout_microseconds = spec.default_timeout_us
    override = spec.allow_timeout_override
    policy.allow_timeout_override = spec.default_timeout_us > 0 if override is None else override
    policy.max_queue_size = spec.max_queue_size


def _warmup(message, spec: WarmupSpec) -> None:
    message.name = spec.name
    message.batch_size = spec.batch_size
    message.count = spec.count
    for input_name, (data_type, dims, data) in spec.inputs.items():
        entry = message.inputs[input_name]
        entry.data_type = _data_type(data_type, f"warmup {spec.name!r} input {input_name!r}")
        entry.dims.extend(dims)
        if data == "zero":
            entry.zero_data = True
        elif data == "random":
            entry.random_data = True
        elif data.startswith("file:") and len(data) > len("file:"):
            entry.input_data_file = data[len("file:") :]
        else:
            raise ValueError(
                f"warmup {spec.name!r} input {input_name!r}: data must be 'zero', 'random' or 'file:<name>'"
            )


def check_config(cfg: ModelConfig) -> None:
    """Semantic checks ``text_format`` cannot do; raise ``ValueError`` listing every problem found."""
    problems: list[str] = []
    if not cfg.name:
        problems.append("model name is empty")
    if cfg.max_batch_size < 0:
        problems.append(f"max_batch_size is {cfg.max_batch_size}, must be >= 0")
    if not cfg.backend and not cfg.platform:
        problems.append("neither backend nor platform is set")
    if not cfg.input:
        problems.append("no inputs declared")
    if not cfg.output:
        problems.append("no outputs declared")
    problems += _tensor_problems(cfg)
    if cfg.HasField("dynamic_batching"):
        for size in cfg.dynamic_batching.preferred_batch_size:
            if size <= 0 or size > cfg.max_batch_size:
                problems.append(
                    f"dynamic_batching: preferred batch size {size} is outside [1, max_batch_size "
                    f"{cfg.max_batch_size}]"
                )
        if cfg.max_batch_size == 0:
            problems.append("dynamic_batching needs max_batch_size > 0")
    for group in cfg.instance_group:
        if group.count < 1:
            problems.append(f"instance_group count {group.count} must be >= 1")
    policy = cfg.version_policy
    if policy.HasField("latest") and policy.latest.num_versions < 1:
        problems.append("version_policy latest.num_versions must be >= 1")
    if policy.HasField("specific") and not policy.specific.versions:
        problems.append("version_policy specific lists no versions")
    problems += _warmup_problems(cfg)
    if problems:
        raise ValueError(f"invalid Triton config for model {cfg.name!r}: " + "; ".join(problems))


def _tensor_problems(cfg: ModelConfig) -> list[str]:
    problems = []
    seen: dict[str, str] = {}
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        for tensor in tensors:
            if not tensor.name:
                problems.append(f"an {kind} has an empty name")
            elif tensor.name in seen:
                problems.append(
                    f"tensor name {tensor.name!r} is used by more than one {seen[tensor.name]}/{kind}"
                )
            seen[tensor.name] = kind
            if tensor.data_type == mc.TYPE_INVALID:
                problems.append(f"{kind} {tensor.name!r} has no data type")
            if not tensor.dims:
                problems.append(f"{kind} {tensor.name!r} has no dims")
            if any(d == 0 or d < -1 for d in tensor.dims):
                problems.append(f"{kind} {tensor.name!r}: dims {list(tensor.dims)} must be positive or -1")
    return problems


def _warmup_problems(cfg: ModelConfig) -> list[str]:
    problems = []
    declared = {t.name: t for t in cfg.input}
    names = set()
    for warmup in cfg.model_warmup:
        label = f"warmup {warmup.name!r}"
        if not warmup.name:
            problems.append("a warmup has an empty name")
        if warmup.name in names:
            problems.append(f"{label} is declared twice")
        names.add(warmup.name)
        if cfg.max_batch_size > 0 and not 1 <= warmup.batch_size <= cfg.max_batch_size:
            problems.append(f"{label}: batch_size {warmup.batch_size} outside [1, {cfg.max_batch_size}]")
        if cfg.max_batch_size == 0 and warmup.batch_size != 1:
            problems.append(f"{label}: batch_size must be 1 for a model without batching")
        missing = sorted(n for n in declared if n not in warmup.inputs and not declared[n].optional)
        unknown = sorted(n for n in warmup.inputs if n not in declared)
        if missing:
            problems.append(f"{label}: missing inputs {missing}")
        if unknown:
            problems.append(f"{label}: undeclared inputs {unknown}")
        for name, entry in warmup.inputs.items():
            if name not in declared:
                continue
            tensor = declared[name]
            if entry.data_type != tensor.data_type:
                problems.append(
                    f"{label} input {name!r}: data type {mc.DataType.Name(entry.data_type)} != declared "
                    f"{mc.DataType.Name(tensor.data_type)}"
                )
            if not _dims_fit(tuple(entry.dims), tuple(tensor.dims)) or any(d < 1 for d in entry.dims):
                problems.append(
                    f"{label} input {name!r}: dims {list(entry.dims)} do not fit declared {list(tensor.dims)}"
                )
            if not (entry.zero_data or entry.random_data or entry.input_data_file):
                problems.append(f"{label} input {name!r}: no data source (zero, random or file)")
    return problems


def _dims_fit(concrete: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(concrete) == len(declared) and all(
        d == -1 or d == c for c, d in zip(concrete, declared, strict=False)
    )


def render_config_pbtxt(spec: TritonModelSpec) -> str:
    """``config.pbtxt`` text for a spec, checked and verified to parse back to the same ``ModelConfig``."""
    cfg = to_model_config(spec)
    check_config(cfg)
    text = text_format.MessageToString(cfg)
    if parse_config_pbtxt(text) != cfg:
        raise ValueError(f"config.pbtxt for model {spec.name!r} does not round-trip through ModelConfig")
    return text


def parse_config_pbtxt(text: str) -> ModelConfig:
    """Parse ``config.pbtxt`` text with Triton's schema; ``ValueError`` names the offending line/field."""
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise ValueError(f"config.pbtxt rejected by Triton's ModelConfig schema: {exc}") from exc
    return cfg


# ONNX element types (onnx.TensorProto.DataType values) -> Triton data types.
_ONNX_TO_TRITON = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}


def onnx_io_specs(
    onnx_path: Path, batched: bool = True
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The graph's (inputs, outputs) as Triton tensor specs; symbolic dims become -1.

    With ``batched`` (Triton ``max_batch_size > 0``) the first ONNX dimension is the implicit batch
    dimension and is dropped: ONNX ``[batch, seq]`` becomes Triton dims ``[-1]``.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}

    def convert(value_info) -> TensorSpec:
        tensor_type = value_info.type.tensor_type
        elem = tensor_type.elem_type
        if elem not in _ONNX_TO_TRITON:
            raise ValueError(f"{onnx_path}: tensor {value_info.name!r} has unsupported ONNX type {elem}")
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor_type.shape.dim
        )
        if batched:
            if not dims:
                raise ValueError(f"{onnx_path}: tensor {value_info.name!r} is a scalar, it has no batch dim")
            dims = dims[1:]
        return TensorSpec(value_info.name, _ONNX_TO_TRITON[elem], dims)

    inputs = tuple(convert(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(convert(v) for v in model.graph.output)
    return inputs, outputs


def check_against_onnx(spec: TritonModelSpec, onnx_path: Path, extra_outputs: Iterable[str] = ()) -> None:
    """Check that the spec's tensors match the ONNX graph's inputs and outputs (names, types, dims).

    ``extra_outputs`` names outputs the Triton model adds beyond the graph (the python-backend scorer
    adds ``compute_ms``). A dimension fixed in the graph must be the same in the spec; a symbolic one
    accepts anything. Raises ``ValueError`` listing every mismatch.
    """
    onnx_inputs, onnx_outputs = onnx_io_specs(onnx_path, batched=spec.max_batch_size > 0)
    extra = set(extra_outputs)
    problems = _compare("input", spec.inputs, onnx_inputs, set(), require_all=True)
    # Triton lets a config expose a subset of a model's outputs.
    problems += _compare("output", spec.outputs, onnx_outputs, extra, require_all=False)
    if problems:
        raise ValueError(f"model {spec.name!r} does not match {onnx_path}: " + "; ".join(problems))


def _compare(
    kind: str,
    declared: tuple[TensorSpec, ...],
    graph: tuple[TensorSpec, ...],
    extra: set[str],
    require_all: bool,
) -> list[str]:
    problems = []
    by_name = {t.name: t for t in graph}
    declared_names = {t.name for t in declared}
    for tensor in declared:
        actual = by_name.get(tensor.name)
        if actual is None:
            if tensor.name not in extra:
                problems.append(f"{kind} {tensor.name!r} is not in the graph (graph has {sorted(by_name)})")
            continue
        if actual.data_type != tensor.data_type:
            problems.append(f"{kind} {tensor.name!r}: config {tensor.data_type}, graph {actual.data_type}")
        if len(actual.dims) != len(tensor.dims) or any(
            g != -1 and g != d for g, d in zip(actual.dims, tensor.dims, strict=False)
        ):
            problems.append(
                f"{kind} {tensor.name!r}: config dims {list(tensor.dims)}, graph dims {list(actual.dims)}"
            )
    missing = sorted(set(by_name) - declared_names)
    if missing and require_all:
        problems.append(f"graph {kind}s {missing} are not declared in the config")
    return problems
