"""Error roots shared by every part of slimserve, and how the CLI turns them into exit codes.

``UserError``: something the user can fix (a flag, a file, a missing model) -> exit 1, message only.
``StageError``: a step of the work failed (export parity, Triton start) -> exit 2, message and log path.
Serving errors that reach gRPC clients have their own root, ``slimserve.serving.errors.ServingError``.
"""

from __future__ import annotations


class SlimserveError(Exception):
    """Root of slimserve's own exceptions outside the gRPC error contract."""


class UserError(SlimserveError):
    """A mistake the user can fix; printed without a traceback, exit code 1."""


class StageError(SlimserveError):
    """A stage of the work failed; printed with where to look, exit code 2."""


class BuildError(StageError):
    """A build-stage step (load, export, parity, publish) failed."""


def classify_failure(exc: BaseException) -> tuple[str | None, str]:
    """('user' | 'stage' | None, message) for an exception that reached the CLI."""
    if isinstance(exc, UserError):
        return "user", str(exc)
    if isinstance(exc, StageError):
        return "stage", str(exc)
    return None, str(exc)
