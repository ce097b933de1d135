"""The scoring gRPC server (``slimserve serve``): the shared ``ServiceServer`` around a ``ScoringCore``,
health tied to the ``scorer`` model, admission counted in candidates."""

from __future__ import annotations

import grpc

from slimserve.v1 import scoring_pb2, scoring_pb2_grpc

from .. import admission
from ..metrics import ScoringMetrics
from ..server import ServiceServer, run_service
from .config import ScoringServiceConfig
from .core import ScoringCore
from .servicer import ScoringServicer


class ScoringServer(ServiceServer):
    """The scoring service (``slimserve serve``)."""

    service_name = "ScoringService"
    service_descriptor = scoring_pb2.DESCRIPTOR
    metrics_class = ScoringMetrics
    budget_field = "max_candidates_in_flight"
    budget_unit = "candidates"
    admission_costs = {
        "ScoringService/Score": admission.candidates,
        "ScoringService/ScoreStream": admission.candidates,
    }

    def build_core(self) -> ScoringCore:
        return ScoringCore.from_config(self.config, metrics=self.metrics)

    def add_servicer(self, server: grpc.aio.Server) -> None:
        scoring_pb2_grpc.add_ScoringServiceServicer_to_server(ScoringServicer(self.core), server)


def run_scoring_service(config: ScoringServiceConfig) -> None:
    """Run the scoring service in this process until SIGTERM or SIGINT (``slimserve serve``)."""
    run_service(ScoringServer(config))
