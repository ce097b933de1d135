"""Fixtures and helpers for tests against the real tritonserver binary (no fake Triton anywhere).

Use the fixtures by importing their functions (``*_fixture``; pytest registers them by ``name``).

The test model is a real python-backend model written into a temporary repository: ``score`` is the sum
of each row's attention mask, ``compute_ms`` the batch's execute time. A negative first token id
``-N`` makes the request sleep ``N`` ms, checking for cancellation; it leaves marker files
``<model dir>/markers/started-<request id>`` and, when cancelled, ``cancelled-<request id>``. Its config is hand-typed here on purpose: this
fixture must not depend on the generated-config writer it may be used to test.

Measured on Triton 2.51: a request's ``timeout`` only *shortens* a non-zero
``default_timeout_microseconds`` (with ``allow_timeout_override``); with the default 0 it is ignored.
Expired requests are rejected lazily, when the batcher next looks at the queue.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path

import pytest

from slimserve.bundle import BUNDLE_HASH_PARAMETER
from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig
from slimserve.serving.triton.server_files import STUB_NAME

TEST_BUNDLE_HASH = "test-bundle-hash"
SCORER = "scorer"  # unbounded queue
SMALL_QUEUE_SCORER = "scorer_q2"  # max_queue_size 2: for queue-full, deadline and cancellation tests

MODEL_PY = textwrap.dedent(
    """
    import os
    import time

    import numpy as np
    import tokenizers  # noqa: F401  (only in the venv: proves the stub's Python sees the venv)
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.marker_dir = os.path.join(args["model_repository"], "markers")
            os.makedirs(self.marker_dir, exist_ok=True)

        def _mark(self, request, event):
            name = f"{event}-{request.request_id() or 'unnamed'}"
            open(os.path.join(self.marker_dir, name), "w").close()

        def _sleep(self, request, milliseconds):
            self._mark(request, "started")
            end = time.perf_counter() + milliseconds / 1000
            while time.perf_counter() < end:
                if request.is_cancelled():
                    self._mark(request, "cancelled")
                    return False
                time.sleep(0.01)
            return True

        def execute(self, requests):
            start = time.perf_counter()
            time.sleep(0.005)
            results = []
            for request in requests:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
                mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
                if ids.size and ids[0, 0] < 0 and not self._sleep(request, -int(ids[0, 0])):
                    results.append(None)
                    continue
                results.append(mask.sum(axis=1, keepdims=True).astype(np.float32))
            compute_ms = np.float32((time.perf_counter() - start) * 1000)
            responses = []
            for score in results:
                if score is None:
                    error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                outputs = [
                    pb_utils.Tensor("score", score),
                    pb_utils.Tensor("compute_ms", np.full_like(score, compute_ms)),
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
    """
)

CONFIG_PBTXT = """\
backend: "python"
max_batch_size: 64
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [
  {{ name: "score" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "compute_ms" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  max_queue_delay_microseconds: 20000
  default_queue_policy {{
    max_queue_size: {max_queue_size}
    default_timeout_microseconds: 60000000
    allow_timeout_override: true
  }}
}}
parameters {{ key: "{hash_key}" value: {{ string_value: "{bundle_hash}" }} }}
"""

BROKEN_MODEL_PY = textwrap.dedent(
    """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("BROKEN-MODEL-SENTINEL: this model refuses to load")

        def execute(self, requests):
            return []
    """
)


def write_scorer_model(repository: Path, name: str, *, max_queue_size: int = 0) -> Path:
    """Write the test scorer as ``<repository>/<name>/1/model.py`` with its config; returns the model dir."""
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    (model_dir / "config.pbtxt").write_text(
        CONFIG_PBTXT.format(
            max_queue_size=max_queue_size, hash_key=BUNDLE_HASH_PARAMETER, bundle_hash=TEST_BUNDLE_HASH
        )
    )
    return model_dir


def write_broken_model(repository: Path, name: str = "broken") -> Path:
    """A python model whose ``initialize`` raises (for launch-failure tests)."""
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(BROKEN_MODEL_PY)
    (model_dir / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    return model_dir


def marker(repository: Path, model: str, event: str, request_id: str) -> Path:
    """Path of a marker file the test model writes (``event``: started or cancelled)."""
    return repository / model / "markers" / f"{event}-{request_id}"


async def wait_for_file(path: Path, timeout_s: float = 10.0) -> None:
    """Wait until ``path`` exists; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        await asyncio.sleep(0.02)


def stub_processes(under: Path | None = None) -> dict[int, list[str]]:
    """Live ``triton_python_backend_stub`` processes (pid -> argv) from /proc; with ``under``, only those
    serving a model file inside that folder (other servers may run on the same machine)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0")]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if not argv[0].endswith(STUB_NAME) or state == "Z" or len(argv) < 3:
            continue
        if under is None or argv[1].startswith(str(under)):
            found[int(entry.name)] = argv
    return found


def stub_pids(under: Path | None = None) -> list[int]:
    """Pids of live python-backend stubs (see ``stub_processes``)."""
    return list(stub_processes(under))


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module", name="triton_cache")
def triton_cache_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slimserve-cache")


@pytest.fixture(scope="module", name="scorer_repository")
def scorer_repository_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("model_repository")
    write_scorer_model(repository, SCORER)
    write_scorer_model(repository, SMALL_QUEUE_SCORER, max_queue_size=2)
    return repository


@pytest.fixture(scope="module", name="triton_server")
def triton_server_fixture(
    scorer_repository: Path, triton_cache: Path, tmp_path_factory: pytest.TempPathFactory
):
    """One real Triton serving the test scorers, for the whole test module."""
    config = TritonServerConfig(
        model_repository=scorer_repository,
        cache_dir=triton_cache,
        log_file=tmp_path_factory.mktemp("triton-log") / "tritonserver.log",
        exit_timeout_s=5,
        startup_timeout_s=60,
    )
    with TritonServer(config) as server:
        yield server
