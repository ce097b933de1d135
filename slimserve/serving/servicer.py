"""What every servicer shares: the core it delegates to, a call's time budget and its response metadata.

A servicer converts protobuf <-> plain types around its service core (``serving.core``); the budget is
the caller's remaining deadline, else the service's ``default_timeout_s``; the metadata names the
request and the model that answered (name, version, bundle hash), with the timings the service measured.
"""

from __future__ import annotations

from typing import Any

from slimserve.v1 import common_pb2


def response_metadata(bundle: Any, request_id: str, **timings: float) -> common_pb2.ResponseMetadata:
    """The ``ResponseMetadata`` of an answer from ``bundle``'s model; ``timings``: its ``*_ms`` fields."""
    return common_pb2.ResponseMetadata(
        request_id=request_id,
        model_name=bundle.model_name,
        model_version=str(bundle.model_version),
        bundle_hash=bundle.content_hash,
        **timings,
    )


class ServiceServicer:
    """Base of the servicers (before the generated ``*Servicer`` class): holds the ``core``."""

    def __init__(self, core: Any):
        self.core = core

    def _timeout(self, context) -> float:
        """Seconds the call has left: the caller's deadline, else the service's default budget."""
        remaining = context.time_remaining()
        return self.core.config.default_timeout_s if remaining is None else remaining

    def _metadata(self, request_id: str, **timings: float) -> common_pb2.ResponseMetadata:
        return response_metadata(self.core.bundle, request_id, **timings)
