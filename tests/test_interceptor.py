"""The error table, row by row: each serving error keeps its code and message; the rest is INTERNAL."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from slimserve.serving import errors
from slimserve.serving.admission import Overloaded
from slimserve.serving.interceptor import RequestIdFilter, check_request_id, request_id_var, status_for

TABLE = [
    (errors.InvalidArgument("candidates[3].id", "required"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.UndecodableRequest("ScoreRequest"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ResourceExhausted("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable("triton down"), grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded("too slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Cancelled("gone"), grpc.StatusCode.CANCELLED),
    (errors.FailedPrecondition("hash mismatch"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.InternalError("broken"), grpc.StatusCode.INTERNAL),
]


def test_every_serving_error_is_in_the_table():
    covered = {type(exc) for exc, _ in TABLE}
    assert covered == set(errors.ServingError.__subclasses__())


@pytest.mark.parametrize(("exc", "code"), TABLE, ids=lambda v: type(v).__name__)
def test_serving_error_row(exc, code):
    assert status_for(exc) == (code, exc.message)


def test_invalid_argument_message_names_field():
    _, message = status_for(errors.InvalidArgument("member.id", "required (empty)"))
    assert message == "member.id: required (empty)"


def test_undecodable_body_names_the_message_type_only():
    assert status_for(errors.UndecodableRequest("ScoreRequest"))[1] == "request is not a valid ScoreRequest"


def test_overloaded_is_resource_exhausted_with_its_retry_hint():
    exc = Overloaded("over capacity", retry_after_ms=120)
    assert status_for(exc) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "over capacity")
    assert exc.trailing_metadata() == (("grpc-retry-pushback-ms", "120"),)


def test_cancellation_maps_to_cancelled():
    assert status_for(asyncio.CancelledError())[0] == grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("exc", [ValueError("secret /etc/passwd"), KeyError("token"), ZeroDivisionError()])
def test_unexpected_error_is_internal_and_generic(exc, caplog):
    try:
        raise exc
    except Exception as raised:
        with caplog.at_level(logging.ERROR, logger="slimserve.serving.interceptor"):
            code, message = status_for(raised, request_id="abc123")
    assert code == grpc.StatusCode.INTERNAL
    assert message == "internal error (request id abc123)"
    assert "secret" not in message and "token" not in message
    assert "Traceback" in caplog.text  # the details stay in the log


def test_request_id_checks():
    assert check_request_id("req-1", "request_id") == "req-1"
    with pytest.raises(errors.InvalidArgument) as info:
        check_request_id("a\nb", "request_id")
    assert info.value.field == "request_id"
    with pytest.raises(errors.InvalidArgument):
        check_request_id("x" * 1000, "x-request-id")


def test_log_filter_adds_request_id():
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "msg", (), None)
    token = request_id_var.set("rid-42")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id_var.reset(token)
    assert record.request_id == "rid-42"
