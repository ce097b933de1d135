"""Triton python-backend model: the CPU scorer, running the ONNX scoring graph in ONNX Runtime.

Copied by the export as ``<repo>/<model>/<version>/model.py``. Self-contained on purpose: it runs in
Triton's python stub, possibly where slimserve is not installed, so it imports only numpy, onnxruntime
and the standard library (plus ``triton_python_backend_utils``, which exists only inside Triton; the
batching helpers below are pure functions that import and test without it).

Each ``execute`` call runs ALL its requests as one ONNX Runtime batch: requests of different sequence
lengths are right-padded (token 0, mask 0) to the longest, concatenated, scored once, and split back.
Outputs per request: ``score`` [n, 1] FP32 and ``compute_ms`` [n, 1] FP32 (wall time of the batch's ORT
run, the same on every row). A request with bad inputs gets an error response of its own.
"""

import json
import os
import time

import numpy as np

try:  # Only inside Triton's python stub.
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - exercised outside Triton (unit tests)
    pb_utils = None

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
SCORE = "score"
COMPUTE_MS = "compute_ms"
DEFAULT_ONNX_FILE = "model.onnx"


class RequestError(ValueError):
    """A request's inputs are unusable; only that request fails."""


def config_parameter(model_config, key, default=None):
    """A string parameter from a Triton model config (JSON form), or ``default`` when absent/empty."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value != "" else default


def instance_count(model_config):
    """Total instance count over the config's instance groups (1 when none are declared)."""
    groups = model_config.get("instance_group") or []
    total = sum(int(group.get("count", 1) or 1) for group in groups)
    return max(total, 1)


def intra_op_threads(model_config, cpu_count=None):
    """ORT intra-op threads: parameter ``intra_op_threads``, else the CPUs shared among the instances."""
    configured = config_parameter(model_config, "intra_op_threads")
    if configured is not None and int(configured) > 0:
        return int(configured)
    cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, cpus // instance_count(model_config))


def check_pair(input_ids, attention_mask):
    """Check one request's tensors; raise ``RequestError`` naming the problem."""
    if input_ids is None or attention_mask is None:
        missing = INPUT_IDS if input_ids is None else ATTENTION_MASK
        raise RequestError(f"missing input {missing!r}")
    for name, array in ((INPUT_IDS, input_ids), (ATTENTION_MASK, attention_mask)):
        if array.dtype != np.int64:
            raise RequestError(f"input {name!r} must be INT64, got {array.dtype}")
        if array.ndim != 2:
            raise RequestError(f"input {name!r} must be [batch, sequence], got shape {list(array.shape)}")
        if array.shape[0] < 1 or array.shape[1] < 1:
            raise RequestError(f"input {name!r} is empty: shape {list(array.shape)}")
    if input_ids.shape != attention_mask.shape:
        raise RequestError(
            f"{INPUT_IDS!r} shape {list(input_ids.shape)} != {ATTENTION_MASK!r} shape "
            f"{list(attention_mask.shape)}"
        )


def pad_and_concat(pairs):
    """Right-pad each (input_ids, attention_mask) pair to the longest sequence and stack them.

    Returns (input_ids [N, L], attention_mask [N, L], rows per pair). Padding is token 0, mask 0.
    """
    if not pairs:
        raise ValueError("no requests to batch")
    length = max(ids.shape[1] for ids, _ in pairs)
    rows = [ids.shape[0] for ids, _ in pairs]
    total = sum(rows)
    input_ids = np.zeros((total, length), dtype=np.int64)
    attention_mask = np.zeros((total, length), dtype=np.int64)
    start = 0
    for (ids, mask), count in zip(pairs, rows, strict=True):
        input_ids[start : start + count, : ids.shape[1]] = ids
        attention_mask[start : start + count, : mask.shape[1]] = mask
        start += count
    return input_ids, attention_mask, rows


def split_rows(array, rows):
    """Split a batch-major array back into per-request pieces of ``rows`` rows each."""
    if sum(rows) != array.shape[0]:
        raise ValueError(f"batch has {array.shape[0]} rows, requests need {sum(rows)}")
    offsets = np.cumsum(rows)[:-1]
    return np.split(array, offsets)


