"""Load while a fault happens: Score calls that keep every outcome, background workers, health watching.

Every call records when it was sent and answered (``time.perf_counter``), its status code and, when it
succeeded, which model version and bundle answered, so a case can ask afterwards what happened to the
calls in flight at a given moment. The workers pause briefly after a failure: a service whose Triton
is gone fails calls in a millisecond, and a hot loop would take the CPU the restart needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..grpc_load import CallOutcome
from ..stats import LatencySummary

OK = "OK"
UNREACHABLE = "UNREACHABLE"  # a health check that got no answer
PAUSE_AFTER_FAILURE_S = 0.02
CRASH_CODES = ("UNKNOWN", "INTERNAL")


@dataclass(frozen=True)
class Outcome:
    """One Score call: sent and answered (perf_counter seconds), status code, what answered it."""

    sent: float
    finished: float
    code: str
    served: str = ""  # "<model version>:<bundle hash>" of a successful answer

    @property
    def seconds(self) -> float:
        return self.finished - self.sent

    def in_flight_at(self, moment: float) -> bool:
        return self.sent < moment < self.finished


def codes(outcomes: Iterable[Outcome]) -> Counter[str]:
    """How many outcomes ended with each status code."""
    return Counter(o.code for o in outcomes)


def describe_codes(counts: Counter[str]) -> str:
    """``OK 812, UNAVAILABLE 3`` (``-`` for none)."""
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items())) or "-"


def p99_ms(outcomes: Iterable[Outcome]) -> float:
    """p99 latency (ms) of the outcomes, NaN when there are none."""
    return LatencySummary.of_or_empty([o.seconds * 1000 for o in outcomes]).p99_ms


class RecordedScore:
    """Unary Score over prepared requests (cycled); every call's ``Outcome`` is kept in ``outcomes``.

    Usable as a ``grpc_load`` call (``await call(index)`` returns a ``CallOutcome`` or raises the
    ``AioRpcError``), so its closed and open loops drive it.
    """

    def __init__(self, channel: grpc.aio.Channel, requests: list, deadline_s: float):
        from ...v1 import scoring_pb2_grpc

        self.stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        self.requests = requests
        self.deadline_s = deadline_s
        self.outcomes: list[Outcome] = []
        self.in_flight = 0  # calls sent and not yet answered

    async def __call__(self, index: int) -> CallOutcome:
        sent = time.perf_counter()
        self.in_flight += 1
        try:
            response = await self.stub.Score(
                self.requests[index % len(self.requests)], timeout=self.deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            self._record(Outcome(sent, time.perf_counter(), exc.code().name))
            raise
        except BaseException:  # cancelled: no outcome, but no longer in flight
            self.in_flight -= 1
            raise
        metadata = response.metadata
        served = f"{metadata.model_version}:{metadata.bundle_hash}"
        self._record(Outcome(sent, time.perf_counter(), OK, served))
        return CallOutcome(items=len(response.items))

    def _record(self, outcome: Outcome) -> None:
        # In the same step as the outcome: a caller that sees ``in_flight`` > 0 and then, without
        # awaiting, notes the time, has calls whose ``in_flight_at`` that time holds.
        self.in_flight -= 1
        self.outcomes.append(outcome)

    async def safe(self, index: int) -> str:
        """One call; its status code instead of an exception."""
        try:
            await self(index)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return OK

    def between(self, start: float, end: float = float("inf")) -> list[Outcome]:
        """The calls sent in [start, end)."""
        return [o for o in self.outcomes if start <= o.sent < end]


@contextlib.asynccontextmanager
async def background_load(call: RecordedScore, workers: int) -> AsyncIterator[RecordedScore]:
    """``workers`` closed-loop workers calling ``call`` until the block ends; then they finish their call."""
    stop = asyncio.Event()
    counter = iter(range(1 << 62))

    async def worker() -> None:
        while not stop.is_set():
            if await call.safe(next(counter)) != OK:
                await asyncio.sleep(PAUSE_AFTER_FAILURE_S)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    try:
        yield call
    finally:
        stop.set()
        await asyncio.gather(*tasks)


class HealthWatch:
    """``grpc.health.v1`` polled every ``interval_s``: (perf_counter time, status name) of each answer."""

    def __init__(self, target: str, interval_s: float = 0.05):
        self.target = target
        self.interval_s = interval_s
        self.samples: list[tuple[float, str]] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                except grpc.aio.AioRpcError:
                    status = UNREACHABLE
                self.samples.append((time.perf_counter(), status))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    def first(self, status: str, after: float) -> float | None:
        """Seconds from ``after`` to the first sample with ``status`` (None: never seen)."""
        return next((t - after for t, s in self.samples if t >= after and s == status), None)

    def seen(self, start: float, end: float = float("inf")) -> Counter[str]:
        return Counter(s for t, s in self.samples if start <= t < end)


@contextlib.asynccontextmanager
async def watching_health(target: str, interval_s: float = 0.05) -> AsyncIterator[HealthWatch]:
    """A ``HealthWatch`` running while the block runs."""
    watch, stop = HealthWatch(target, interval_s), asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        yield watch
    finally:
        stop.set()
        await task


async def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> float | None:
    """Poll ``predicate()`` until true; seconds it took, or None after ``timeout_s``. When it returns a
    number, ``predicate()`` held in the same step (nothing ran in between), so a caller can act on it."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if predicate():
            return time.perf_counter() - started
        await asyncio.sleep(interval_s)
    return None


async def until_serving_and_busy(call: RecordedScore, timeout_s: float) -> None:
    """Wait until a call sent from now succeeded and another is in flight: the moment a fault may strike.

    Returns in the step that saw a call in flight (no await after it), so a fault started right away
    finds that call in flight. RuntimeError when that does not happen within ``timeout_s``.
    """
    start = time.perf_counter()
    waited = await wait_until(
        lambda: any(o.code == OK for o in call.between(start)), timeout_s, interval_s=0.01
    )
    if waited is None or await wait_until(lambda: call.in_flight > 0, timeout_s, 0.001) is None:
        raise RuntimeError(
            f"no call succeeded with another in flight within {timeout_s:g} s: "
            + describe_codes(codes(call.between(start)))
        )


@contextlib.asynccontextmanager
async def sampling_rss(pid: int, interval_s: float = 0.5) -> AsyncIterator[list[tuple[float, int]]]:
    """(perf_counter time, resident bytes) of process ``pid`` every ``interval_s`` while the block runs."""
    from .stack import rss_bytes

    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), rss_bytes(pid)))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        stop.set()
        await task
        samples.append((time.perf_counter(), rss_bytes(pid)))


@contextlib.asynccontextmanager
async def under_load(
    target: str, requests: list, deadline_s: float, workers: int, health_interval_s: float = 0.05
) -> AsyncIterator[tuple[RecordedScore, HealthWatch]]:
    """Background Score load on ``target`` and its health watched, while the block runs (the fault)."""
    async with (
        grpc.aio.insecure_channel(target) as channel,
        watching_health(target, health_interval_s) as health,
        background_load(RecordedScore(channel, requests, deadline_s), workers) as call,
    ):
        yield call, health
