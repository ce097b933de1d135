"""``slimserve bench faults`` on the tiny scorer: real Triton, real service processes, short bounds.

One run of every case (and a short soak) for the module; each test checks one case's correctness
figures: status codes, calls lost, crashes. No test asserts a speed or a memory figure (the command
reports those, with their targets).
"""

from __future__ import annotations

import json
import math

import pytest

from slimserve.bench.faults import FaultsConfig, format_faults_table, run_faults
from slimserve.bench.faults.fuzz import UNDECODABLE_MESSAGE, fuzz_body, names_a_field
from slimserve.bench.faults.overload import Capacity, load_deadline
from slimserve.bench.faults.report import CaseResult, Figure
from slimserve.bundle import bundle_dir_for
from slimserve.cli import build_parser
from slimserve.settings import config_from_args


def short_config(repository, work_dir, **overrides) -> FaultsConfig:
    settings = {
        "model_repository": repository,
        "work_dir": work_dir,
        "requests": 16,
        "candidates": 4,
        "deadline_s": 3.0,
        "fuzz_requests": 500,
        "fuzz_concurrency": 4,
        "capacity_concurrency": (1, 2),
        "capacity_seconds": 1.0,
        "overload_seconds": 2.0,
        "observe_seconds": 1.0,
        "outage_seconds": 1.0,
        "freeze_seconds": 7.0,
        # A hang lasts until SIGCONT (up to 7 s); 2 s past a 3 s deadline leaves room for 2 busy cores.
        "late_slack_s": 2.0,
        "soak_minutes": 0.1,
        "soak_warmup_minutes": 0.05,
        "startup_timeout_s": 120.0,
        **overrides,
    }
    return FaultsConfig(**settings)


@pytest.fixture(scope="module")
def faults(tiny_repository, tmp_path_factory) -> dict[str, CaseResult]:
    """Every case once against the tiny scorer; results by case name."""
    config = short_config(tiny_repository, tmp_path_factory.mktemp("faults"))
    return {result.case: result for result in run_faults(config)}


# -- pure parts ------------------------------------------------------------------------------------------
def test_field_names_are_checked_against_the_message():
    assert names_a_field("candidates[3].id: duplicate of candidates[0].id")
    assert names_a_field("member.history[2].kind: unknown enum value 99")
    assert names_a_field("top_k: must be at least 1")
    assert names_a_field(UNDECODABLE_MESSAGE)
    assert not names_a_field("member.nickname: required")
    assert not names_a_field("Unexpected <class 'google.protobuf.message.DecodeError'>")
    assert not names_a_field("internal error (request id 1)")


def test_fuzz_corpus_is_reproducible_and_half_raw():
    valid = b"\x0a\x02\x0a\x00"
    first = [fuzz_body(3, i, valid) for i in range(40)]
    assert first == [fuzz_body(3, i, valid) for i in range(40)]
    assert [half for half, _, _ in first] == ["mutated", "raw"] * 20


def test_flags_come_from_the_config():
    args = build_parser().parse_args(
        ["bench", "faults", "--cases", "kill,fuzz", "--fuzz-requests", "500", "--capacity-concurrency", "1,4"]
    )
    config = config_from_args(FaultsConfig, args, environ={})
    assert config.fuzz_requests == 500
    assert config.capacity_concurrency == (1, 4)
    assert config.ordered_cases() == ("fuzz", "kill")


def test_freeze_must_outlast_two_deadlines(tmp_path):
    with pytest.raises(ValueError, match="twice deadline_s"):
        FaultsConfig(model_repository=tmp_path, deadline_s=2.0, freeze_seconds=3.0)


def test_an_unset_deadline_is_sized_from_the_capacity(tmp_path):
    config = FaultsConfig(model_repository=tmp_path, load_workers=4)
    assert config.deadline_s is None and config.freeze_seconds is None
    slow = Capacity(1.8, 2, 1500.0, ())  # 2 calls in flight at capacity, p99 1.5 s
    assert load_deadline(slow, workers=4) == pytest.approx(9.0)  # 3 x 1.5 s x (4 in flight / 2)
    assert load_deadline(Capacity(90.0, 8, 40.0, ()), workers=4) == 2.0  # never below 2 s
    sized = config.with_deadline(9.0)
    assert (sized.deadline_s, sized.freeze_seconds) == (9.0, 22.5)
    assert (
        FaultsConfig(model_repository=tmp_path, freeze_seconds=30.0).with_deadline(9.0).freeze_seconds == 30.0
    )