def as_scores(output, batch):
    """The graph's score output as FP32 [batch, 1]."""
    scores = np.asarray(output, dtype=np.float32)
    if scores.size != batch:
        raise ValueError(f"score output has shape {list(scores.shape)}, expected {batch} values")
    return scores.reshape(batch, 1)


class TritonPythonModel:
    """Triton python-backend entry point."""

    def initialize(self, args):
        import onnxruntime as ort

        model_config = json.loads(args["model_config"])
        onnx_file = config_parameter(model_config, "onnx_file", DEFAULT_ONNX_FILE)
        path = os.path.join(args["model_repository"], str(args["model_version"]), onnx_file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"ONNX graph not found: {path}")
        threads = intra_op_threads(model_config)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning worker threads burn the cores the service and Triton share on a small CPU host;
        # parameter allow_spinning "1" turns it back on for a dedicated machine.
        spinning = config_parameter(model_config, "allow_spinning", "0")
        options.add_session_config_entry("session.intra_op.allow_spinning", str(spinning))
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        graph_inputs = {i.name for i in self.session.get_inputs()}
        unknown = graph_inputs - {INPUT_IDS, ATTENTION_MASK}
        if unknown:
            raise ValueError(f"{path}: graph needs inputs {sorted(unknown)} this model does not provide")
        self.feed_names = sorted(graph_inputs)
        pb_utils.Logger.log_info(
            f"onnx_scorer {args.get('model_name', '')} v{args['model_version']} instance "
            f"{args.get('model_instance_name', '')}: {path}, intra_op_threads={threads}, inter_op_threads=1, allow_spinning={spinning}"
        )

    def _run(self, input_ids, attention_mask):
        feed = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
        start = time.perf_counter()
        (output,) = self.session.run([SCORE], {name: feed[name] for name in self.feed_names})
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        return as_scores(output, input_ids.shape[0]), elapsed_ms

    def _score(self, pairs):
        """Score pairs in one ORT run; return per-pair (scores, compute_ms) arrays."""
        input_ids, attention_mask, rows = pad_and_concat(pairs)
        scores, elapsed_ms = self._run(input_ids, attention_mask)
        return [
            (piece, np.full((piece.shape[0], 1), elapsed_ms, dtype=np.float32))
            for piece in split_rows(scores, rows)
        ]

    def execute(self, requests):
        responses = [None] * len(requests)
        pending = []  # (request index, (input_ids, attention_mask))
        for index, request in enumerate(requests):
            try:
                pair = _read_pair(request)
                check_pair(*pair)
            except RequestError as exc:
                responses[index] = _error_response(str(exc), invalid_argument=True)
                continue
            pending.append((index, pair))
        if pending:
            try:
                results = self._score([pair for _, pair in pending])
            except Exception as exc:
                # One bad request (say a token id outside the vocabulary) must not fail the rest.
                alone = len(pending) == 1
                results = [exc] if alone else [self._score_alone(pair) for _, pair in pending]
            for (index, _), result in zip(pending, results, strict=True):
                responses[index] = _response(result)
        return responses

    def _score_alone(self, pair):
        try:
            return self._score([pair])[0]
        except Exception as exc:
            return exc

    def finalize(self):
        self.session = None


def _read_pair(request):
    tensors = []
    for name in (INPUT_IDS, ATTENTION_MASK):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        tensors.append(None if tensor is None else tensor.as_numpy())
    return tuple(tensors)


def _response(result):
    if isinstance(result, Exception):
        return _error_response(f"scoring failed: {type(result).__name__}: {result}", invalid_argument=False)
    scores, compute_ms = result
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(SCORE, scores), pb_utils.Tensor(COMPUTE_MS, compute_ms)]
    )


def _error_response(message, invalid_argument):
    code_name = "INVALID_ARG" if invalid_argument else "INTERNAL"
    code = getattr(pb_utils.TritonError, code_name, None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
