"""``slimserve bench grpc``: an asyncio load generator for the gRPC services, on loopback only.

Two ways of loading a service, both bounded in requests and in time:

- closed loop: ``concurrency`` workers each send a request, wait for its answer, and send the next;
- open loop: requests arrive as a Poisson process at ``rate`` per second, whether or not earlier ones
  have been answered. Latency is measured from each request's scheduled arrival, so a service that
  falls behind shows it (no coordinated omission).

A call is an async function returning a :class:`CallOutcome`; unary Score calls and the server-streaming
Explain calls of the ReasoningService (time to first token, tokens/s) are built here. Failed calls are
counted by gRPC status code.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from ..channel import ClientSecurity, open_aio_channel
from ..errors import UserError
from .stats import LatencySummary

MAX_IN_FLIGHT = 4096


@dataclass(frozen=True)
class CallOutcome:
    """What one successful call produced: items scored, or tokens streamed and the first token's time."""

    items: int = 0
    tokens: int = 0
    first_token_s: float | None = None  # perf_counter time of the first streamed text


Call = Callable[[int], Awaitable[CallOutcome]]


@dataclass
class LoadPoint:
    """Throughput, latency and errors of one load level."""

    method: str
    mode: str  # "closed" (load = concurrency) or "open" (load = offered requests/s)
    load: float
    ok: int
    seconds: float
    items: int
    latency: LatencySummary
    errors: dict[str, int] = field(default_factory=dict)
    ttft: LatencySummary | None = None
    tokens: int = 0
    stream_tokens_per_s: float | None = None  # median over streams of tokens after the first per second

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        data = {
            "method": self.method,
            "mode": self.mode,
            "load": self.load,
            "ok": self.ok,
            "errors": sum(self.errors.values()),
            "errors_by_code": dict(self.errors),
            "seconds": self.seconds,
            "requests_per_s": self.requests_per_s,
            "items_per_s": self.items_per_s,
            **{f"latency_{k}": v for k, v in self.latency.as_dict().items()},
        }
        if self.ttft is not None:
            data.update({f"ttft_{k}": v for k, v in self.ttft.as_dict().items()})
            data.update(tokens=self.tokens, stream_tokens_per_s=self.stream_tokens_per_s)
        return data


def check_loopback(target: str) -> None:
    """Refuse a target that is not on this machine's loopback (the generator is a local tool)."""
    host = target.rsplit(":", 1)[0].strip("[]")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise UserError(f"--target {target}: cannot resolve {host!r}: {exc}") from None
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise UserError(f"--target {target}: the load generator only targets loopback addresses")


