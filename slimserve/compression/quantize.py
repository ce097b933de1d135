"""onnx2int8 for the CPU target: ONNX Runtime static (calibrated, QDQ) and dynamic INT8 scorer graphs.

Static quantization calibrates activation ranges on real prompt batches (``input_ids``,
``attention_mask``), padded to their length bucket as the service sends them. Both variants keep the
graph's tensor names (``input_ids``, ``attention_mask``, ``score``) so the Triton python model
(``slimserve.triton_models.onnx_scorer``) runs the INT8 graph unchanged.

Defaults, chosen by measurement on SmolLM2-135M: only the weight MatMuls of the decoder (q/k/v/o,
gate/up) are quantized, weights per output channel as signed INT8, activations asymmetric UINT8 (x86
with VNNI); the MLP down projections stay float (their inputs carry outlier activations); MatMul outputs stay float so ONNX Runtime fuses each
``DQ -> MatMul`` into ``MatMulIntegerToFloat``. The attention MatMuls (activation x activation), the
norms, the embedding gather and the two-row label head stay float.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BuildError
from ..models.batching import padded_batches
from ..onnx_files import onnx_model_files
from ..quiet_logs import quiet_loggers

log = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask")
LABEL_HEAD = "label_head."  # in the initializer names of ScorerGraph.label_head (any module path above)
LABEL_COUNT = 2  # the label head's outputs: logit(yes), logit(no)
DEFAULT_OP_TYPES = ("MatMul",)
# Above this (graph plus weights), tensors are written to ``<name>.data`` (protobuf's 2 GiB limit, with margin).
EXTERNAL_DATA_BYTES = 1_800_000_000
ACTIVATION_TYPES = ("QUInt8", "QInt8")
WEIGHT_TYPES = ("QInt8", "QUInt8")
CALIBRATE_METHODS = ("MinMax", "Percentile", "Entropy")
# ORT's histogram calibrators stack every batch's activations into one array: shapes must agree, and
# all activations stay in memory until the end (use few prompts with these on a real model).
HISTOGRAM_METHODS = ("Percentile", "Entropy")

# A calibration batch: (input_ids, attention_mask) of the single-sequence graph, or the named inputs of
# any scorer graph (the multi-item graph's prefix_ids, prefix_mask, item_ids, item_mask).
Batch = tuple[np.ndarray, np.ndarray] | Mapping[str, np.ndarray]


class QuantizeError(BuildError):
    """ONNX Runtime quantization of a scorer graph failed."""


@dataclass(frozen=True)
class QuantizeResult:
    """The quantized graph, how it was made, its size on disk (graph plus external data) and duration."""

    path: Path
    method: str  # "static" or "dynamic"
    size_bytes: int
    seconds: float


def calibration_batches(
    sequences: list[list[int]], buckets: Sequence[int], batch_size: int = 8, pad_token_id: int = 0
) -> list[Batch]:
    """(input_ids, attention_mask) batches of token-id ``sequences``, each padded to its length bucket."""
    return [(ids, mask) for _, ids, mask in padded_batches(sequences, buckets, batch_size, pad_token_id)]


def uniform_rows(batches: Sequence[Batch]) -> list[Batch]:
    """Every row of ``batches`` as its own [1, width] batch, right-padded to the widest batch."""
    width = max((np.shape(ids)[1] for ids, _ in batches), default=0)
    rows = []
    for ids, mask in batches:
        pad = ((0, 0), (0, width - np.shape(ids)[1]))
        ids, mask = np.pad(ids, pad), np.pad(mask, pad)
        rows += [(ids[i : i + 1], mask[i : i + 1]) for i in range(len(ids))]
    return rows


def model_bytes(onnx_path: Path) -> int:
    """Bytes on disk of a graph and its external data."""
    return sum(f.stat().st_size for f in onnx_model_files(onnx_path))


def _needs_external_data(onnx_path: Path) -> bool:
    return model_bytes(onnx_path) > EXTERNAL_DATA_BYTES


class _BatchReader:
    """A ``CalibrationDataReader`` over in-memory batches (rewindable: Percentile/Entropy read twice)."""

    def __init__(self, batches: Iterable[Batch]):
        self._batches = [_feed(b) for b in batches]
        self._position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._position >= len(self._batches):
            return None
        self._position += 1
        return self._batches[self._position - 1]

    def rewind(self) -> None:
        self._position = 0

    def __len__(self) -> int:
        return len(self._batches)


def _feed(batch: Batch) -> dict[str, np.ndarray]:
    """A calibration batch as ONNX Runtime's feed (name -> INT64 array)."""
    if isinstance(batch, Mapping):
        return {name: np.asarray(array, dtype=np.int64) for name, array in batch.items()}
    return dict(zip(INPUT_NAMES, _check_batch(batch), strict=True))


