"""Fuzz: malformed Score calls; nothing may crash the service, answer UNKNOWN/INTERNAL or grow its memory.

Half the bodies are valid ScoreRequests with one mutation (unknown enum numbers, NaN and infinities,
texts past the limits up to 1 MB, empty required fields, duplicate ids, thousands of repeated entries,
control characters, unknown fields); half are raw bytes (random, truncated, bit-flipped, nested groups,
lying lengths). Every body goes through a raw unary call with identity serializers, so the service's
own decoding is what is tested. Each ``INVALID_ARGUMENT`` message must name a ScoreRequest field path
(``candidates[3].id: ...``, checked against the message descriptor) or the message type (``request is
not a valid ScoreRequest``).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable

import grpc

from ...client import build_request
from ...examples import EXAMPLE_MEMBER, example_candidates
from ...serving.scoring.config import ScoringServiceConfig
from .config import FaultsConfig
from .load import CRASH_CODES, OK, describe_codes
from .report import CaseResult, below, info, zero
from .stack import Stack, rss_bytes

SCORE_METHOD = "/slimserve.v1.ScoringService/Score"
UNDECODABLE_MESSAGE = "request is not a valid ScoreRequest"
WARMUP_CALLS = 20
EXAMPLES_KEPT = 5
_PATH_PART = re.compile(r"^([a-z_][a-z0-9_]*)(\[\d+\])?$")

Mutation = Callable[[random.Random, object], None]


def base_request():
    """The valid request every mutation starts from (the example member, 4 candidates)."""
    return build_request(EXAMPLE_MEMBER, example_candidates(4))


def _limits() -> ScoringServiceConfig:
    return ScoringServiceConfig()


def _some(rng: random.Random, repeated) -> object:
    return repeated[rng.randrange(len(repeated))]


def _set_one(rng: random.Random, places: list[tuple[object, str, object]]) -> None:
    """Set one of ``places`` (message, field, value), chosen by ``rng``."""
    message, field, value = rng.choice(places)
    setattr(message, field, value)


def _bad_enum(rng, request) -> None:
    value = rng.choice([8, 99, 2**31 - 1, -1, -(2**31)])
    places = [
        (request.member, "seniority", value),
        (_some(rng, request.candidates), "kind", value),
        (_some(rng, request.candidates), "seniority", value),
        (_some(rng, request.member.history), "kind", value),
    ]
    _set_one(rng, places)


def _not_finite(rng, request) -> None:
    request.member.years_experience = rng.choice([math.nan, math.inf, -math.inf, -1.0, 1e30])


def _huge_text(rng, request) -> None:
    limits = _limits()
    size = rng.choice([limits.max_text_chars + 1, 100_000, 1_000_000])
    if rng.random() < 0.2:
        request.member.skills.append("x" * size)
        return
    places = [
        (request.member, "headline", "x" * size),
        (_some(rng, request.candidates), "description", "x" * size),
        (_some(rng, request.candidates), "id", "i" * rng.choice([limits.max_id_chars + 1, size])),
        (request, "request_id", "r" * rng.choice([129, size])),
    ]
    _set_one(rng, places)


def _empty(rng, request) -> None:
    choice = rng.randrange(7)
    if choice == 0:
        request.ClearField("member")
    elif choice == 1:
        request.member.id = rng.choice(["", "   "])
    elif choice == 2:
        del request.candidates[:]
    elif choice == 3:
        request.top_k = 0
    elif choice == 4:
        _some(rng, request.candidates).id = ""
    elif choice == 5:
        _some(rng, request.member.history).item_title = ""
    else:
        request.member.Clear()


def _duplicate_ids(rng, request) -> None:
    first, second = rng.sample(range(len(request.candidates)), 2)
    request.candidates[second].id = request.candidates[first].id


def _repeated(rng, request) -> None:
    limits = _limits()
    count = rng.choice([2_000, 5_000])
    target = rng.randrange(5)
    if target == 0:  # thousands of candidates (copies of one)
        request.candidates.extend([request.candidates[0]] * count)
    elif target == 1:
        request.member.skills.extend(["python"] * count)
    elif target == 2:
        request.member.history.extend([request.member.history[0]] * count)
    elif target == 3:
        _some(rng, request.candidates).required_skills.extend(["go"] * count)
    else:  # just past each limit
        request.member.industries.extend(["software"] * (limits.max_list_items + 1))


def _control_chars(rng, request) -> None:
    text = "title" + rng.choice(["\x00", "\x1b[31m", "\x07", "\u0085", "\x7f"])
    places = [
        (request.member, "id", text),
        (_some(rng, request.candidates), "title", text),
        (request, "request_id", text),
    ]
    _set_one(rng, places)


def _odd_but_valid(rng, request) -> None:
    """Inputs a service must take: unusual Unicode, top_k past the candidates, an unknown enum-free edit."""
    choice = rng.randrange(3)
    if choice == 0:
        request.member.headline = "Ingénieure \u202eRTL\u202c 🚀 \ufeff日本語"
    elif choice == 1:
        request.top_k = 2**32 - 1
    else:
        request.member.years_experience = 0.0


MUTATIONS: dict[str, Mutation] = {
    "bad enum": _bad_enum,
    "NaN/inf/out of range": _not_finite,
    "huge field": _huge_text,
    "empty field": _empty,
    "duplicate ids": _duplicate_ids,
    "thousands of entries": _repeated,
    "control characters": _control_chars,
    "odd but valid": _odd_but_valid,
}
UNKNOWN_FIELD = b"\xf8\x07\x01"  # field 127, varint 1: must be ignored


def mutated_body(rng: random.Random) -> tuple[str, bytes]:
    """(kind, body) of a valid ScoreRequest with one mutation (sometimes an unknown field appended)."""
    request = base_request()
    kind = rng.choice(list(MUTATIONS))
    MUTATIONS[kind](rng, request)
    body = request.SerializeToString()
    if rng.random() < 0.1:
        return kind + " + unknown field", body + UNKNOWN_FIELD
    return kind, body


def raw_body(rng: random.Random, valid: bytes) -> tuple[str, bytes]:
    """(kind, body) of bytes that are at most partly a ScoreRequest."""
    choice = rng.randrange(6)
    if choice == 0:
        return "random bytes", rng.randbytes(rng.choice([0, 1, 7, 64, 512, 4096]))
    if choice == 1:
        return "truncated", valid[: rng.randrange(1, len(valid))]
    if choice == 2:
        flipped = bytearray(valid)
        for _ in range(rng.randint(1, 16)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        return "bit-flipped", bytes(flipped)
    if choice == 3:
        return "nested groups", b"\x7b" * rng.choice([100, 10_000])  # start-group of field 15, unclosed
    if choice == 4:
        return "lying length", b"\x0a\xff\xff\xff\xff\x07" + valid[:32]  # member claims 2 GiB
    return "valid + garbage", valid + rng.randbytes(rng.randint(1, 256))


def fuzz_body(seed: int, index: int, valid: bytes) -> tuple[str, str, bytes]:
    """(half, kind, body) of fuzz call ``index``: even indices mutate a message, odd ones send raw bytes."""
    rng = random.Random(seed * 1_000_003 + index)
    if index % 2 == 0:
        return ("mutated", *mutated_body(rng))
    return ("raw", *raw_body(rng, valid))


def names_a_field(details: str) -> bool:
    """The INVALID_ARGUMENT message names a ScoreRequest field path, or the message type."""
    from ...v1 import scoring_pb2

    if details == UNDECODABLE_MESSAGE:
        return True
    path, sep, _ = details.partition(": ")
    if not sep:
        return False
    descriptor = scoring_pb2.ScoreRequest.DESCRIPTOR
    for part in path.split("."):
        match = _PATH_PART.match(part)
        if descriptor is None or match is None or match.group(1) not in descriptor.fields_by_name:
            return False
        descriptor = descriptor.fields_by_name[match.group(1)].message_type
    return True


class _Tally:
    """Status codes per half, INVALID_ARGUMENT messages that name no field, examples of each problem."""

    def __init__(self) -> None:
        self.codes: dict[str, Counter[str]] = {"mutated": Counter(), "raw": Counter()}
        self.unnamed = 0
        self.examples: dict[str, list[str]] = {}
        self.slowest_s = 0.0

    def add(self, half: str, kind: str, code: str, details: str, seconds: float) -> None:
        self.codes[half][code] += 1
        self.slowest_s = max(self.slowest_s, seconds)
        problem = None
        if code in CRASH_CODES:
            problem = code
        elif code == "INVALID_ARGUMENT" and not names_a_field(details):
            self.unnamed += 1
            problem = "unnamed"
        elif code not in (OK, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
            problem = code
        if problem is not None:
            kept = self.examples.setdefault(problem, [])
            if len(kept) < EXAMPLES_KEPT:
                kept.append(f"{half}/{kind}: {details[:160]!r}")

    def total(self, code: str) -> int:
        return sum(counter[code] for counter in self.codes.values())


async def _send_all(target: str, config: FaultsConfig, tally: _Tally) -> None:
    valid = base_request().SerializeToString()
    counter = iter(range(config.fuzz_requests))
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(SCORE_METHOD)  # identity (de)serializers: bytes in, bytes out

        async def worker() -> None:
            for index in counter:
                half, kind, body = fuzz_body(config.seed, index, valid)
                started = time.perf_counter()
                try:
                    await call(body, timeout=max(10.0, config.deadline_s or 0.0))
                    code, details = OK, ""
                except grpc.aio.AioRpcError as exc:
                    code, details = exc.code().name, exc.details() or ""
                tally.add(half, kind, code, details, time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(config.fuzz_concurrency)))


async def _valid_calls(target: str, count: int) -> int:
    """Send ``count`` valid Score calls; how many succeeded."""
    from ...v1 import scoring_pb2_grpc

    request, ok = base_request(), 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        for _ in range(count):
            try:
                await stub.Score(request, timeout=30)
                ok += 1
            except grpc.aio.AioRpcError:
                pass
    return ok


def run_fuzz(stack: Stack, config: FaultsConfig) -> CaseResult:
    """``config.fuzz_requests`` malformed calls against a fresh service; codes, messages, crashes, RSS."""
    tally = _Tally()
    with stack.service() as service:
        asyncio.run(_valid_calls(service.target, WARMUP_CALLS))
        rss_before = rss_bytes(service.pid)
        asyncio.run(_send_all(service.target, config, tally))
        alive = service.process.poll() is None
        valid_after = asyncio.run(_valid_calls(service.target, WARMUP_CALLS)) if alive else 0
        rss_after = rss_bytes(service.pid)
    growth = (rss_after - rss_before) / rss_before * 100 if rss_before and alive else float("nan")
    result = CaseResult("fuzz")
    result.figures = [
        info(
            "calls (mutated / raw)",
            f"{sum(tally.codes['mutated'].values())} / {sum(tally.codes['raw'].values())}",
        ),
        zero("crashes (service exited)", 0 if alive else 1),
        zero("UNKNOWN or INTERNAL", sum(tally.total(code) for code in CRASH_CODES)),
        zero("INVALID_ARGUMENT naming no field", tally.unnamed),
        zero(
            "other codes (not OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED)",
            sum(sum(c.values()) for c in tally.codes.values())
            - sum(tally.total(code) for code in (OK, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")),
        ),
        info("codes (mutated)", describe_codes(tally.codes["mutated"])),
        info("codes (raw)", describe_codes(tally.codes["raw"])),
        zero("valid calls failing afterwards", WARMUP_CALLS - valid_after),
        info("service RSS before / after", f"{rss_before / 2**20:.0f} / {rss_after / 2**20:.0f} MiB"),
        below("service RSS growth", growth, 10.0, unit="%", strict=False),
        info("slowest answer", tally.slowest_s, unit="s"),
    ]
    if tally.total("RESOURCE_EXHAUSTED"):
        result.notes.append(
            "RESOURCE_EXHAUSTED: admission refused calls of thousands of candidates while others were in "
            "flight (admission runs before validation, by design)"
        )
    for problem, kept in tally.examples.items():
        result.notes.append(f"{problem}: " + "; ".join(kept))
    return result
