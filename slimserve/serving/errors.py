"""The serving error root: every error a client can see, each carrying its gRPC status code.

Raised by the Triton client and the service cores; the gRPC layer maps them to status codes in one
place (``slimserve.serving.interceptor``). Messages are safe to show to clients; internals stay in logs.
"""

from __future__ import annotations

import grpc


class ServingError(Exception):
    """Base of all serving errors; ``code`` is the gRPC status a client receives."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(ServingError):
    """The request is malformed; ``field`` names the offending field path (e.g. ``candidates[3].id``)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class UndecodableRequest(ServingError):
    """The request body does not decode as the method's request message (named, e.g. ScoreRequest)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message_type: str):
        super().__init__(f"request is not a valid {message_type}")
        self.message_type = message_type


class ResourceExhausted(ServingError):
    """Triton's queue (or the service's own limit) is full: retry later, with backoff."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServingError):
    """Triton is unreachable or the model is not ready."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServingError):
    """The caller's deadline (or Triton's queue timeout) ran out."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServingError):
    """The caller went away."""

    code = grpc.StatusCode.CANCELLED


class FailedPrecondition(ServingError):
    """The service cannot serve this model (e.g. serving-bundle hash mismatch)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class InternalError(ServingError):
    """Anything unexpected; the client sees a generic message, the log has the details."""

    code = grpc.StatusCode.INTERNAL