def _check_batch(batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = (np.asarray(a, dtype=np.int64) for a in batch)
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise QuantizeError(
            f"calibration batch must be two [batch, sequence] arrays, got {ids.shape} and {mask.shape}"
        )
    return ids, mask


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise QuantizeError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _check_input(onnx_in: Path, onnx_out: Path) -> None:
    if not Path(onnx_in).is_file():
        raise QuantizeError(f"ONNX graph to quantize not found: {onnx_in}")
    if Path(onnx_in).resolve() == Path(onnx_out).resolve():
        raise QuantizeError(f"quantizing {onnx_in} onto itself: choose another output path")


def nodes_to_keep_float(
    onnx_path: Path, op_types: Sequence[str], weights_only: bool, float_down_proj: bool
) -> list[str]:
    """Names of nodes to leave in float.

    Always the label head (two rows whose output difference is the score: INT8 there costs accuracy
    for no speed); with ``weights_only`` the MatMuls without a weight input (attention products; the
    QDQ quantizer ignores ``MatMulConstBOnly``, exclusion by name works); with ``float_down_proj`` the
    MatMuls whose weight has the widest input, the MLP down projections. Their inputs carry the outlier
    activations of Llama-style decoders (SmolLM2-135M: calibrated range ~3000 in one layer, 50-170 in
    several, 1-15 everywhere else), which one per-tensor INT8 scale cannot represent.
    """
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {init.name: tuple(init.dims) for init in graph.initializer}
    weight_dims = {
        n.name: weights[n.input[1]]
        for n in graph.node
        if n.op_type == "MatMul" and len(n.input) > 1 and len(weights.get(n.input[1], ())) == 2
    }
    widest = max((dims[0] for dims in weight_dims.values()), default=None)
    keep = []
    for node in graph.node:
        if _is_label_head(node, weights):
            # The dynamic quantizer rewrites Gemm as MatMul named "<gemm>_MatMul" before quantizing.
            keep += [node.name, f"{node.name}_MatMul"]
        elif node.op_type not in op_types:
            continue
        elif node.name not in weight_dims:
            if weights_only:
                keep.append(node.name)
        elif float_down_proj and weight_dims[node.name][0] == widest:
            keep.append(node.name)
    return keep


def _is_label_head(node, weights: Mapping[str, tuple[int, ...]]) -> bool:
    """The label head: named after ``ScorerGraph.label_head`` (the dynamo exporter keeps module names) or
    the one linear layer with 2 outputs (the TorchScript exporter folds its transposed weight into an
    unnamed constant)."""
    if any(name.startswith(LABEL_HEAD) or f".{LABEL_HEAD}" in name for name in node.input):
        return True
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return False
    dims = weights.get(node.input[1], ())
    if len(dims) != 2:
        return False
    transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in node.attribute)
    return dims[0 if transposed else 1] == LABEL_COUNT


