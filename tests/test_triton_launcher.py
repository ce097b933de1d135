"""The Triton launcher against the real tritonserver binary: find, prepare, start, fail, stop."""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from triton_fixtures import (
    SCORER,
    parent_pid,
    stub_pids,
    stub_processes,
    write_broken_model,
    write_scorer_model,
)

from slimserve.serving.errors import Unavailable
from slimserve.serving.triton.client import TritonScorerClient
from slimserve.serving.triton.launcher import (
    TritonLaunchError,
    TritonServer,
    TritonServerConfig,
    _resolve_ports,
    find_tritonserver,
    group_members,
    prepare_python_backend,
)
from slimserve.serving.triton.server_files import STUB_NAME


def test_find_tritonserver_is_an_executable_triton_251():
    binary = find_tritonserver()
    assert binary.is_file() and os.access(binary, os.X_OK)
    # Triton prints its version in the usage text of an unknown flag (it has no --version).
    run = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    assert "--model-repository" in run.stdout + run.stderr


def test_prepare_python_backend_is_idempotent_and_safe_concurrently(tmp_path: Path):
    with ThreadPoolExecutor(8) as pool:
        results = set(pool.map(lambda _: prepare_python_backend(tmp_path), range(16)))
    assert len(results) == 1
    backend = results.pop()
    assert backend.name.startswith("py3.") and backend.parent.name == "triton-backends"
    files = sorted(p.name for p in (backend / "python").iterdir())
    assert files == sorted(["libtriton_python.so", "triton_python_backend_utils.py", STUB_NAME])
    assert all((backend / "python" / name).resolve().is_file() for name in files)
    assert prepare_python_backend(tmp_path) == backend
    assert [p.name for p in backend.parent.iterdir()] == [backend.name]  # no staging folders left


def test_prepare_python_backend_replaces_a_stale_folder(tmp_path: Path):
    backend = prepare_python_backend(tmp_path)
    stub = backend / "python" / STUB_NAME
    stub.unlink()
    stub.symlink_to(tmp_path / "gone")
    assert prepare_python_backend(tmp_path) == backend
    assert stub.resolve().is_file()


def test_free_ports_are_distinct_and_given_ports_kept():
    # One after the other, the OS may hand out the same free port twice; Triton then refuses to start
    # ("cannot listen to GRPC requests and metrics requests at the same address and port").
    for _ in range(500):
        ports = _resolve_ports({"grpc": 0, "http": 0, "metrics": 0}, "127.0.0.1")
        assert len(set(ports.values())) == 3
    assert _resolve_ports({"grpc": 8001, "http": 0, "metrics": 0}, "127.0.0.1")["grpc"] == 8001


