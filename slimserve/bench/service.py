"""A slimserve gRPC service as a child process for benchmarks, stopped afterwards: the scoring service
(``slimserve serve``) or the reasoning service (``slimserve serve-reasoning``).

A separate process, as in production: the load generator and the service do not share an interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..serving.allocator import SERVICE_ENVIRONMENT
from ..serving.triton.launcher import free_ports, read_log_tail

# The ports a stack on this host may be serving on (services, health, Triton's defaults, metrics): a
# benchmark never takes them, even while they are free, so it cannot block a ``slimserve up`` started
# meanwhile.
WELL_KNOWN_PORTS = frozenset({8000, 8001, 8002, 9090, 9091, 50051, 50052, 50061, 50062})


def free_bench_ports(count: int = 1) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago, none of ``WELL_KNOWN_PORTS``."""
    while True:
        ports = free_ports(count)
        if not WELL_KNOWN_PORTS.intersection(ports):
            return ports


def wait_serving(target: str, process: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    """Poll ``grpc.health.v1`` until SERVING; raise RuntimeError (with the log tail) on exit or timeout."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"service at {target} not serving; log {log_path}:\n{read_log_tail(log_path)}")


@contextlib.contextmanager
def scoring_service(
    bundle_dir: Path, triton_url: str, timeout_s: float = 120.0, **settings: object
) -> Iterator[str]:
    """Run ``slimserve serve`` for ``bundle_dir`` against ``triton_url``; yield its ``host:port``.

    ``settings`` are further ScoringServiceConfig fields (``triton_chunk_size=8`` -> ``--triton-chunk-size 8``).
    """
    with service_process("serve", bundle_dir, triton_url, timeout_s, **settings) as target:
        yield target


@contextlib.contextmanager
def reasoning_service(
    bundle_dir: Path, triton_url: str, timeout_s: float = 120.0, **settings: object
) -> Iterator[str]:
    """Run ``slimserve serve-reasoning`` for the generator bundle ``bundle_dir``; yield its ``host:port``."""
    with service_process("serve-reasoning", bundle_dir, triton_url, timeout_s, **settings) as target:
        yield target


@dataclass(frozen=True)
class ServiceProcess:
    """A started service child process: where it listens, the process (pid, signals) and its log."""

    target: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def service_process(
    subcommand: str, bundle_dir: Path, triton_url: str, timeout_s: float, **settings: object
) -> Iterator[str]:
    """Run ``slimserve <subcommand>`` on a free loopback port until the block ends (SIGTERM, then kill)."""
    with running_service(subcommand, bundle_dir, triton_url, timeout_s, **settings) as service:
        yield service.target


@contextlib.contextmanager
def running_service(
    subcommand: str, bundle_dir: Path, triton_url: str, timeout_s: float, **settings: object
) -> Iterator[ServiceProcess]:
    """``service_process``, yielding the process too (``slimserve bench faults`` signals it and reads its
    memory). Flags in ``settings`` come after the defaults here, so they override them."""
    (port,) = free_bench_ports()
    command = [
        sys.executable,
        "-m",
        "slimserve.cli",
        subcommand,
        "--port",
        str(port),
        "--metrics-port",
        "-1",
        "--triton-url",
        triton_url,
        "--bundle-dir",
        str(bundle_dir),
        "--log-level",
        "WARNING",
        "--health-poll-interval-s",
        "0.2",
        "--drain-grace-s",
        "2",
    ]
    for name, value in settings.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    handle, name = tempfile.mkstemp(prefix="slimserve-bench-service-", suffix=".log")
    os.close(handle)
    log_path = Path(name)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**SERVICE_ENVIRONMENT, **os.environ},  # as the service image sets it
        )
    target = f"127.0.0.1:{port}"
    try:
        wait_serving(target, process, timeout_s, log_path)
        yield ServiceProcess(target, process, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
