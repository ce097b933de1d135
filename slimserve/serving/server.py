"""The gRPC server every service shares: assembly, start, graceful drain, and the process entry point.

``ServiceServer`` wires a service core into a grpc.aio server with the serving interceptor (and, when
tokens are configured, the token interceptor in front of it), health (driven by the core's model
watcher), reflection and a Prometheus endpoint, all on one port: plaintext, TLS or mTLS
(``serving.security``), with an admission budget per service (``serving.admission``). With ``health_port``
a second, plaintext server answers only grpc.health.v1 (the same statuses), for probes without TLS.
``stop`` drains: health goes NOT_SERVING, new RPCs are refused, in-flight ones get ``grace`` seconds, then
the Triton client closes.
``start_ready`` starts one and waits for its model (``slimserve up``); ``stop_on_signals`` is the
SIGTERM/SIGINT handling of both. ``run_service`` runs one until SIGTERM or SIGINT. The services'
servers: ``serving.scoring.server`` (``ScoringServer``) and ``serving.reasoning.server``
(``ReasoningServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..errors import StageError
from . import admission
from .config import GrpcServiceConfig
from .interceptor import CallGate, RequestIdFilter, ServingInterceptor
from .metrics import ServingMetrics, start_metrics_server
from .security import (
    ReloadingCertificates,
    TokenInterceptor,
    TokenSet,
    check_plaintext_bind,
    describe_transport,
    server_credentials,
)

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def server_options(config: GrpcServiceConfig) -> list[tuple[str, int]]:
    """Channel options: connection age (so clients rebalance behind a k8s Service), keepalive, sizes."""
    return [
        ("grpc.max_connection_age_ms", 5 * 60 * 1000),
        ("grpc.max_connection_age_grace_ms", int(max(config.drain_grace_s, 1.0) * 1000)),
        ("grpc.keepalive_time_ms", 60 * 1000),
        ("grpc.keepalive_timeout_ms", 20 * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10 * 1000),
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
    ]


class ServiceServer:
    """One gRPC service: its core (plain logic, health watcher, Triton client), the grpc.aio server with
    the serving interceptor, health, reflection, and the metrics endpoint. Subclasses name the service
    and say how to build the core and register the servicer."""

    service_name: ClassVar[str] = ""  # the proto service, e.g. "ScoringService"
    service_descriptor: ClassVar[Any] = None  # the generated *_pb2 module's DESCRIPTOR
    metrics_class: ClassVar[type[ServingMetrics]] = ServingMetrics
    # admission: the config field holding the budget, its unit, and each method's cost per request
    budget_field: ClassVar[str] = ""
    budget_unit: ClassVar[str] = ""
    admission_costs: ClassVar[Mapping[str, admission.Cost]] = {}

    def __init__(self, config: GrpcServiceConfig, core: Any | None = None):
        self.config = config
        self.metrics = self.metrics_class()
        self.core = core
        self.port: int | None = None
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self.budget: admission.WorkBudget | None = None
        self.gate = CallGate()  # closed by the drain: new calls UNAVAILABLE while in-flight ones finish
        self.tokens: TokenSet | None = None
        self.certificates: ReloadingCertificates | None = None
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._stop_metrics = None
        self._stopped = False

    def build_core(self) -> Any:
        """The service's core, built from ``self.config`` (reporting into ``self.metrics``)."""
        raise NotImplementedError

    def add_servicer(self, server: grpc.aio.Server) -> None:
        """Register the service's servicer (wrapping ``self.core``) on ``server``."""
        raise NotImplementedError

    @property
    def full_service_name(self) -> str:
        return self.service_descriptor.services_by_name[self.service_name].full_name

    def build_admission(self) -> admission.Admission | None:
        """The admission budget from ``budget_field`` of the config (None: no limit)."""
        limit = getattr(self.config, self.budget_field, None) if self.budget_field else None
        self.metrics.admission_limit.set(limit or 0)
        if limit is None:
            return None
        self.budget = admission.WorkBudget(limit, self.budget_unit, self.config.retry_pushback_ms)
        self.metrics.admission_in_flight.set_function(lambda: self.budget.in_flight)
        return admission.Admission(self.budget, self.admission_costs)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The token check (when tokens are configured) in front of the serving interceptor."""
        serving = ServingInterceptor(self.metrics, admission=self.build_admission(), gate=self.gate)
        return [serving] if self.tokens is None else [TokenInterceptor(self.tokens), serving]

    def check_security(self) -> grpc.ServerCredentials | None:
        """Before anything is built: the plaintext rule, the tokens and the TLS files (None: plaintext)."""
        check_plaintext_bind(self.config)
        self.tokens = TokenSet.from_config(self.config)
        if not self.config.uses_tls:
            return None
        credentials, self.certificates = server_credentials(self.config)
        return credentials

    def bind(self, server: grpc.aio.Server, credentials: grpc.ServerCredentials | None) -> int:
        """Add the gRPC port: TLS with ``credentials``, else plaintext."""
        config = self.config
        address = f"{config.host}:{config.port}"
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if not port:
            raise OSError(f"cannot bind gRPC server to {address}")
        return port

    async def start_health_port(self, servicer: Any) -> None:
        """The plaintext health-only server on ``host:health_port`` (no reflection, no token): what a
        kubelet gRPC probe can reach when the service port speaks TLS."""
        address = f"{self.config.host}:{self.config.health_port}"
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port(address)
        if not port:
            raise OSError(f"cannot bind the health port to {address}")
        await server.start()
        self._health_server, self.health_port = server, port

    async def start(self) -> int:
        """Build the core (unless given), bind ``host:port`` and start serving; return the bound port."""
        config = self.config
        credentials = self.check_security()
        if self.core is None:
            self.core = self.build_core()
        elif self.core.metrics is None:
            self.core.metrics = self.metrics
        watcher = self.core.watcher
        server = grpc.aio.server(
            interceptors=self.interceptors(),
            options=server_options(config),
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        self.add_servicer(server)
        health_pb2_grpc.add_HealthServicer_to_server(watcher.servicer, server)
        names = (
            self.full_service_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, server)
        port = self.bind(server, credentials)
        await watcher.start()  # NOT_SERVING before the first RPC can arrive
        await server.start()
        self._server, self.port = server, port
        if config.health_port is not None:
            await self.start_health_port(watcher.servicer)
        if config.metrics_port >= 0:
            accepts = self.tokens.accepts if self.tokens and config.metrics_require_token else None
            self.metrics_port, self._stop_metrics = start_metrics_server(
                self.metrics.registry, config.metrics_port, config.metrics_host, accepts
            )
        bundle = self.core.bundle
        metrics_where = f"{config.metrics_host}:{self.metrics_port}" if self._stop_metrics else "off"
        tokens = f"{len(self.tokens)} bearer token(s)" if self.tokens else "no token"
        budget = f"{self.budget.limit} {self.budget.unit}" if self.budget else "no limit"
        health = f", plaintext health port {self.health_port}" if self._health_server else ""
        log.info(
            "%s listening on %s:%d, %s%s, %s, admission %s (metrics %s); model %r version %s at %s (%s), "
            "bundle %s",
            self.full_service_name,
            config.host,
            port,
            describe_transport(config),
            health,
            tokens,
            budget,
            metrics_where,
            bundle.model_name,
            bundle.model_version,
            config.triton_url,
            self.core.client.security.transport,
            bundle.content_hash,
        )
        return port

    async def start_ready(self, timeout_s: float) -> int:
        """``start``, then wait until the core's model is ready (health SERVING); return the bound port.
        On any failure, or no readiness within ``timeout_s`` (``StageError``), stop at once and raise."""
        try:
            port = await self.start()
            if not await self.core.watcher.wait_until_ready(timeout=timeout_s):
                raise StageError(f"{self.service_name} not ready: {self.core.watcher.last_error}")
        except BaseException:
            await self.stop(grace=0)
            raise
        return port

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new RPCs, let in-flight ones finish within ``grace`` s, close."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.drain_grace_s if grace is None else grace
        log.info("draining: NOT_SERVING, up to %.1f s for in-flight requests", grace)
        if self.core is not None:
            await self.core.watcher.stop()
        if self._server is not None:
            # Calls already sent but not yet matched to a handler would be cancelled by stop(): take
            # them first (the core keeps serving; health already says NOT_SERVING). Then the gate
            # answers new calls UNAVAILABLE while those in flight finish; stop() then cuts nothing
            # but a call arriving in its last milliseconds.
            started = time.monotonic()
            await asyncio.sleep(min(self.config.drain_delay_s, grace))
            self.gate.closed = True
            await self.gate.wait_idle(max(grace - (time.monotonic() - started), 0.0))
            await self._server.stop(max(grace - (time.monotonic() - started), 0.0))
        if self._health_server is not None:  # answered NOT_SERVING through the drain
            await self._health_server.stop(0)
        if self.core is not None:
            await self.core.client.close()
        if self._stop_metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._stop_metrics)
            self._stop_metrics = None
        log.info("stopped")

    async def wait_for_termination(self) -> None:
        """Return when the gRPC server has stopped."""
        if self._server is not None:
            await self._server.wait_for_termination()


@contextlib.contextmanager
def stop_on_signals(stop_event: asyncio.Event | None = None):
    """An event set by SIGTERM or SIGINT while the block runs (in the running event loop).

    The handlers stay installed until the block ends, drain included, so a second signal cannot cut a
    drain short (it is logged). Where signals cannot be handled (not the main thread), only the caller
    sets the event.
    """
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []

    def _on_signal(signum: int) -> None:
        if stop_event.is_set():
            log.warning(
                "%s while draining: still waiting for in-flight requests", signal.Signals(signum).name
            )
        stop_event.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, _on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
    try:
        yield stop_event
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def serve(server: ServiceServer, stop_event: asyncio.Event | None = None) -> None:
    """Run ``server`` until ``stop_event`` is set (by default: on SIGTERM or SIGINT), then drain."""
    with stop_on_signals(stop_event) as stop:
        try:
            await server.start()
            await stop.wait()
        finally:
            await server.stop()


def configure_logging(level: str = "INFO") -> None:
    """Process logging for a service: one line per record, with the request id of the RPC."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def run_service(server: ServiceServer) -> None:
    """Run a service in this process until SIGTERM or SIGINT, then drain (the ``serve*`` commands)."""
    from .allocator import fix_mmap_threshold

    fix_mmap_threshold()
    configure_logging(server.config.log_level)
    asyncio.run(serve(server))
