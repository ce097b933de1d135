"""What every service core shares: its serving bundle, Triton client, config, metrics and model health.

A core holds the plain-typed logic of one service; the servicer converts protobuf around it and the
``ServiceServer`` runs it. The health watcher polls the bundle's model; ``check_serving`` refuses a
request at once while the model is not ready or carries another bundle. ``triton_call`` keeps the
books of one call to Triton (its outcome in the metrics; UNAVAILABLE tells the health watcher).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from slimserve.bundle import BundleError

from .errors import ServingError, Unavailable
from .health import ModelHealthWatcher


def check_template_version(
    directory: Path, found: str, rendered: str, also_served: tuple[str, ...] = ()
) -> None:
    """Refuse a bundle built with another prompt template than the one this service renders (or one of
    the older templates it still serves, ``also_served``)."""
    if found != rendered and found not in also_served:
        raise BundleError(
            f"{directory}: the model was built with prompt template {found!r}, this service renders "
            f"{rendered!r}; rebuild or re-export the model, or run a matching slimserve version"
        )


class ServiceCore:
    """Base of the service cores; ``bundle`` needs ``model_name``, ``model_version``, ``content_hash``."""

    service_name = ""  # the full proto service name, e.g. "slimserve.v1.ScoringService"

    def __init__(
        self,
        bundle: Any,
        client: Any,
        config: Any,
        *,
        watcher: ModelHealthWatcher | None = None,
        metrics: Any | None = None,
    ):
        self.bundle = bundle
        self.client = client
        self.config = config
        self.metrics = metrics
        self.watcher = watcher or ModelHealthWatcher(
            client,
            bundle.content_hash,
            model_label=f"model {bundle.model_name!r} version {bundle.model_version}",
            interval_s=config.health_poll_interval_s,
            service_names=(self.service_name,),
        )

    def triton_call(self, start: float | None = None) -> TritonCall:
        """The bookkeeping of one Triton call, timed from ``start`` (default: now): ``with`` it around the
        call (or the reading of its stream)."""
        return TritonCall(self, time.perf_counter() if start is None else start)

    def check_serving(self) -> None:
        """Refuse at once when the model is not ready or carries another bundle."""
        self.watcher.check_serving(self.bundle.model_name)

    async def close(self) -> None:
        """Stop the health watcher and close the Triton client."""
        await self.watcher.stop()
        await self.client.close()


class TritonCall:
    """One call to Triton, as a context manager: on leaving, its outcome ("ok", the ``ServingError``'s
    status code name, CANCELLED when the caller left, INTERNAL for anything else) goes into the core's
    ``triton_latency`` with the time since ``start``; an ``Unavailable`` also tells the health watcher, so
    the next requests are refused at once."""

    def __init__(self, core: ServiceCore, start: float):
        self.core = core
        self.start = start

    def __enter__(self) -> TritonCall:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        outcome = "ok"
        if isinstance(exc, ServingError):
            outcome = exc.code.name
            if isinstance(exc, Unavailable):
                self.core.watcher.notify_unavailable()
        elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the caller left (or stopped reading)
            outcome = "CANCELLED"
        elif isinstance(exc, Exception):
            outcome = "INTERNAL"
        if self.core.metrics is not None:
            self.core.metrics.triton_latency.labels(outcome).observe(time.perf_counter() - self.start)
