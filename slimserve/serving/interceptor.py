"""The one place exceptions become gRPC statuses, plus the server interceptor that applies it.

``status_for`` is the error table: a ``ServingError`` keeps its code and client-safe message, a
cancellation is CANCELLED, anything else is INTERNAL with a generic message (traceback in the log only).
``ServingInterceptor`` wraps every ``/slimserve.*`` method (unary and streaming): it assigns the
request id (put in a contextvar that ``RequestIdFilter`` adds to log records), records metrics and
aborts with the mapped status. A request id comes from the request's ``request_id`` field, else the
``x-request-id`` metadata, else a fresh uuid4 hex; it is sent back as ``x-request-id`` trailing metadata.

Before the servicer runs, the interceptor also refuses a body that does not decode (INVALID_ARGUMENT
naming the message type, where grpc alone would answer UNKNOWN with a Python class name) and takes the
request's cost from the admission budget (``serving.admission``: RESOURCE_EXHAUSTED with a retry hint).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc

from .admission import Admission, Cost, Overloaded, WorkBudget
from .errors import InvalidArgument, ServingError, Unavailable, UndecodableRequest
from .metrics import ServingMetrics

log = logging.getLogger(__name__)

REQUEST_ID_METADATA = "x-request-id"
MAX_REQUEST_ID_CHARS = 128
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("slimserve_request_id", default="-")


def current_request_id() -> str:
    """The request id of the RPC this code runs for ("-" outside any RPC)."""
    return request_id_var.get()


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (the current RPC's id, or "-") so formats can show it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


def status_for(exc: BaseException, request_id: str = "") -> tuple[grpc.StatusCode, str]:
    """Map an exception to (status code, message for the client); log unexpected ones with traceback."""
    if isinstance(exc, ServingError):
        return exc.code, exc.message
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED, "request cancelled"
    rid = request_id or request_id_var.get()
    log.error("unexpected error (request id %s)", rid, exc_info=(type(exc), exc, exc.__traceback__))
    return grpc.StatusCode.INTERNAL, f"internal error (request id {rid})"


def check_request_id(value: str, field: str) -> str:
    """A client-sent request id, refused when too long or not printable (it goes into logs)."""
    if len(value) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_REQUEST_ID_CHARS} characters")
    if not value.isprintable():
        raise InvalidArgument(field, "contains control or non-printable characters")
    return value


def _metadata_request_id(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():
        if key == REQUEST_ID_METADATA and isinstance(value, str):
            return value
    return ""


class _Undecodable:
    """What the lenient deserializer returns for a body that is not a valid message."""

    def __init__(self, message_type: str):
        self.message_type = message_type


def lenient_deserializer(deserializer: Callable | None) -> Callable | None:
    """``deserializer`` returning an ``_Undecodable`` instead of raising (the call then fails
    INVALID_ARGUMENT through the interceptor, not UNKNOWN inside grpc)."""
    if deserializer is None:
        return None
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    message_type = descriptor.name if descriptor is not None else "request message"

    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception:
            return _Undecodable(message_type)

    return deserialize


class CallGate:
    """The RPCs in flight, and whether new ones are still let in (the drain closes it: a call that
    arrives then is answered UNAVAILABLE by the interceptor, not cut by the server's stop)."""

    POLL_S = 0.01

    def __init__(self) -> None:
        self.in_flight = 0
        self.closed = False

    def enter(self) -> None:
        if self.closed:
            raise Unavailable("the service is shutting down: retry (another replica takes the call)")
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no RPC is in flight (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.POLL_S)
        return True


class _Call:
    """Bookkeeping of one RPC: id, metrics, admitted work, final status."""

    def __init__(
        self,
        metrics: ServingMetrics | None,
        method: str,
        metadata_id: str,
        budget: WorkBudget | None = None,
        cost: Cost | None = None,
        gate: CallGate | None = None,
    ):
        self.metrics = metrics
        self.method = method
        self.metadata_id = metadata_id
        self.gate = gate
        self.entered = False
        self.budget = budget if cost is not None else None
        self.cost = cost
        self.held: deque[int] = deque()  # admitted units, oldest request first
        self.start = time.perf_counter()
        self.code = grpc.StatusCode.OK
        self.token: contextvars.Token | None = None

    def begin(self, request: object | None) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.labels(self.method).inc()
        self.token = request_id_var.set(uuid.uuid4().hex)  # until a client id is checked
        field_id = getattr(request, "request_id", "") if request is not None else ""
        if field_id:
            request_id_var.set(check_request_id(field_id, "request_id"))
        elif self.metadata_id:
            request_id_var.set(check_request_id(self.metadata_id, REQUEST_ID_METADATA))
        if self.gate is not None:
            self.gate.enter()
            self.entered = True
        if request is not None:
            self.admit(request)

    def admit(self, request: object) -> None:
        """Refuse an undecodable body; take the request's cost from the budget (or raise Overloaded)."""
        if isinstance(request, _Undecodable):
            raise UndecodableRequest(request.message_type)
        if self.budget is not None and self.cost is not None:
            self.held.append(self.budget.acquire(self.cost(request)))

    def answered(self) -> None:
        """A streamed request got its answer: give back its units."""
        if self.held and self.budget is not None:
            self.budget.release(self.held.popleft())

    async def requests(self, iterator: AsyncIterator) -> AsyncIterator:
        """The request stream, each message checked and admitted as it is read."""
        async for request in iterator:
            self.admit(request)
            yield request

    async def fail(self, exc: BaseException, context: grpc.aio.ServicerContext) -> None:
        # the status reaches the client inside abort(): give the work back first, so a caller that
        # retries on the answer finds the budget free
        self.release_all()
        if isinstance(exc, grpc.aio.AbortError):  # the handler aborted itself
            self.code = _context_code(context) or grpc.StatusCode.UNKNOWN
            raise exc
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # client left or deadline passed
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            self.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            raise exc
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
            self.code = grpc.StatusCode.UNAVAILABLE
            raise exc
        self.code, message = status_for(exc)
        if self.code != grpc.StatusCode.INTERNAL:
            log.info("%s failed: %s %s", self.method, self.code.name, message)
        trailer = self.trailer()
        if isinstance(exc, Overloaded):
            trailer += exc.trailing_metadata()
        await context.abort(self.code, message, trailing_metadata=trailer)

    def trailer(self) -> tuple[tuple[str, str], ...]:
        return ((REQUEST_ID_METADATA, request_id_var.get()),)

    def release_all(self) -> None:
        while self.held:
            self.answered()

    def end(self) -> None:
        self.release_all()
        if self.entered:
            self.gate.leave()
        if self.metrics is not None and self.token is not None:
            elapsed = time.perf_counter() - self.start
            self.metrics.in_flight.labels(self.method).dec()
            self.metrics.requests.labels(self.method, self.code.name).inc()
            self.metrics.latency.labels(self.method, self.code.name).observe(elapsed)
        log.debug("%s %s in %.1f ms", self.method, self.code.name, (time.perf_counter() - self.start) * 1e3)
        if self.token is not None:
            # ValueError: finalised in another context (an async generator closed elsewhere)
            with contextlib.suppress(ValueError):
                request_id_var.reset(self.token)


def _context_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, int):  # some grpcio versions return the raw integer
        return next((c for c in grpc.StatusCode if c.value[0] == code), None)
    return code


