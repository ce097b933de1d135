"""Triton faults under load: killed (SIGKILL to its process group) then restarted; frozen (SIGSTOP to the
server process) then resumed (SIGCONT). The service is never restarted; its health is watched throughout.
Each fault strikes once a call has succeeded and another is in flight.

Killed: calls must fail UNAVAILABLE at once, health turn NOT_SERVING, and both come back by themselves
once a new Triton is ready on the same port. Frozen: Triton keeps its connections but answers nothing,
so every call must end DEADLINE_EXCEEDED by its deadline, or UNAVAILABLE at once once the
service's health check has found Triton unresponsive (none may hang), and serve again after SIGCONT.
"""

from __future__ import annotations

import asyncio
import signal
import time

from .config import FaultsConfig
from .load import OK, codes, describe_codes, under_load, until_serving_and_busy, wait_until
from .report import CaseResult, below, info, zero
from .stack import Stack

UNAVAILABLE = "UNAVAILABLE"
DEADLINE = "DEADLINE_EXCEEDED"
# How a call may end while Triton is frozen: at its deadline, or refused at once once health has noticed.
ENDED = (DEADLINE, UNAVAILABLE)
RECOVERY_TIMEOUT_S = 60.0


def _first_after(outcomes, code: str, moment: float, sent_after: bool = True) -> float | None:
    """Seconds from ``moment`` to the first answer with ``code`` after it, among calls sent after it
    (``sent_after``) or among all calls (those in flight at that moment too)."""
    times = [
        o.finished
        for o in outcomes
        if o.code == code and o.finished >= moment and (o.sent >= moment or not sent_after)
    ]
    return min(times) - moment if times else None


async def _kill(stack: Stack, target: str, requests: list, config: FaultsConfig) -> CaseResult:
    async with under_load(target, requests, config.deadline_s, config.load_workers) as (call, health):
        await asyncio.sleep(config.observe_seconds)
        await until_serving_and_busy(call, RECOVERY_TIMEOUT_S)
        killed = time.perf_counter()
        stack.signal_triton(signal.SIGKILL)
        await asyncio.to_thread(stack.triton.stop)  # reap the group
        await asyncio.sleep(config.outage_seconds)
        restarting = time.perf_counter()
        await asyncio.to_thread(stack.start_triton)
        back = time.perf_counter()
        serving_after = await wait_until(
            lambda: health.first("SERVING", back) is not None, RECOVERY_TIMEOUT_S
        )
        await wait_until(lambda: _first_after(call.outcomes, OK, back) is not None, RECOVERY_TIMEOUT_S)
        await asyncio.sleep(config.observe_seconds)
    before = call.between(0, killed)
    outage = call.between(killed, restarting)
    failed = [o for o in call.outcomes if o.code == UNAVAILABLE]
    result = CaseResult("Triton killed")
    result.figures = [
        info("load deadline", config.deadline_s, unit="s"),
        info("OK before the kill", codes(before)[OK]),
        below(
            "first UNAVAILABLE after the kill",
            _first_after(call.outcomes, UNAVAILABLE, killed, sent_after=False),
            1.0,
        ),
        below(
            "slowest UNAVAILABLE, from the kill (or its send, if later)",
            max((o.finished - max(o.sent, killed) for o in failed), default=None),
            1.0,
        ),
        info(
            "slowest UNAVAILABLE, from its send",
            max((o.seconds for o in failed), default=float("nan")),
            unit="s",
        ),
        zero("calls during the outage not UNAVAILABLE", sum(1 for o in outage if o.code != UNAVAILABLE)),
        info("codes during the outage", describe_codes(codes(outage))),
        below("health NOT_SERVING after the kill", health.first("NOT_SERVING", killed), 2.0),
        info("Triton restart (start to ready)", back - restarting, unit="s"),
        below("health SERVING after Triton is back", serving_after, 5.0),
        info("first OK after Triton is back", _first_after(call.outcomes, OK, back), unit="s"),
        zero(
            "calls past their deadline",
            sum(1 for o in call.outcomes if o.seconds > config.deadline_s + config.late_slack_s),
        ),
    ]
    return result


async def _freeze(stack: Stack, target: str, requests: list, config: FaultsConfig) -> CaseResult:
    async with under_load(target, requests, config.deadline_s, config.load_workers) as (call, health):
        await asyncio.sleep(config.observe_seconds)
        await until_serving_and_busy(call, RECOVERY_TIMEOUT_S)
        stack.freeze_triton()
        frozen = time.perf_counter()  # once the server is stopped: calls sent from now cannot be answered
        try:
            await asyncio.sleep(config.freeze_seconds)
        finally:
            stack.resume_triton()
        resumed = time.perf_counter()
        await wait_until(lambda: _first_after(call.outcomes, OK, resumed) is not None, RECOVERY_TIMEOUT_S)
        await asyncio.sleep(config.observe_seconds)
    # Calls sent while Triton was stopped and due before it resumed: none may succeed or hang.
    due = call.between(frozen, resumed - config.deadline_s)
    expired = [o for o in call.outcomes if o.code == DEADLINE]
    late = [o for o in call.outcomes if o.seconds > config.deadline_s + config.late_slack_s]
    result = CaseResult("Triton frozen")
    result.figures = [
        info("frozen for (load deadline)", f"{config.freeze_seconds:.1f} s ({config.deadline_s:.1f} s)"),
        info("calls due while frozen", len(due)),
        zero("of those, not DEADLINE_EXCEEDED (or UNAVAILABLE)", sum(1 for o in due if o.code not in ENDED)),
        info("codes while frozen", describe_codes(codes(call.between(frozen, resumed)))),
        info(
            "slowest DEADLINE_EXCEEDED call",
            max((o.seconds for o in expired), default=float("nan")),
            unit="s",
        ),
        zero("calls past their deadline (hung)", len(late)),
        info("health while frozen", describe_codes(health.seen(frozen, resumed))),
        below("first OK after SIGCONT", _first_after(call.outcomes, OK, resumed), 5.0),
    ]
    return result


def run_kill(stack: Stack, config: FaultsConfig, requests: list) -> CaseResult:
    with stack.service() as service:
        result = asyncio.run(_kill(stack, service.target, requests, config))
        result.figures.append(zero("service restarts", 0 if service.process.poll() is None else 1))
    return result


def run_freeze(stack: Stack, config: FaultsConfig, requests: list) -> CaseResult:
    with stack.service() as service:
        result = asyncio.run(_freeze(stack, service.target, requests, config))
        result.figures.append(zero("service restarts", 0 if service.process.poll() is None else 1))
    return result