class _Recorder:
    """Latencies, items, tokens and errors of the calls of one load point."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.ttft_ms: list[float] = []
        self.stream_rates: list[float] = []
        self.items = 0
        self.tokens = 0
        self.errors: Counter[str] = Counter()

    async def run(self, call: Call, index: int, started: float) -> None:
        try:
            outcome = await call(index)
        except grpc.aio.AioRpcError as exc:
            self.errors[exc.code().name] += 1
            return
        except asyncio.TimeoutError:
            self.errors["DEADLINE_EXCEEDED"] += 1
            return
        finished = time.perf_counter()
        self.latencies_ms.append((finished - started) * 1000)
        self.items += outcome.items
        self.tokens += outcome.tokens
        if outcome.first_token_s is not None:
            self.ttft_ms.append((outcome.first_token_s - started) * 1000)
            if outcome.tokens > 1 and finished > outcome.first_token_s:
                self.stream_rates.append((outcome.tokens - 1) / (finished - outcome.first_token_s))

    def point(self, method: str, mode: str, load: float, seconds: float) -> LoadPoint:
        import numpy as np

        streamed = bool(self.ttft_ms)
        return LoadPoint(
            method=method,
            mode=mode,
            load=load,
            ok=len(self.latencies_ms),
            seconds=seconds,
            items=self.items,
            latency=LatencySummary.of_or_empty(self.latencies_ms),
            errors=dict(self.errors),
            ttft=LatencySummary.of_or_empty(self.ttft_ms) if streamed else None,
            tokens=self.tokens,
            stream_tokens_per_s=float(np.median(self.stream_rates)) if self.stream_rates else None,
        )


def _check_bounds(max_requests: int, max_seconds: float) -> None:
    if max_requests < 1 or max_seconds <= 0:
        raise ValueError("max_requests must be >= 1 and max_seconds > 0")


async def closed_loop(
    call: Call, method: str, concurrency: int, max_requests: int, max_seconds: float
) -> LoadPoint:
    """``concurrency`` workers back to back until ``max_requests`` were sent or ``max_seconds`` passed."""
    _check_bounds(max_requests, max_seconds)
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    recorder, counter = _Recorder(), iter(range(max_requests))
    begin = time.perf_counter()
    deadline = begin + max_seconds

    async def worker() -> None:
        for index in counter:
            if time.perf_counter() >= deadline:
                return
            await recorder.run(call, index, time.perf_counter())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return recorder.point(method, "closed", concurrency, time.perf_counter() - begin)


async def open_loop(
    call: Call, method: str, rate: float, max_requests: int, max_seconds: float, seed: int = 0
) -> LoadPoint:
    """Poisson arrivals at ``rate``/s until ``max_requests`` or ``max_seconds``; then wait for the answers.

    Throughput is answers over the time from the first arrival to the last answer.
    """
    _check_bounds(max_requests, max_seconds)
    if rate <= 0:
        raise ValueError("rate must be > 0")
    recorder, rng = _Recorder(), random.Random(seed)
    tasks: set[asyncio.Task] = set()
    begin = time.perf_counter()
    arrival = begin
    for index in range(max_requests):
        arrival += rng.expovariate(rate)
        if arrival - begin >= max_seconds:
            break
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_IN_FLIGHT:
            recorder.errors["CLIENT_OVERLOADED"] += 1
            continue
        task = asyncio.ensure_future(recorder.run(call, index, arrival))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return recorder.point(method, "open", rate, time.perf_counter() - begin)


# -- calls ---------------------------------------------------------------------------------------------
def score_call(channel: grpc.aio.Channel, requests: list, timeout_s: float) -> Call:
    """Unary ``ScoringService/Score`` over prepared requests, cycled; items = candidates scored."""
    from ..v1 import scoring_pb2_grpc

    stub = scoring_pb2_grpc.ScoringServiceStub(channel)

    async def call(index: int) -> CallOutcome:
        response = await stub.Score(requests[index % len(requests)], timeout=timeout_s)
        return CallOutcome(items=len(response.items))

    return call


def explain_call(channel: grpc.aio.Channel, requests: list, timeout_s: float) -> Call:
    """Streaming ``ReasoningService/Explain``: first text chunk time and tokens generated (last message)."""
    from ..v1 import reasoning_pb2_grpc

    stub = reasoning_pb2_grpc.ReasoningServiceStub(channel)

    async def call(index: int) -> CallOutcome:
        first, tokens = None, 0
        async for chunk in stub.Explain(requests[index % len(requests)], timeout=timeout_s):
            if first is None and chunk.text:
                first = time.perf_counter()
            if chunk.HasField("metadata"):
                tokens = chunk.metadata.tokens_generated
        return CallOutcome(items=1, tokens=tokens, first_token_s=first or time.perf_counter())

    return call


def score_requests(calls) -> list:
    """``ScoreRequest`` protobufs for workload calls (all candidates returned)."""
    from ..client import build_request

    return [build_request(c.member, list(c.items)) for c in calls]


def explain_requests(calls, max_tokens: int) -> list:
    """``ExplainRequest`` protobufs, one per workload call (its member and first item), greedy decoding."""
    from ..client_convert import item_to_proto, member_to_proto
    from ..v1 import reasoning_pb2

    options = reasoning_pb2.GenerationOptions(max_tokens=max_tokens)
    return [
        reasoning_pb2.ExplainRequest(
            member=member_to_proto(c.member), item=item_to_proto(c.items[0]), options=options
        )
        for c in calls
    ]


@dataclass(frozen=True)
class LoadPlan:
    """Which load levels to run and how long each may take."""

    concurrencies: tuple[int, ...] = (1, 4, 16)
    rates: tuple[float, ...] = ()
    max_requests: int = 500
    max_seconds: float = 10.0
    warmup_requests: int = 8
    timeout_s: float = 30.0


async def run_load(call: Call, method: str, plan: LoadPlan) -> list[LoadPoint]:
    """Warm up, then every closed-loop concurrency and every open-loop rate of the plan."""
    for index in range(plan.warmup_requests):
        await _Recorder().run(call, index, time.perf_counter())
    points = []
    for concurrency in plan.concurrencies:
        points.append(await closed_loop(call, method, concurrency, plan.max_requests, plan.max_seconds))
    for rate in plan.rates:
        points.append(await open_loop(call, method, rate, plan.max_requests, plan.max_seconds))
    return points


async def bench_service(
    target: str,
    method: str,
    requests: list,
    plan: LoadPlan,
    check_target: bool = True,
    security: ClientSecurity | None = None,
) -> list[LoadPoint]:
    """Run ``plan`` against ``method`` ("Score" or "Explain") of the service at ``target``."""
    if check_target:
        check_loopback(target)
    makers = {"Score": score_call, "Explain": explain_call}
    if method not in makers:
        raise ValueError(f"method must be one of {sorted(makers)}, got {method!r}")
    async with open_aio_channel(target, security) as channel:
        return await run_load(makers[method](channel, requests, plan.timeout_s), method, plan)


def format_load_table(points: list[LoadPoint]) -> str:
    """Markdown table of load points (TTFT and tokens/s columns when streams were measured)."""
    streams = any(p.ttft is not None for p in points)
    head = "| method | mode | load | ok | errors | req/s | items/s | p50 ms | p95 ms | p99 ms |"
    rule = "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"
    if streams:
        head += " TTFT p50 ms | TTFT p99 ms | tokens/s |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for p in points:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(p.errors.items())) or "0"
        s = p.latency
        line = (
            f"| {p.method} | {p.mode} | {p.load:.4g} | {p.ok} | {errors} | {p.requests_per_s:.1f} | "
            f"{p.items_per_s:.1f} | {s.p50_ms:.1f} | {s.p95_ms:.1f} | {s.p99_ms:.1f} |"
        )
        if streams:
            t = p.ttft or LatencySummary.empty()
            rate = "-" if p.stream_tokens_per_s is None else f"{p.stream_tokens_per_s:.1f}"
            line += f" {t.p50_ms:.1f} | {t.p99_ms:.1f} | {rate} |"
        lines.append(line)
    return "\n".join(lines)
