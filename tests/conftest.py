"""Shared fixtures: a tiny scorer exported once per session, and real Triton servers serving it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig, free_port


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory) -> Path:
    """A model repository holding the tiny random scorer (real export: ONNX, parity, publish)."""
    from slimserve.export.pipeline import ScorerExportConfig, export_scorer

    repository = tmp_path_factory.mktemp("repo") / "model_repository"
    export_scorer(
        ScorerExportConfig(teacher="tiny", model_repository=repository, length_buckets=(64, 192, 320)),
        command="tests: tiny export",
    )
    return repository


def start_triton(repository: Path, grpc_port: int = 0, **overrides) -> TritonServer:
    """A started real Triton serving ``scorer`` from ``repository``."""
    config = TritonServerConfig(
        model_repository=repository,
        grpc_port=grpc_port,
        model_control_mode="explicit",
        load_models=("scorer",),
        startup_timeout_s=120,
        **overrides,
    )
    return TritonServer(config).start()


@pytest.fixture(scope="session")
def tiny_triton(tiny_repository) -> TritonServer:
    """One Triton for the session's read-only tests (tests that kill Triton start their own)."""
    server = start_triton(tiny_repository)
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture
def free_tcp_port() -> int:
    return free_port()
