"""Prometheus metrics of a service, in a registry of its own, served on a separate HTTP port.

Each server gets its own ``CollectorRegistry`` (not the process-global one), so tests can run several
servers in one process and a service's ``/metrics`` shows only its own series.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CANDIDATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 300, 500, 1000)
TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class ServingMetrics:
    """The metrics every service records: RPCs and Triton calls."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "slimserve_grpc_requests",
            "gRPC requests handled, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "slimserve_grpc_request_duration_seconds",
            "gRPC request wall time inside the service, by method and status code.",
            ["method", "code"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "slimserve_grpc_requests_in_flight",
            "gRPC requests being handled now, by method.",
            ["method"],
            registry=self.registry,
        )
        self.admission_in_flight = Gauge(
            "slimserve_admission_in_flight",
            "Units of admitted work not yet answered (candidates for scoring, streams for reasoning).",
            registry=self.registry,
        )
        self.admission_limit = Gauge(
            "slimserve_admission_limit",
            "The admission budget (0: no limit); beyond it calls get RESOURCE_EXHAUSTED.",
            registry=self.registry,
        )
        self.triton_latency = Histogram(
            "slimserve_triton_request_duration_seconds",
            "Round trip of one Triton inference call, by outcome (ok or the error's status code).",
            ["outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )


class ScoringMetrics(ServingMetrics):
    """The shared metrics plus the number of candidates per Score request."""

    def __init__(self, registry: CollectorRegistry | None = None):
        super().__init__(registry)
        self.candidates = Histogram(
            "slimserve_score_candidates",
            "Candidates per Score request.",
            buckets=CANDIDATE_BUCKETS,
            registry=self.registry,
        )


class GenerationMetrics(ServingMetrics):
    """The shared metrics plus time to first token, decode rate and tokens by finish reason."""

    def __init__(self, registry: CollectorRegistry | None = None):
        super().__init__(registry)
        self.time_to_first_token = Histogram(
            "slimserve_generation_time_to_first_token_seconds",
            "From receipt of a generation request to the model's first token.",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.tokens_per_second = Histogram(
            "slimserve_generation_tokens_per_second",
            "Decode rate of a finished generation (tokens after the first / time after the first).",
            buckets=TOKENS_PER_SECOND_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "slimserve_generation_tokens",
            "Tokens generated, by finish reason.",
            ["finish_reason"],
            registry=self.registry,
        )


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # scrapes are not worth a log line each
        pass


def token_protected(app: Callable, accepts: Callable[[str], bool]) -> Callable:
    """A WSGI app answering 401 unless the request carries ``Authorization: Bearer <accepted token>``."""

    def protected(environ, start_response):
        from .security import bearer_token

        token = bearer_token(environ.get("HTTP_AUTHORIZATION"))
        if token is not None and accepts(token):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer"), ("Content-Type", "text/plain")])
        return [b"bearer token required\n"]

    return protected


def _start_protected(
    registry: CollectorRegistry, port: int, host: str, accepts: Callable[[str], bool]
) -> tuple[WSGIServer, threading.Thread]:
    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(
        host, port, token_protected(make_wsgi_app(registry), accepts), Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    return httpd, thread


def start_metrics_server(
    registry: CollectorRegistry,
    port: int,
    host: str = "0.0.0.0",
    accepts_token: Callable[[str], bool] | None = None,
) -> tuple[int, Callable[[], None]]:
    """Serve ``registry`` over HTTP on ``host:port`` (0 = a free port); return (bound port, stop).

    With ``accepts_token`` every scrape needs ``Authorization: Bearer <token>`` that it accepts.
    """
    if accepts_token is None:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    else:
        httpd, thread = _start_protected(registry, port, host, accepts_token)
    bound = httpd.server_address[1]

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

    return bound, stop
