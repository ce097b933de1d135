"""NVIDIA Model Optimizer ONNX PTQ: the scorer graph with Q/DQ nodes (INT8 or FP8), calibrated on real prompts.

Calibration feeds are real tokenized prompts laid out exactly as the services send them (single-sequence
batches padded to their length buckets, or multi-item member requests), so each profile's activation
ranges are seen. The layers left unquantized are cast to
``high_precision_dtype`` (FP16 by default): a strongly typed TensorRT build runs exactly these types.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ...errors import BuildError
from ...models.batching import padded_batches
from ...onnx_files import external_data_locations

log = logging.getLogger(__name__)

CALIBRATION_EPS = {"cuda": ["cuda:0", "cpu"], "cpu": ["cpu"]}


def modelopt_quantize_fn():
    try:
        from modelopt.onnx.quantization import quantize
    except ImportError as exc:
        raise BuildError(
            f"the tensorrt target needs NVIDIA Model Optimizer (pip install 'slimserve[gpu]'): {exc}"
        ) from exc
    return quantize


def _reader_base():
    from onnxruntime.quantization import CalibrationDataReader

    return CalibrationDataReader


def feeds_calibration_reader(feeds: Sequence[dict]):
    """An ONNX Runtime ``CalibrationDataReader`` over ready feeds (input name -> array), what Model
    Optimizer takes: bucket-padded single-sequence batches or multi-item member requests."""
    feeds = list(feeds)
    if not feeds:
        raise BuildError("calibration needs at least one prompt")

    class FeedsCalibrationReader(_reader_base()):
        def __init__(self):
            self.rewind()

        def get_next(self):
            return next(self._iter, None)

        def get_first(self):
            return feeds[0]

        def rewind(self):
            self._iter = iter(feeds)

        def __len__(self):
            return len(feeds)

    return FeedsCalibrationReader()


def bucket_feeds(sequences: Sequence[Sequence[int]], buckets, batch_size: int) -> list[dict]:
    """Single-sequence calibration feeds: ``sequences`` padded to their buckets, in batches."""
    return [
        {"input_ids": ids, "attention_mask": mask}
        for _, ids, mask in padded_batches([list(s) for s in sequences], buckets, batch_size)
    ]


def bucket_calibration_reader(sequences: Sequence[Sequence[int]], buckets, batch_size: int):
    """A calibration reader over bucket-padded batches of ``sequences``."""
    return feeds_calibration_reader(bucket_feeds(sequences, buckets, batch_size))


def available_calibration_eps(provider: str) -> list[str]:
    """Model Optimizer's ``calibration_eps`` for a provider, falling back to CPU without CUDA in ORT."""
    import onnxruntime as ort

    if provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        log.warning("ONNX Runtime has no CUDAExecutionProvider (onnxruntime-gpu missing): calibrating on CPU")
        return CALIBRATION_EPS["cpu"]
    return CALIBRATION_EPS[provider]


def quantize_qdq(
    fp32_onnx: Path,
    output: Path,
    sequences: Sequence[Sequence[int]],
    buckets,
    precision: str,
    batch_size: int = 16,
    **options,
) -> Path:
    """``quantize_qdq_feeds`` of the single-sequence graph, calibrated on ``sequences`` padded to
    ``buckets`` in batches of ``batch_size``."""
    return quantize_qdq_feeds(
        fp32_onnx, output, bucket_feeds(sequences, buckets, batch_size), precision, **options
    )


def quantize_qdq_feeds(
    fp32_onnx: Path,
    output: Path,
    feeds: Sequence[dict],
    precision: str,
    calibration_method: str = "max",
    high_precision_dtype: str = "fp16",
    provider: str = "cuda",
) -> Path:
    """Write ``output``: ``fp32_onnx`` with Model Optimizer Q/DQ nodes of ``precision`` (int8 or fp8),
    calibrated on ``feeds`` (input name -> array, the shapes the service sends)."""
    if precision not in ("int8", "fp8"):
        raise BuildError(f"tensorrt.precision: Q/DQ supports int8 and fp8, got {precision!r}")
    quantize = modelopt_quantize_fn()
    fp32_onnx, output = Path(fp32_onnx), Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    external = bool(external_data_locations(fp32_onnx))
    reader = feeds_calibration_reader(feeds)
    log.info(
        "Model Optimizer %s Q/DQ: %d calibration feeds (%s), unquantized layers in %s",
        precision,
        len(reader),
        calibration_method,
        high_precision_dtype,
    )
    try:
        quantize(
            str(fp32_onnx),
            quantize_mode=precision,
            calibration_data_reader=reader,
            calibration_method=calibration_method,
            calibration_eps=available_calibration_eps(provider),
            high_precision_dtype=high_precision_dtype,
            use_external_data_format=external,
            output_path=str(output),
            log_level="WARNING",
        )
    except BuildError:
        raise
    except Exception as exc:  # Model Optimizer raises many types; one error for the build
        raise BuildError(f"Model Optimizer {precision} quantization of {fp32_onnx} failed: {exc}") from exc
    if not output.exists():
        raise BuildError(f"Model Optimizer wrote no graph at {output}")
    return output


def qdq_summary(onnx_path: Path) -> dict[str, int]:
    """Counts of Q/DQ nodes and of quantized element types in a graph (what the engine will run)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    counts: dict[str, int] = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    types = {init.name: init.data_type for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in types:
            name = onnx.TensorProto.DataType.Name(types[node.input[2]]).lower()
            counts[f"zero_point_{name}"] = counts.get(f"zero_point_{name}", 0) + 1
    return counts
