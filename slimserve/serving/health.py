"""Model health: a background watcher that keeps ``grpc.health.v1`` in step with the Triton model.

The watcher polls ``model_ready()`` and, once per (re)connection, checks that the Triton model carries
the serving bundle's hash (config parameter ``slimserve_bundle_hash``). The gRPC health status of ""
and of each named service is SERVING only while both hold; it turns NOT_SERVING when Triton stops
answering and SERVING again by itself when it comes back. A hash mismatch keeps NOT_SERVING and logs
both hashes; the core then refuses requests with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from slimserve.bundle import BUNDLE_HASH_PARAMETER

from .errors import FailedPrecondition, ServingError, Unavailable

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ModelProbe(Protocol):
    """The two calls of the Triton client the watcher needs, and why the model was last not ready."""

    unready_reason: str

    async def model_ready(self) -> bool: ...

    async def model_parameters(self) -> dict[str, str]: ...


class ModelHealthWatcher:
    """Polls the Triton model and publishes its health; ``ready`` is what the core consults."""

    def __init__(
        self,
        client: ModelProbe,
        bundle_hash: str,
        *,
        model_label: str = "",
        interval_s: float = 1.0,
        service_names: tuple[str, ...] = (),
    ):
        self.client = client
        self.bundle_hash = bundle_hash
        self.model_label = model_label or "model"
        self.interval_s = interval_s
        self.service_names = ("", *service_names)
        self.servicer = health_aio.HealthServicer()
        self.ready = False
        self.hash_mismatch = False
        self.last_error: str | None = "not checked yet"
        self._verified = False  # hash checked on the current connection
        self._published: int | None = None
        self._checked = False
        self._wake = asyncio.Event()
        self._ready_event = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Publish NOT_SERVING, then start polling in the background."""
        await self._publish(NOT_SERVING)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="slimserve-model-health")

    async def stop(self) -> None:
        """Mark every service NOT_SERVING for good (graceful shutdown) and stop polling.

        ``ready`` keeps its last value: the drain that calls this still serves the requests the gRPC
        server accepted before it stopped taking new ones, and those whose handler had not yet reached
        ``check_serving`` must not be refused as "not ready" (probes see NOT_SERVING at once)."""
        await self.servicer.enter_graceful_shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def check_serving(self, model_name: str) -> None:
        """Refuse at once (for a core, before calling Triton) when the model is not ready or carries
        another bundle: FAILED_PRECONDITION on a hash mismatch, else UNAVAILABLE."""
        if self.hash_mismatch:
            raise FailedPrecondition(
                f"the Triton model {model_name!r} does not carry this service's serving bundle; "
                "refusing to serve"
            )
        if not self.ready:
            raise Unavailable(f"model {model_name!r} is not ready")

    def notify_unavailable(self) -> None:
        """A Triton call found the server unreachable: flip to not ready and re-check at once."""
        if self.ready:
            log.warning("%s became unavailable; NOT_SERVING until it answers again", self.model_label)
        self._set_ready(False)
        self._verified = False
        self.last_error = f"{self.model_label} unavailable"
        self._wake.set()

    async def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until the model is ready and verified; False when ``timeout`` passes first."""
        try:
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def check_once(self) -> bool:
        """One poll: readiness, then (once per connection) the bundle hash; publish the result."""
        if not await self.client.model_ready():
            self._verified = False
            reason = self.client.unready_reason or "Triton is unreachable or the model is not loaded"
            self.last_error = f"{self.model_label} is not ready: {reason}"
            await self._update(False)
            return False
        if not self._verified:
            try:
                params = await self.client.model_parameters()
            except ServingError as exc:
                self.last_error = f"cannot read {self.model_label} parameters: {exc.message}"
                await self._update(False)
                return False
            served = params.get(BUNDLE_HASH_PARAMETER, "")
            if served != self.bundle_hash:
                if not self.hash_mismatch:
                    log.error(
                        "%s in Triton has bundle hash %r (parameter %s) but this service's bundle is %r; "
                        "refusing to serve until they match",
                        self.model_label,
                        served,
                        BUNDLE_HASH_PARAMETER,
                        self.bundle_hash,
                    )
                self.hash_mismatch = True
                self.last_error = f"bundle hash mismatch: Triton {served!r}, service {self.bundle_hash!r}"
                await self._update(False)
                return False
            self.hash_mismatch = False
            self._verified = True
        self.last_error = None
        await self._update(True)
        return True

    async def _run(self) -> None:
        while True:
            try:
                if self._wake.is_set():
                    self._wake.clear()
                    await self._publish(NOT_SERVING)
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep watching whatever a probe does
                log.exception("health check of %s failed", self.model_label)
                await self._update(False)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

    async def _update(self, ready: bool) -> None:
        if ready and not self.ready:
            log.info("%s is ready and matches bundle %s: SERVING", self.model_label, self.bundle_hash[:12])
        elif not ready and (self.ready or not self._checked):
            log.warning("%s: NOT_SERVING (%s)", self.model_label, self.last_error)
        self._checked = True
        self._set_ready(ready)
        await self._publish(SERVING if ready else NOT_SERVING)

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready
        if ready:
            self._ready_event.set()
        else:
            self._ready_event.clear()

    async def _publish(self, status: int) -> None:
        if status == self._published:
            return
        self._published = status
        for name in self.service_names:
            await self.servicer.set(name, status)