def test_table_marks_missed_targets():
    result = CaseResult("demo", [Figure("lost", 2, "0", False), Figure("calls", 10)], ["a note"])
    table = format_faults_table([result])
    assert "| demo (0 s) | lost | 2 | 0 | **NO** |" in table
    assert "- demo: a note" in table
    assert json.dumps(result.as_dict())


# -- the run ---------------------------------------------------------------------------------------------
def test_runs_every_case_in_order(faults):
    assert list(faults) == [
        "fuzz",
        "overload",
        "Triton killed",
        "Triton frozen",
        "SIGTERM under load",
        "soak",
        "new version published",
    ]
    table = format_faults_table(list(faults.values()))
    assert all(f"| {case} (" in table for case in faults)


def test_fuzz_never_crashes_and_names_the_field(faults):
    fuzz = faults["fuzz"]
    assert fuzz.value("crashes (service exited)") == 0
    assert fuzz.value("UNKNOWN or INTERNAL") == 0, fuzz.notes
    assert fuzz.value("INVALID_ARGUMENT naming no field") == 0, fuzz.notes
    assert fuzz.value("other codes (not OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED)") == 0, fuzz.notes
    assert fuzz.value("valid calls failing afterwards") == 0
    assert fuzz.value("calls (mutated / raw)") == "250 / 250"
    assert "INVALID_ARGUMENT" in fuzz.value("codes (raw)")


def test_overload_refuses_at_once_and_loses_nothing(faults):
    overload = faults["overload"]
    accepted, refused = (int(n) for n in overload.value("calls accepted / refused").split(" / "))
    assert accepted > 0 and refused > 0
    assert overload.value("other failures") == 0, overload.value("codes")


def test_triton_killed_fails_unavailable_and_recovers_without_restart(faults):
    killed = faults["Triton killed"]
    assert killed.value("OK before the kill") > 0
    assert killed.value("calls during the outage not UNAVAILABLE") == 0, killed.value(
        "codes during the outage"
    )
    for name in (
        "first UNAVAILABLE after the kill",
        "health NOT_SERVING after the kill",
        "health SERVING after Triton is back",
        "first OK after Triton is back",
    ):
        assert not math.isnan(killed.value(name)), f"{name}: never happened"
    assert killed.value("service restarts") == 0


def test_triton_frozen_ends_calls_by_their_deadline(faults):
    frozen = faults["Triton frozen"]
    assert frozen.value("calls due while frozen") > 0
    assert frozen.value("of those, not DEADLINE_EXCEEDED (or UNAVAILABLE)") == 0, frozen.value(
        "codes while frozen"
    )
    assert frozen.value("calls past their deadline (hung)") == 0
    assert not math.isnan(frozen.value("first OK after SIGCONT")), "no call succeeded after SIGCONT"
    assert frozen.value("service restarts") == 0


def test_sigterm_loses_no_accepted_call(faults):
    drain = faults["SIGTERM under load"]
    assert drain.value("calls in flight at SIGTERM") > 0
    assert drain.value("accepted calls lost") == 0, drain.value("codes after SIGTERM")
    assert drain.value("exit code") == 0
    assert "UNAVAILABLE" in drain.value("codes after SIGTERM")  # new calls refused


def test_publishing_a_version_fails_no_call(faults, tiny_repository):
    published = faults["new version published"]
    assert published.value("calls after publishing") > 0
    assert published.value("failed calls") == 0, published.value("codes")
    assert published.value("answers from another version or bundle") == 0
    assert published.value("health not SERVING after publishing") == 0
    assert bundle_dir_for(tiny_repository, "scorer").parent.name == "1"  # the user's repository untouched


def test_soak_has_no_errors(faults):
    assert faults["soak"].value("errors") == 0, faults["soak"].value("codes")
