"""The python-backend scorer: pure helpers, its batched ONNX Runtime run, and the model in real Triton."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc
import tritonclient.utils
from onnx import TensorProto, helper, numpy_helper

from slimserve.export.repository import publish_version
from slimserve.export.scorer_model import external_data_locations, scorer_model_files, scorer_triton_spec
from slimserve.onnx_files import onnx_model_files
from slimserve.triton_models import onnx_scorer
from slimserve.triton_models.onnx_scorer import (
    RequestError,
    TritonPythonModel,
    check_pair,
    instance_count,
    intra_op_threads,
    pad_and_concat,
    split_rows,
)


def tiny_scoring_onnx(path, external_data=False):
    """score[b, 1] = sum(input_ids * attention_mask) + bias, as float."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    bias = numpy_helper.from_array(np.zeros(256, np.float32), "bias")
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes"], ["summed"], keepdims=1),
        helper.make_node("Cast", ["summed"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["bias"], ["bias_sum"], keepdims=0),
        helper.make_node("Add", ["as_float", "bias_sum"], ["score"]),
    ]
    graph = helper.make_graph(nodes, "tiny_scorer", [ids, mask], [score], initializer=[axes, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(
        model,
        str(path),
        save_as_external_data=external_data,
        location=path.name + ".data",
        size_threshold=0,
    )
    return path


def test_pad_and_concat_right_pads_to_longest():
    a = (np.array([[1, 2, 3]], np.int64), np.array([[1, 1, 1]], np.int64))
    b = (np.array([[4, 5], [6, 0]], np.int64), np.array([[1, 1], [1, 0]], np.int64))
    c = (np.array([[7, 8, 9, 10, 11]], np.int64), np.ones((1, 5), np.int64))
    ids, mask, rows = pad_and_concat([a, b, c])
    assert rows == [1, 2, 1]
    assert ids.dtype == mask.dtype == np.int64
    np.testing.assert_array_equal(ids, [[1, 2, 3, 0, 0], [4, 5, 0, 0, 0], [6, 0, 0, 0, 0], [7, 8, 9, 10, 11]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError):
        pad_and_concat([])


def test_split_rows_inverts_concat():
    scores = np.arange(6, dtype=np.float32).reshape(6, 1)
    pieces = split_rows(scores, [1, 3, 2])
    assert [p.shape for p in pieces] == [(1, 1), (3, 1), (2, 1)]
    np.testing.assert_array_equal(pieces[1], [[1], [2], [3]])
    assert len(split_rows(scores, [6])) == 1
    with pytest.raises(ValueError, match="6 rows, requests need 5"):
        split_rows(scores, [2, 3])


@pytest.mark.parametrize(
    ("ids", "mask", "message"),
    [
        (None, np.ones((1, 2), np.int64), "missing input 'input_ids'"),
        (np.ones((1, 2), np.int64), None, "missing input 'attention_mask'"),
        (np.ones((1, 2), np.int32), np.ones((1, 2), np.int64), "must be INT64, got int32"),
        (np.ones(2, np.int64), np.ones(2, np.int64), "must be \\[batch, sequence\\]"),
        (np.ones((1, 0), np.int64), np.ones((1, 0), np.int64), "is empty"),
        (np.ones((1, 3), np.int64), np.ones((1, 2), np.int64), "shape \\[1, 3\\] != 'attention_mask'"),
    ],
)
def test_check_pair_rejects_bad_requests(ids, mask, message):
    with pytest.raises(RequestError, match=message):
        check_pair(ids, mask)


def test_thread_defaults_from_config():
    two_instances = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    assert instance_count(two_instances) == 2
    assert instance_count({}) == 1
    assert intra_op_threads(two_instances, cpu_count=8) == 4
    assert intra_op_threads(two_instances, cpu_count=1) == 1
    explicit = {**two_instances, "parameters": {"intra_op_threads": {"string_value": "3"}}}
    assert intra_op_threads(explicit, cpu_count=8) == 3
    zero = {**two_instances, "parameters": {"intra_op_threads": {"string_value": "0"}}}
    assert intra_op_threads(zero, cpu_count=8) == 4


def test_one_ort_run_scores_mixed_lengths(tmp_path):
    model = TritonPythonModel()
    model.session = ort.InferenceSession(str(tiny_scoring_onnx(tmp_path / "model.onnx")))
    model.feed_names = ["attention_mask", "input_ids"]
    runs = []
    real_run = model.session.run

    class CountingSession:
        def run(self, outputs, feed):
            runs.append({k: v.shape for k, v in feed.items()})
            return real_run(outputs, feed)

    model.session = CountingSession()
    pairs = [
        (np.array([[1, 2, 3]], np.int64), np.array([[1, 1, 0]], np.int64)),
        (np.array([[10, 20], [5, 5]], np.int64), np.ones((2, 2), np.int64)),
    ]
    results = model._score(pairs)
    assert runs == [{"input_ids": (3, 3), "attention_mask": (3, 3)}]
    (s1, ms1), (s2, ms2) = results
    np.testing.assert_array_equal(s1, [[3.0]])
    np.testing.assert_array_equal(s2, [[30.0], [10.0]])
    assert s1.dtype == ms1.dtype == np.float32
    assert ms1.shape == (1, 1) and ms2.shape == (2, 1)
    assert ms1[0, 0] == ms2[0, 0] == ms2[1, 0] >= 0.0


def test_module_imports_without_triton():
    assert onnx_scorer.pb_utils is None
    source = Path(onnx_scorer.__file__).read_text()
    assert "slimserve" not in "".join(
        line for line in source.splitlines() if line.startswith(("import ", "from "))
    )


def test_onnx_model_files_lists_the_external_data_a_graph_names(tmp_path):
    (tmp_path / "alone").mkdir()
    alone = tiny_scoring_onnx(tmp_path / "alone" / "model.onnx")
    assert onnx_model_files(alone) == [alone]
    (tmp_path / "beside").mkdir()
    external = tiny_scoring_onnx(tmp_path / "beside" / "model.onnx", external_data=True)
    (tmp_path / "beside" / "notes.txt").write_text("not part of the graph")
    assert onnx_model_files(external) == [external, tmp_path / "beside" / "model.onnx.data"]


def test_scorer_model_files(tmp_path):
    plain = tiny_scoring_onnx(tmp_path / "plain.onnx")
    assert external_data_locations(plain) == []
    files = scorer_model_files(plain)
    assert set(files) == {"model.py", "model.onnx"}
    assert files["model.py"] == Path(onnx_scorer.__file__)
    external_dir = tmp_path / "ext"
    external_dir.mkdir()
    external = tiny_scoring_onnx(external_dir / "model.onnx", external_data=True)
    files = scorer_model_files(external)
    assert files == {
        "model.py": files["model.py"],
        "model.onnx": external,
        "model.onnx.data": external_dir / "model.onnx.data",
    }
    assert files["model.onnx.data"].is_file()


# --- the real Triton server (the binary from the nvidia-pytriton wheel), no launcher involved ---------


def _triton_paths():
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).parent / "tritonserver"
    stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    paths = (root / "bin" / "tritonserver", root / "backends" / "python", stub / "triton_python_backend_stub")
    return paths if all(p.exists() for p in paths) else None


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def triton_scorer(tmp_path):
    paths = _triton_paths()
    if paths is None:
        pytest.skip(
            "tritonserver binary or python-backend stub not found (pip install nvidia-pytriton==0.7.0)"
        )
    binary, backend_src, stub = paths
    backend = tmp_path / "backends" / "python"
    backend.mkdir(parents=True)
    for source in (*backend_src.iterdir(), stub):
        if source.is_file():
            (backend / source.name).symlink_to(source)
    onnx_path = tiny_scoring_onnx(tmp_path / "model.onnx", external_data=True)
    spec = scorer_triton_spec("scorer", 8, (8, 16), 2000, 64, 0, 2, None, {})
    published = publish_version(
        tmp_path / "repo", spec, scorer_model_files(onnx_path), None, None, "# tiny\n"
    )
    http, grpc_port, metrics = _free_ports(3)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(tmp_path / "triton.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [
            str(binary),
            f"--model-repository={tmp_path / 'repo'}",
            f"--backend-directory={tmp_path / 'backends'}",
            "--pinned-memory-pool-byte-size=0",
            "--allow-gpu-metrics=false",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--http-port={http}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    client = tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_model_ready("scorer"):
                    break
            except Exception:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "Triton did not load the scorer:\n" + (tmp_path / "triton.log").read_text()[-3000:]
                )
            time.sleep(0.2)
        yield client, published, tmp_path / "triton.log"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _infer(client, ids, mask=None):
    ids = np.asarray(ids, np.int64)
    mask = np.ones_like(ids) if mask is None else np.asarray(mask, np.int64)
    inputs = []
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        tensor = tritonclient.grpc.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer("scorer", inputs)
    return result.as_numpy("score"), result.as_numpy("compute_ms")


def test_scorer_in_real_triton(triton_scorer):
    client, published, log = triton_scorer
    config = client.get_model_config("scorer").config
    assert config.parameters["slimserve_bundle_hash"].string_value == published.content_hash
    score, compute_ms = _infer(client, [[1, 2], [3, 4]], [[1, 0], [1, 1]])
    np.testing.assert_array_equal(score, [[1.0], [7.0]])
    assert compute_ms.shape == (2, 1) and compute_ms.dtype == np.float32
    assert compute_ms[0, 0] == compute_ms[1, 0] > 0
    # Concurrent requests of mixed lengths, one of them malformed: only that one fails.
    requests = [([list(range(1, n + 1))], None) for n in (3, 5, 7, 9)] * 6 + [([[1, 2, 3]], [[1, 1]])]

    def call(request):
        try:
            return _infer(client, *request)[0].tolist()
        except tritonclient.utils.InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(call, requests))
    assert results[:4] == [[[6.0]], [[15.0]], [[28.0]], [[45.0]]]
    assert all(not isinstance(r, Exception) for r in results[:-1])
    error = results[-1]
    assert isinstance(error, tritonclient.utils.InferenceServerException)
    assert "INVALID_ARGUMENT" in str(error.status()) and "attention_mask" in error.message()
    assert "intra_op_threads=" in log.read_text()
