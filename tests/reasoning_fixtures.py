"""The tiny generator repository, built once per test session for the reasoning tests.

Import ``generator_repository_fixture`` into a test module to use it (pytest registers it by name there; the
session scope shares one build between modules).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session", name="generator_repository")
def generator_repository_fixture(tmp_path_factory) -> Path:
    """A model repository holding the tiny random generator (4 slots, queue of 8): the real export."""
    from slimserve.export.generator_repository import build_tiny_generator_repository

    repository = tmp_path_factory.mktemp("generator") / "model_repository"
    build_tiny_generator_repository(repository, max_active_sequences=4, max_queued_requests=8)
    return repository
