"""Shared fixtures: a tiny scorer exported once per session, real Triton servers serving it, the tiny
generator repository and the packaged teacher, each made once per session.

A session fixture is made once only where it is defined here: imported into several test modules, pytest
registers it once per module and builds it in each."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig, free_port


def export_tiny(repository: Path, **overrides) -> Path:
    """Export the tiny random scorer into ``repository`` (real export: ONNX, parity, publish)."""
    from slimserve.export.pipeline import ScorerExportConfig, export_scorer

    settings = {"length_buckets": (64, 192, 320), "prefix_max_tokens": 192, **overrides}
    export_scorer(
        ScorerExportConfig(teacher="tiny", model_repository=repository, **settings),
        command="tests: tiny export",
    )
    return repository


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory) -> Path:
    """A model repository holding the tiny random single-sequence scorer."""
    return export_tiny(tmp_path_factory.mktemp("repo") / "model_repository", scoring_mode="single")


@pytest.fixture(scope="session")
def tiny_multi_item_repository(tmp_path_factory) -> Path:
    """The tiny random scorer as a multi-item model (at most 4 candidates per Triton request, so a
    10-candidate call is split into 3 requests)."""
    return export_tiny(tmp_path_factory.mktemp("repo") / "model_repository", max_items_per_request=4)


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
def generator_repository(tmp_path_factory) -> Path:
    """A model repository holding the tiny random generator (4 slots, queue of 8): the real export; read
    only (tests that publish into a repository copy it)."""
    from slimserve.export.generator_repository import build_tiny_generator_repository

    repository = tmp_path_factory.mktemp("generator") / "model_repository"
    build_tiny_generator_repository(repository, max_active_sequences=4, max_queued_requests=8)
    return repository


@pytest.fixture(scope="session")
def packaged_teacher():
    """The packaged SmolLM2 teacher, ``load_teacher("default")`` (the GGUF de-quantized: about 30 s on
    2 cores), loaded once for the slow tests that all read it; no test may change its weights."""
    from slimserve.models.teacher import load_teacher

    return load_teacher("default")


PACKAGED_HEAD_LAYERS = 6


@pytest.fixture(scope="session")
def packaged_teacher_head(packaged_teacher):
    """The packaged teacher cut to its bottom ``PACKAGED_HEAD_LAYERS`` of 30 decoder layers: its real
    weights, tokenizer, grouped-query attention and tied head, so an export of it converts every operator
    the full depth has, in a fraction of the time (the depth only repeats them)."""
    import copy

    from slimserve.models.teacher import LoadedModel

    model = copy.deepcopy(packaged_teacher.model)
    model.model.layers = model.model.layers[:PACKAGED_HEAD_LAYERS]
    model.config.num_hidden_layers = PACKAGED_HEAD_LAYERS
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:PACKAGED_HEAD_LAYERS]
    return LoadedModel(model.eval(), packaged_teacher.tokenizer_file, packaged_teacher.name)


@pytest.fixture(scope="session")
def tiny_triton(tiny_repository) -> TritonServer:
    """One Triton for the session's read-only tests (tests that kill Triton start their own)."""
    server = start_triton(tiny_repository)
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture(scope="session")
def tiny_multi_item_triton(tiny_multi_item_repository) -> TritonServer:
    """One Triton serving the multi-item tiny scorer, for the session's read-only tests."""
    server = start_triton(tiny_multi_item_repository)
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture
def free_tcp_port() -> int:
    return free_port()
