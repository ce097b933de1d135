"""SIGTERM to the service under load: the calls it accepted are answered, new ones are refused.

The drain (``serving.server``): health NOT_SERVING at once, new calls still taken for ``drain_delay_s``
(those already on the wire), then refused by the service itself (UNAVAILABLE, ``interceptor.CallGate``)
while the calls in flight finish within ``drain_grace_s``; then the server stops and the process exits 0. A call in flight at the signal that does not end OK is an
accepted call lost; so is a later call that ends with anything but OK or UNAVAILABLE (the server took it
and dropped it), except a CANCELLED one answered between the end of ``drain_delay_s`` and the exit: gRPC
cancels the calls no handler has taken yet when the server stops (counted apart). The fault strikes once
a call has succeeded and another is in flight, so there is always a call in flight at the signal.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

from .config import FaultsConfig
from .load import OK, codes, describe_codes, under_load, until_serving_and_busy
from .report import CaseResult, below, info, zero
from .stack import Stack, service_default

REFUSED = "UNAVAILABLE"
# How gRPC ends a call that reached the server but no handler yet when the server shuts down (it
# never ran). Before the service refused new calls itself, seen for calls sent in the last milliseconds
# of drain_delay_s; now only a call arriving as the server stops can meet it.
CUT = "CANCELLED"
AFTER_EXIT_S = 0.5  # load kept running after the exit, so calls meet a closed port too
EXIT_SLACK_S = 30.0


def _wait_exit(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


async def _drain(
    process: subprocess.Popen, target: str, requests: list, config: FaultsConfig, grace_s: float
):
    async with under_load(target, requests, config.deadline_s, config.load_workers, 0.02) as (call, health):
        await asyncio.sleep(config.observe_seconds)
        await until_serving_and_busy(call, config.startup_timeout_s)
        signalled = time.perf_counter()  # the calls in flight now are in flight at the signal
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(_wait_exit, process, grace_s + EXIT_SLACK_S)
        exited = time.perf_counter()
        await asyncio.sleep(AFTER_EXIT_S)
    return call, health, signalled, exited, code


def run_drain(stack: Stack, config: FaultsConfig, requests: list) -> CaseResult:
    """SIGTERM a loaded service; count accepted calls lost and new calls refused; time the drain."""
    with stack.service() as service:
        grace_s = float(service_default("drain_grace_s"))
        call, health, signalled, exited, code = asyncio.run(
            _drain(service.process, service.target, requests, config, grace_s)
        )
    in_flight = [o for o in call.outcomes if o.in_flight_at(signalled)]
    later = call.between(signalled)
    stopping = signalled + float(service_default("drain_delay_s"))
    cut = [o for o in later if o.code == CUT and stopping <= o.finished <= exited]
    dropped = [o for o in later if o.code not in (OK, REFUSED) and o not in cut]
    during = call.between(signalled, exited)
    result = CaseResult("SIGTERM under load")
    result.figures = [
        info("calls in flight at SIGTERM", len(in_flight)),
        zero("accepted calls lost", sum(1 for o in in_flight if o.code != OK) + len(dropped)),
        info(
            "new calls during the drain: served / refused", f"{codes(during)[OK]} / {codes(during)[REFUSED]}"
        ),
        info("new calls cut at the server's stop (CANCELLED, never taken)", len(cut)),
        info("codes after SIGTERM", describe_codes(codes(later))),
        below("health NOT_SERVING after SIGTERM", health.first("NOT_SERVING", signalled), 1.0),
        info("drain (SIGTERM to exit)", exited - signalled, unit="s"),
        zero("exit code", -1 if code is None else code),
    ]
    if cut:
        result.notes.append(
            f"{len(cut)} new calls answered CANCELLED as the server stopped, after drain_delay_s: gRPC cancels "
            "calls that reached the server but no handler yet when it shuts down (a retry is safe)"
        )
    if not codes(later)[REFUSED]:
        result.notes.append("no new call met the closed server (the drain ended between two calls)")
    return result