def _wrap_unary_response(behavior: Callable, call_factory: Callable[[], _Call], streaming_request: bool):
    async def wrapper(request_or_iterator, context):
        call = call_factory()
        try:
            call.begin(None if streaming_request else request_or_iterator)
            if streaming_request:
                request_or_iterator = call.requests(request_or_iterator)
            response = await behavior(request_or_iterator, context)
            context.set_trailing_metadata(call.trailer())
            return response
        except BaseException as exc:
            await call.fail(exc, context)
        finally:
            call.end()

    return wrapper


def _wrap_stream_response(behavior: Callable, call_factory: Callable[[], _Call], streaming_request: bool):
    if not inspect.isasyncgenfunction(behavior):  # writes through context.write
        return _wrap_unary_response(behavior, call_factory, streaming_request)

    async def wrapper(request_or_iterator, context):
        call = call_factory()
        try:
            call.begin(None if streaming_request else request_or_iterator)
            if streaming_request:
                request_or_iterator = call.requests(request_or_iterator)
            async for response in behavior(request_or_iterator, context):
                if streaming_request:
                    call.answered()  # one answer per request, in order (ScoreStream)
                yield response
            context.set_trailing_metadata(call.trailer())
        except BaseException as exc:
            await call.fail(exc, context)
        finally:
            call.end()

    return wrapper


class ServingInterceptor(grpc.aio.ServerInterceptor):
    """Request ids, metrics, error mapping, undecodable bodies, admission and the drain's ``gate`` for
    every method whose name starts with ``prefix``."""

    def __init__(
        self,
        metrics: ServingMetrics | None = None,
        prefix: str = "/slimserve.",
        admission: Admission | None = None,
        gate: CallGate | None = None,
    ):
        self._metrics = metrics
        self._prefix = prefix
        self._admission = admission
        self._gate = gate

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefix):
            return handler
        method = handler_call_details.method.rsplit(".", 1)[-1]  # e.g. ScoringService/Score
        metadata_id = _metadata_request_id(handler_call_details)
        admission = self._admission
        budget = admission.budget if admission is not None else None
        cost = admission.cost_of(method) if admission is not None else None

        def call_factory() -> _Call:
            return _Call(self._metrics, method, metadata_id, budget, cost, self._gate)

        codec = {
            "request_deserializer": lenient_deserializer(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            fn = _wrap_unary_response(handler.unary_unary, call_factory, False)
            return grpc.unary_unary_rpc_method_handler(fn, **codec)
        if handler.stream_unary:
            fn = _wrap_unary_response(handler.stream_unary, call_factory, True)
            return grpc.stream_unary_rpc_method_handler(fn, **codec)
        if handler.unary_stream:
            fn = _wrap_stream_response(handler.unary_stream, call_factory, False)
            return grpc.unary_stream_rpc_method_handler(fn, **codec)
        fn = _wrap_stream_response(handler.stream_stream, call_factory, True)
        return grpc.stream_stream_rpc_method_handler(fn, **codec)
