"""Triton python-backend model: the CPU scorer, running the ONNX scoring graph in ONNX Runtime.

Copied by the export as ``<repo>/<model>/<version>/model.py``. Self-contained on purpose: it runs in
Triton's python stub, possibly where slimserve is not installed, so it imports only numpy, onnxruntime
and the standard library (plus ``triton_python_backend_utils``, which exists only inside Triton; the
batching helpers below are pure functions that import and test without it).

It serves either scoring graph, told apart by the graph's inputs:

- single-sequence (``input_ids``, ``attention_mask`` [n, seq]): each ``execute`` runs ALL its requests
  as one ONNX Runtime batch: requests of different sequence lengths are right-padded (token 0, mask 0)
  to the longest, concatenated, scored once, and split back. Outputs per request: ``score`` [n, 1].
- multi-item (``prefix_ids``, ``prefix_mask`` [m, P], ``item_ids``, ``item_mask`` [m, N, L]: m members,
  each a prefix and its items): requests of one ``execute`` with the same item length are stacked into
  one run (prefixes and item lists padded, masks 0), the rest run per item length. Outputs per request:
  ``score`` [m, N].

Both add ``compute_ms`` [rows, 1] FP32 (wall time of the ORT run the request was part of). A request with
bad inputs gets an error response of its own; a run that fails is retried request by request, so one bad
request (say a token id outside the vocabulary) does not fail the others.
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
PREFIX_IDS = "prefix_ids"
PREFIX_MASK = "prefix_mask"
ITEM_IDS = "item_ids"
ITEM_MASK = "item_mask"
SINGLE_INPUTS = (INPUT_IDS, ATTENTION_MASK)
MULTI_ITEM_INPUTS = (PREFIX_IDS, PREFIX_MASK, ITEM_IDS, ITEM_MASK)
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


def check_multi_item(tensors):
    """Check one multi-item request's tensors (a tuple in ``MULTI_ITEM_INPUTS`` order)."""
    for name, array in zip(MULTI_ITEM_INPUTS, tensors, strict=True):
        if array is None:
            raise RequestError(f"missing input {name!r}")
        if array.dtype != np.int64:
            raise RequestError(f"input {name!r} must be INT64, got {array.dtype}")
    prefix_ids, prefix_mask, item_ids, item_mask = tensors
    if prefix_ids.ndim != 2 or prefix_ids.shape[1] < 1:
        raise RequestError(f"input {PREFIX_IDS!r} must be [members, prefix], got {list(prefix_ids.shape)}")
    if item_ids.ndim != 3 or min(item_ids.shape) < 1:
        raise RequestError(f"input {ITEM_IDS!r} must be [members, items, length], got {list(item_ids.shape)}")
    for ids_name, mask_name, ids, mask in (
        (PREFIX_IDS, PREFIX_MASK, prefix_ids, prefix_mask),
        (ITEM_IDS, ITEM_MASK, item_ids, item_mask),
    ):
        if ids.shape != mask.shape:
            raise RequestError(
                f"{ids_name!r} shape {list(ids.shape)} != {mask_name!r} shape {list(mask.shape)}"
            )
    if prefix_ids.shape[0] != item_ids.shape[0]:
        raise RequestError(
            f"{PREFIX_IDS!r} has {prefix_ids.shape[0]} members, {ITEM_IDS!r} has {item_ids.shape[0]}"
        )


def stack_multi_item(requests):
    """Stack multi-item requests into one run: prefixes padded to the longest, item lists to the most
    items and the longest item (token 0, mask 0). Returns (the four arrays, members per request,
    items per request)."""
    if not requests:
        raise ValueError("no requests to batch")
    members = [r[0].shape[0] for r in requests]
    items = [r[2].shape[1] for r in requests]
    plen = max(r[0].shape[1] for r in requests)
    count, length = max(items), max(r[2].shape[2] for r in requests)
    total = sum(members)
    prefix_ids = np.zeros((total, plen), dtype=np.int64)
    prefix_mask = np.zeros((total, plen), dtype=np.int64)
    item_ids = np.zeros((total, count, length), dtype=np.int64)
    item_mask = np.zeros((total, count, length), dtype=np.int64)
    start = 0
    for (p_ids, p_mask, i_ids, i_mask), rows in zip(requests, members, strict=True):
        end = start + rows
        prefix_ids[start:end, : p_ids.shape[1]] = p_ids
        prefix_mask[start:end, : p_mask.shape[1]] = p_mask
        item_ids[start:end, : i_ids.shape[1], : i_ids.shape[2]] = i_ids
        item_mask[start:end, : i_mask.shape[1], : i_mask.shape[2]] = i_mask
        start = end
    return (prefix_ids, prefix_mask, item_ids, item_mask), members, items


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

    multi_item = False  # set by ``initialize`` from the graph's inputs

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
        self.multi_item = graph_inputs == set(MULTI_ITEM_INPUTS)
        unknown = graph_inputs - set(SINGLE_INPUTS)
        if unknown and not self.multi_item:
            raise ValueError(f"{path}: graph needs inputs {sorted(unknown)} this model does not provide")
        self.feed_names = sorted(graph_inputs)
        pb_utils.Logger.log_info(
            f"onnx_scorer {args.get('model_name', '')} v{args['model_version']} instance "
            f"{args.get('model_instance_name', '')}: {path}, "
            f"{'multi-item' if self.multi_item else 'single-sequence'} graph, "
            f"intra_op_threads={threads}, inter_op_threads=1, allow_spinning={spinning}"
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

    def _score_multi_item(self, requests):
        """Score stacked multi-item requests in one ORT run; per-request (scores, compute_ms)."""
        arrays, members, items = stack_multi_item(requests)
        feed = dict(zip(MULTI_ITEM_INPUTS, arrays, strict=True))
        start = time.perf_counter()
        (output,) = self.session.run([SCORE], {name: feed[name] for name in self.feed_names})
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        scores = np.asarray(output, dtype=np.float32).reshape(sum(members), -1)
        results = []
        for piece, count in zip(split_rows(scores, members), items, strict=True):
            results.append((piece[:, :count], np.full((piece.shape[0], 1), elapsed_ms, dtype=np.float32)))
        return results

    def execute(self, requests):
        names, check, score = (
            (MULTI_ITEM_INPUTS, check_multi_item, self._score_multi_item)
            if self.multi_item
            else (SINGLE_INPUTS, lambda t: check_pair(*t), self._score)
        )
        responses = [None] * len(requests)
        groups = {}  # run key -> [(request index, tensors)]
        for index, request in enumerate(requests):
            try:
                tensors = _read_inputs(request, names)
                check(tensors)
            except RequestError as exc:
                responses[index] = _error_response(str(exc), invalid_argument=True)
                continue
            # Multi-item requests of one item length share a run; single-sequence ones all do.
            key = tensors[2].shape[2] if self.multi_item else 0
            groups.setdefault(key, []).append((index, tensors))
        for pending in groups.values():
            for (index, _), result in zip(pending, _score_group(score, pending), strict=True):
                responses[index] = _response(result)
        return responses

    def finalize(self):
        self.session = None


def _score_group(score, pending):
    """Results of one run over ``pending`` [(index, tensors)]; when the run fails, each request alone
    (one bad request, say a token id outside the vocabulary, must not fail the rest)."""
    try:
        return score([tensors for _, tensors in pending])
    except Exception as exc:
        if len(pending) == 1:
            return [exc]
    results = []
    for _, tensors in pending:
        try:
            results.append(score([tensors])[0])
        except Exception as exc:
            results.append(exc)
    return results


def _read_inputs(request, names):
    tensors = []
    for name in names:
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