def _preprocess(onnx_in: Path, onnx_out: Path, external: bool) -> None:
    """ORT's pre-processing: symbolic shape inference, graph optimization, ONNX shape inference."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    options = {"save_as_external_data": external, "all_tensors_to_one_file": True}
    if external:
        options["external_data_location"] = onnx_out.name + ".data"
    try:
        quant_pre_process(str(onnx_in), str(onnx_out), **options)
    except Exception as exc:  # symbolic shape inference rejects some exported ops: ONNX inference only
        log.warning("symbolic shape inference failed (%s); pre-processing without it", exc)
        quant_pre_process(str(onnx_in), str(onnx_out), skip_symbolic_shape=True, **options)


def _run_quantizer(onnx_in: Path, onnx_out: Path, method: str, quantize) -> QuantizeResult:
    """Pre-process ``onnx_in``, call ``quantize(pre_processed, external)``, map failures to QuantizeError."""
    onnx_in, onnx_out = Path(onnx_in), Path(onnx_out)
    _check_input(onnx_in, onnx_out)
    onnx_out.parent.mkdir(parents=True, exist_ok=True)
    # The quantizers write external data to one "<name>.data"; an earlier run's would count in the size.
    onnx_out.with_name(onnx_out.name + ".data").unlink(missing_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="slimserve-quant-") as tmp:
        pre_processed = Path(tmp) / "preprocessed.onnx"
        try:
            external = _needs_external_data(onnx_in)  # reads the graph: a corrupt one fails here
            with quiet_loggers(("onnxruntime.quantization",)):  # the quantizers log a line per node
                _preprocess(onnx_in, pre_processed, external)
                quantize(pre_processed, external)
        except QuantizeError:
            raise
        except Exception as exc:  # the quantizer raises many types (onnx, ORT, numpy, asserts)
            raise QuantizeError(
                f"{method} INT8 quantization of {onnx_in} failed: {type(exc).__name__}: {exc}"
            ) from exc
    seconds = time.perf_counter() - started
    result = QuantizeResult(onnx_out, method, model_bytes(onnx_out), seconds)
    log.info(
        "%s INT8: %s (%.1f MB, from %.1f MB) in %.1f s",
        method,
        onnx_out,
        result.size_bytes / 1e6,
        model_bytes(onnx_in) / 1e6,
        seconds,
    )
    return result


def quantize_scorer_static(
    onnx_in: Path,
    onnx_out: Path,
    calibration: Sequence[Batch],
    *,
    per_channel: bool = True,
    activation_type: str = "QUInt8",
    weight_type: str = "QInt8",
    calibrate_method: str = "MinMax",
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
    weights_only: bool = True,
    float_down_proj: bool = True,
    quantize_outputs: bool = False,
) -> QuantizeResult:
    """Static INT8 (QDQ format) of a scorer graph, calibrated on (input_ids, attention_mask) batches.

    ``weights_only`` quantizes only MatMuls whose second input is a weight (not the attention
    products); ``float_down_proj`` keeps the MLP down projections float (see ``nodes_to_keep_float``);
    ``quantize_outputs`` also puts QDQ on the outputs of the quantized ops.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    _check_choice("activation_type", activation_type, ACTIVATION_TYPES)
    _check_choice("weight_type", weight_type, WEIGHT_TYPES)
    _check_choice("calibrate_method", calibrate_method, CALIBRATE_METHODS)
    if calibrate_method in HISTOGRAM_METHODS:
        calibration = uniform_rows(calibration)
    reader = _BatchReader(calibration)
    if not len(reader):
        raise QuantizeError("static quantization needs at least one calibration batch")
    extra_options = {
        "MatMulConstBOnly": weights_only,
        "ActivationSymmetric": activation_type == "QInt8",
        "WeightSymmetric": True,
        # Not "CalibMaxIntermediateOutputs": in ORT 1.32 MinMax drops each full chunk of collected
        # outputs without merging its ranges, so all but the last partial chunk is lost (seen here).
        # MinMax only keeps per-tensor ReduceMin/ReduceMax results, so memory stays small anyway.
    }
    if not quantize_outputs:
        extra_options["OpTypesToExcludeOutputQuantization"] = list(op_types)

    def run(pre_processed: Path, external: bool) -> None:
        quantize_static(
            str(pre_processed),
            str(onnx_out),
            reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(op_types),
            nodes_to_exclude=nodes_to_keep_float(pre_processed, op_types, weights_only, float_down_proj),
            per_channel=per_channel,
            reduce_range=False,
            activation_type=QuantType[activation_type],
            weight_type=QuantType[weight_type],
            calibrate_method=CalibrationMethod[calibrate_method],
            use_external_data_format=external,
            extra_options=extra_options,
        )

    return _run_quantizer(onnx_in, onnx_out, "static", run)


def quantize_scorer_dynamic(
    onnx_in: Path,
    onnx_out: Path,
    *,
    per_channel: bool = True,
    weight_type: str = "QInt8",
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
    float_down_proj: bool = True,
) -> QuantizeResult:
    """Dynamic INT8 of a scorer graph: INT8 weights, activation ranges computed per batch at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _check_choice("weight_type", weight_type, WEIGHT_TYPES)

    def run(pre_processed: Path, external: bool) -> None:
        quantize_dynamic(
            str(pre_processed),
            str(onnx_out),
            op_types_to_quantize=list(op_types),
            nodes_to_exclude=nodes_to_keep_float(pre_processed, op_types, True, float_down_proj),
            per_channel=per_channel,
            reduce_range=False,
            weight_type=QuantType[weight_type],
            use_external_data_format=external,
            extra_options={"MatMulConstBOnly": True},
        )

    return _run_quantizer(onnx_in, onnx_out, "dynamic", run)


def quantize_scorer_weight_only(
    onnx_in: Path,
    onnx_out: Path,
    *,
    block_size: int = 32,
    accuracy_level: int = 4,
) -> QuantizeResult:
    """Block-wise INT8 weights (``MatMulNBits``, one scale per ``block_size`` inputs of a column).

    Small blocks follow the weights' outliers far better than one scale per channel; activations are
    not calibrated. The label head stays float (``nodes_to_keep_float``). ``accuracy_level`` 4 lets ONNX Runtime quantize activations to INT8 per block at run
    time (the fast path on CPUs with VNNI); 1 computes in float32 from de-quantized weights (smaller
    file, no speed-up). Measured on SmolLM2-135M (raw, 64 prompts): Spearman to FP32 0.92 at level 4
    and 0.996 at level 1, against 0.60 for static and 0.43 for dynamic per-channel INT8.
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if block_size < 16 or block_size & (block_size - 1):
        raise QuantizeError(f"block_size must be a power of two >= 16, got {block_size}")

    def run(pre_processed: Path, external: bool) -> None:
        import onnx

        model = onnx.load(str(pre_processed))
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=8,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=accuracy_level,
            nodes_to_exclude=nodes_to_keep_float(  # the label head only
                pre_processed, ("MatMul",), weights_only=False, float_down_proj=False
            ),
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(onnx_out), use_external_data_format=external)

    return _run_quantizer(onnx_in, onnx_out, "weight-only", run)
