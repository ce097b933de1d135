"""Run the chosen fault cases, in a fixed order, against one stack; each case gets a fresh service."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .config import FaultsConfig
from .drain import run_drain
from .fuzz import run_fuzz
from .overload import Capacity, load_deadline, measure_capacity, run_overload
from .publish import run_publish
from .report import CaseResult
from .soak import run_soak
from .stack import Stack, open_stack
from .triton_faults import run_freeze, run_kill

log = logging.getLogger(__name__)


def load_requests(config: FaultsConfig) -> list:
    """The load's ScoreRequests: real prompts from a dataset split, as ``bench grpc`` sends them."""
    from ..grpc_load import score_requests
    from ..workload import load_calls

    calls, source = load_calls(config.dataset, requests=config.requests, candidates=config.candidates)
    log.info("load: %d requests of %d candidates from %s", len(calls), config.candidates, source)
    return score_requests(calls)


class _Run:
    """One run's stack, requests and (measured once, when a case needs it) capacity."""

    def __init__(self, stack: Stack, config: FaultsConfig):
        self.stack = stack
        self.config = config
        self.requests = load_requests(config)
        self._capacity: Capacity | None = None

    @property
    def capacity(self) -> Capacity:
        if self._capacity is None:
            self._capacity = measure_capacity(self.stack, self.config, self.requests)
            log.info("capacity: %s", self._capacity.describe())
        return self._capacity

    def cases(self) -> list[tuple[str, Callable[[], CaseResult]]]:
        stack, config, requests = self.stack, self.config, self.requests
        runs: dict[str, Callable[[], CaseResult]] = {
            "fuzz": lambda: run_fuzz(stack, config),
            "overload": lambda: run_overload(stack, config, requests, self.capacity),
            "kill": lambda: run_kill(stack, config, requests),
            "freeze": lambda: run_freeze(stack, config, requests),
            "drain": lambda: run_drain(stack, config, requests),
            "publish": lambda: run_publish(stack, config, requests),
        }
        chosen = [(case, runs[case]) for case in config.ordered_cases()]
        if config.soak_minutes > 0:  # before publish: its new version must not be there during the soak
            at = next((i for i, (case, _) in enumerate(chosen) if case == "publish"), len(chosen))
            chosen.insert(at, ("soak", lambda: run_soak(stack, config, requests, self.capacity)))
        return chosen


def run_faults(
    config: FaultsConfig, on_result: Callable[[CaseResult], None] | None = None
) -> list[CaseResult]:
    """Start the stack, run every chosen case (``on_result`` after each), stop the stack."""
    results = []
    with open_stack(config) as stack:
        run = _Run(stack, config)
        if config.deadline_s is None:  # sized from the capacity, measured once for the run
            run.config = config = config.with_deadline(load_deadline(run.capacity, config.load_workers))
            log.info(
                "load deadline %.1f s, freeze %.1f s (from the capacity)",
                config.deadline_s,
                config.freeze_seconds,
            )
        for case, function in run.cases():
            log.info("fault case %s", case)
            started = time.perf_counter()
            result = function()
            result.seconds = time.perf_counter() - started
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