def test_free_picks_leave_out_the_ports_to_avoid():
    """Every even port avoided: without the filter, 8 picks all odd would happen 1 time in 256."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    avoid = set(range(low + low % 2, high + 1, 2))
    for _ in range(5):
        ports = _resolve_ports({"grpc": 0, "http": 0, "metrics": 0, "other": 0}, "127.0.0.1", avoid)
        assert not set(ports.values()) & avoid and len(set(ports.values())) == 4


def test_up_keeps_triton_s_free_picks_off_its_services_ports():
    from slimserve.up_config import UpConfig

    config = UpConfig(port=50051, metrics_port=0, reasoning_port=50052, reasoning_metrics_port=-1)
    assert config.triton_config(("scorer",)).avoid_ports == (50051, 50052)


def test_start_waits_for_metrics_too_unless_metrics_are_off(tmp_path: Path):
    """Triton opens metrics after HTTP: ``start`` must not return before a scrape could connect."""
    ports = {"grpc": 1, "http": 2, "metrics": 3}
    server = TritonServer(TritonServerConfig(model_repository=tmp_path, load_models=("scorer",)))
    server._ports = ports
    assert server._ready_urls() == [
        "http://127.0.0.1:2/v2/health/ready",
        "http://127.0.0.1:2/v2/models/scorer/ready",
        "http://127.0.0.1:3/metrics",
    ]
    off = TritonServer(TritonServerConfig(model_repository=tmp_path, extra_args=("--allow-metrics=false",)))
    off._ports = ports
    assert off._ready_urls() == ["http://127.0.0.1:2/v2/health/ready"]


def test_missing_binary_raises_launch_error(tmp_path: Path):
    config = TritonServerConfig(model_repository=tmp_path, binary=tmp_path / "no-tritonserver")
    with pytest.raises(TritonLaunchError, match="no-tritonserver"):
        TritonServer(config).start()


def test_early_exit_raises_with_log_tail(tmp_path: Path):
    log_file = tmp_path / "triton.log"
    (tmp_path / "repo").mkdir()
    config = TritonServerConfig(
        model_repository=tmp_path / "repo",
        extra_args=("--no-such-flag",),
        cache_dir=tmp_path,
        log_file=log_file,
    )
    with pytest.raises(TritonLaunchError, match="exited with code 1") as info:
        TritonServer(config).start()
    assert str(log_file) in str(info.value)
    assert "Default is" in str(info.value)  # the end of Triton's usage text: the log tail
    assert "unrecognized option '--no-such-flag'" in log_file.read_text()


def test_taken_port_fails_with_the_reason(tmp_path: Path):
    (tmp_path / "repo").mkdir()  # empty: Triton starts with no models
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = TritonServerConfig(
            model_repository=tmp_path / "repo",
            grpc_port=taken.getsockname()[1],
            cache_dir=tmp_path,
            log_file=tmp_path / "triton.log",
        )
        with pytest.raises(TritonLaunchError, match="already in use"):
            TritonServer(config).start()


def test_broken_model_in_explicit_mode_fails_with_its_error_in_the_message(tmp_path: Path):
    repository = tmp_path / "repo"
    write_broken_model(repository, "broken")
    config = TritonServerConfig(
        model_repository=repository,
        model_control_mode="explicit",
        load_models=("broken",),
        cache_dir=tmp_path,
        log_file=tmp_path / "triton.log",
        startup_timeout_s=60,
    )
    server = TritonServer(config)
    with pytest.raises(TritonLaunchError) as info:
        server.start()
    assert "BROKEN-MODEL-SENTINEL" in str(info.value)
    assert str(server.log_path) in str(info.value)
    assert not server.is_running()


def test_readiness_timeout_includes_log_tail_and_leaves_no_stub(tmp_path: Path):
    repository = tmp_path / "repo"
    model_dir = repository / "slow"
    write_broken_model(repository, "slow")
    (model_dir / "1" / "model.py").write_text(
        textwrap.dedent(
            """
            import time

            class TritonPythonModel:
                def initialize(self, args):
                    time.sleep(120)

                def execute(self, requests):
                    return []
            """
        )
    )
    config = TritonServerConfig(
        model_repository=repository,
        cache_dir=tmp_path,
        log_file=tmp_path / "triton.log",
        startup_timeout_s=3,
        exit_timeout_s=1,
        stop_grace_s=2,
    )
    server = TritonServer(config)
    start = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(server.start)
        stubs: dict[int, list[str]] = {}
        while not stubs and not starting.done():
            stubs = stub_processes(repository)
            time.sleep(0.05)
        with pytest.raises(TritonLaunchError, match="not ready after 3 s") as info:
            starting.result()
    assert time.monotonic() - start < 15
    assert stubs, "the slow model's stub was started"
    assert "slow" in str(info.value)  # the log tail names the model being loaded
    assert not stub_processes(repository)
    # The server was killed while loading, so it could not unlink its stub's shared memory: stop() did.
    assert not any((Path("/dev/shm") / argv[2]).exists() for argv in stubs.values())


async def test_start_serve_stop_leaves_no_orphans_and_client_sees_unavailable(tmp_path: Path):
    repository = tmp_path / "repo"
    write_scorer_model(repository, SCORER)
    config = TritonServerConfig(
        model_repository=repository, cache_dir=tmp_path, exit_timeout_s=5, log_file=tmp_path / "triton.log"
    )
    server = TritonServer(config).start()
    client = TritonScorerClient(server.grpc_url, model_name=SCORER)
    try:
        pid = server.pid
        assert server.is_running() and server.grpc_url.startswith("127.0.0.1:")
        with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
            assert b"nv_inference" in response.read()
        stubs = stub_pids(repository)
        assert stubs and all(parent_pid(p) == pid for p in stubs), "the python model runs in a stub process"
        assert set(stubs) <= set(group_members(pid))  # so stopping the group reaches it
        ids = np.ones((2, 4), np.int64)
        assert (await client.infer_scores(ids, ids)).scores.tolist() == [4.0, 4.0]
    finally:
        server.stop()
    assert not server.is_running()
    assert not Path(f"/proc/{pid}").exists()
    assert not group_members(pid)
    assert not stub_pids(repository)
    assert "successfully unloaded" in server.log_path.read_text()  # a clean shutdown, not a SIGKILL
    # The client's channel was connected: a stopped server must fail fast, not hang.
    start = time.monotonic()
    with pytest.raises(Unavailable):
        await client.infer_scores(ids, ids, timeout_s=10)
    assert await client.model_ready() is False
    assert time.monotonic() - start < 3
    await client.close()
