"""The reasoning gRPC server (``slimserve serve-reasoning``): the shared ``ServiceServer`` around a
``ReasoningCore``, health tied to the ``generator`` model."""

from __future__ import annotations

import grpc

from slimserve.v1 import reasoning_pb2, reasoning_pb2_grpc

from .. import admission
from ..metrics import GenerationMetrics
from ..server import ServiceServer, run_service
from .config import ReasoningServiceConfig
from .core import ReasoningCore
from .servicer import ReasoningServicer


class ReasoningServer(ServiceServer):
    """The reasoning service: Explain and Generate stream text from the generator model."""

    service_name = "ReasoningService"
    service_descriptor = reasoning_pb2.DESCRIPTOR
    metrics_class = GenerationMetrics
    budget_field = "max_streams_in_flight"
    budget_unit = "streams"
    admission_costs = {"ReasoningService/Explain": admission.one, "ReasoningService/Generate": admission.one}

    def build_core(self) -> ReasoningCore:
        return ReasoningCore.from_config(self.config, metrics=self.metrics)

    def add_servicer(self, server: grpc.aio.Server) -> None:
        reasoning_pb2_grpc.add_ReasoningServiceServicer_to_server(ReasoningServicer(self.core), server)


def run_reasoning_service(config: ReasoningServiceConfig) -> None:
    """Run the reasoning service in this process until SIGTERM or SIGINT, then drain."""
    run_service(ReasoningServer(config))
