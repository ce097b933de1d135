"""The one module that imports ``tritonclient``: asyncio gRPC clients for the Triton models.

``TritonModelClient`` holds the control calls (readiness, config, statistics); ``TritonScorerClient``
sends unary score requests; ``TritonGeneratorClient`` streams tokens from the decoupled generator over
one gRPC stream per request. The channel is plaintext, TLS or mTLS as its ``ClientSecurity`` says (the
same credentials the CLI clients use, ``slimserve.channel``), for a Triton run with ``--grpc-use-ssl``.

Every tritonclient/gRPC error is mapped here, by status code, to a ``slimserve.serving.errors`` type; the
original exception stays chained (``raise ... from exc``) for the logs. Deadlines travel twice: as the
gRPC deadline (``client_timeout``) and as Triton's per-request queue ``timeout`` (microseconds), which
Triton applies only under a queue policy with a default timeout and ``allow_timeout_override: true``. The
exported scorers have none (it brings 500 ms stalls, docs/bench.md "Tail latency"): for them the gRPC
deadline ends a late request, Triton dropping it from its queue. Cancelling the awaiting task cancels
the gRPC call (grpc.aio does this; Triton then cancels the request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from slimserve.bundle import TensorNames
from slimserve.channel import PLAINTEXT, ClientSecurity
from slimserve.serving.errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    ResourceExhausted,
    ServingError,
    Unavailable,
)

__all__ = [
    "GenerationRequest",
    "GenerationStep",
    "InferResult",
    "ModelStats",
    "TritonGeneratorClient",
    "TritonModelClient",
    "TritonScorerClient",
    "map_stream_error",
    "map_triton_error",
    "unreachable_reason",
]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# Triton's defaults reject pings more often than every 5 min without data (and pings without calls), so
# ping only during calls, at most twice without data: enough to notice a dead peer, never a GOAWAY.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 2),
    # A DNS name with several addresses (a Kubernetes headless Service over the Triton pods) spreads the
    # requests over all of them; with one address it behaves as the default (pick_first).
    ("grpc.lb_policy_name", "round_robin"),
]
DEFAULT_CONTROL_TIMEOUT_S = 5.0
DEFAULT_TENSORS = TensorNames()

# Triton 2.51 reports these two as UNAVAILABLE; only their message tells them apart. This is the one place
# where message text is read, and only after the status code has been checked.
_QUEUE_FULL_TEXT = "Exceeds maximum queue size"
_QUEUE_TIMEOUT_TEXT = "Request timeout expired"


@dataclass(frozen=True)
class InferResult:
    """Scores of one request, in row order, with timings."""

    scores: np.ndarray  # float32 [n]
    compute_ms: float | None  # the model's optional 'compute_ms' output (max over rows)
    round_trip_ms: float


@dataclass(frozen=True)
class ModelStats:
    """Cumulative Triton statistics of the model (summed over its versions)."""

    inference_count: int
    execution_count: int
    queue_ns: int
    compute_infer_ns: int
    success_count: int


def _status_name(exc: InferenceServerException) -> str:
    status = exc.status() or ""
    return status.removeprefix("StatusCode.")


def _status_and_message(exc: BaseException) -> tuple[str, str] | None:
    """(status code name, message) of a tritonclient/gRPC error; None for any other exception."""
    if isinstance(exc, InferenceServerException):
        return _status_name(exc), exc.message() or ""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return exc.code().name, exc.details() or ""  # type: ignore[attr-defined]
    return None


def map_triton_error(exc: BaseException, what: str) -> ServingError:
    """The serving error for a tritonclient/gRPC error, chosen by status code. ``what`` names the call."""
    found = _status_and_message(exc)
    if found is None:
        return InternalError(f"{what} failed")
    status, message = found
    if status == "UNAVAILABLE":
        if _QUEUE_FULL_TEXT in message:
            return ResourceExhausted(f"{what}: Triton's queue is full")
        if _QUEUE_TIMEOUT_TEXT in message:
            return DeadlineExceeded(f"{what}: deadline expired in Triton's queue")
        return Unavailable(f"{what}: Triton is unavailable")
    if status == "DEADLINE_EXCEEDED":
        return DeadlineExceeded(f"{what}: deadline exceeded")
    if status == "CANCELLED":
        return Cancelled(f"{what}: cancelled")
    if status == "NOT_FOUND":
        return Unavailable(f"{what}: model not found or not ready in Triton")
    if status == "RESOURCE_EXHAUSTED":
        return ResourceExhausted(f"{what}: Triton is out of resources")
    # INVALID_ARGUMENT from Triton means we built a bad request: our bug, not the client's.
    return InternalError(f"{what} failed")


def unreachable_reason(exc: BaseException, url: str, security: ClientSecurity) -> str:
    """Why Triton at ``url`` did not answer, for the operator's log: status, gRPC's text, and a hint
    when the transport is the likely cause (the status code says "no connection", not which side's TLS)."""
    status, detail = _status_and_message(exc) or (type(exc).__name__, str(exc))
    reason = f"Triton at {url} did not answer over {security.transport}: {status} {detail}".rstrip()
    if status != "UNAVAILABLE":
        return reason
    if security.tls:
        return (
            f"{reason} (check that Triton runs with --grpc-use-ssl and that triton_tls_ca_file, "
            "and under --grpc-use-ssl-mutual triton_tls_cert_file, match its certificates)"
        )
    return f"{reason} (a Triton run with --grpc-use-ssl needs triton_tls and triton_tls_ca_file)"


class TritonModelClient:
    """The control calls on one Triton model (readiness, config, statistics) over one reused channel."""

    def __init__(
        self,
        url: str,
        *,
        model_name: str,
        model_version: str = "",
        control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S,
        security: ClientSecurity = PLAINTEXT,
    ):
        self.url = url
        self.model_name = model_name
        self.model_version = model_version
        self.control_timeout_s = control_timeout_s
        self.security = security
        # Why the last model_ready() said False ('' after a True), for the health watcher's log line.
        self.unready_reason = ""
        self._client: triton_aio.InferenceServerClient | None = None

    def _grpc(self) -> triton_aio.InferenceServerClient:
        # Created on first use, inside the running event loop the channel will belong to.
        if self._client is None:
            self._client = triton_aio.InferenceServerClient(
                self.url,
                creds=self.security.credentials(),  # None: plaintext
                channel_args=[*CHANNEL_ARGS, *self.security.options()],
            )
        return self._client

    async def _config(self):
        try:
            response = await self._grpc().get_model_config(
                self.model_name, self.model_version, client_timeout=self.control_timeout_s
            )
        except (InferenceServerException, grpc.RpcError) as exc:
            raise map_triton_error(exc, f"model config of {self.model_name!r}") from exc
        return response.config

    async def model_ready(self) -> bool:
        """Whether Triton serves the model now; False (never an exception) when unreachable, with the
        reason in ``unready_reason``."""
        try:
            ready = bool(
                await self._grpc().is_model_ready(
                    self.model_name, self.model_version, client_timeout=self.control_timeout_s
                )
            )
        except Exception as exc:
            self.unready_reason = unreachable_reason(exc, self.url, self.security)
            return False
        self.unready_reason = "" if ready else f"Triton at {self.url} says {self.model_name!r} is not ready"
        return ready

    async def model_parameters(self) -> dict[str, str]:
        """The string parameters of the model's config (e.g. the serving-bundle hash)."""
        config = await self._config()
        return {key: value.string_value for key, value in config.parameters.items()}

    async def model_statistics(self) -> ModelStats:
        """Cumulative statistics of the model, summed over its versions."""
        try:
            response = await self._grpc().get_inference_statistics(
                self.model_name, self.model_version, client_timeout=self.control_timeout_s
            )
        except (InferenceServerException, grpc.RpcError) as exc:
            raise map_triton_error(exc, f"statistics of {self.model_name!r}") from exc
        stats = [s for s in response.model_stats if s.name == self.model_name]
        return ModelStats(
            inference_count=sum(s.inference_count for s in stats),
            execution_count=sum(s.execution_count for s in stats),
            queue_ns=sum(s.inference_stats.queue.ns for s in stats),
            compute_infer_ns=sum(s.inference_stats.compute_infer.ns for s in stats),
            success_count=sum(s.inference_stats.success.count for s in stats),
        )

    async def close(self) -> None:
        """Close the channel; a later call opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class TritonScorerClient(TritonModelClient):
    """Scores token-id batches with one Triton model over one reused gRPC channel."""

    def __init__(
        self,
        url: str,
        *,
        model_name: str,
        model_version: str = "",
        tensors: TensorNames = DEFAULT_TENSORS,
        control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S,
        security: ClientSecurity = PLAINTEXT,
    ):
        super().__init__(
            url,
            model_name=model_name,
            model_version=model_version,
            control_timeout_s=control_timeout_s,
            security=security,
        )
        self.tensors = tensors
        self._has_compute_ms: bool | None = None

    async def _wants_compute_ms(self) -> bool:
        if self._has_compute_ms is None:
            config = await self._config()
            self._has_compute_ms = any(out.name == self.tensors.compute_ms for out in config.output)
        return self._has_compute_ms

    async def infer_scores(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        *,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> InferResult:
        """Scores for ``n`` padded rows (``[n, L]`` token ids and mask); raises ``ServingError`` types."""
        input_ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        attention_mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
            raise ValueError(
                f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} must be equal [n, L]"
            )
        names = self.tensors
        arrays = {names.input_ids: input_ids, names.attention_mask: attention_mask}
        return await self._infer(arrays, input_ids.shape[0], timeout_s, request_id)

    async def infer_multi_item(
        self,
        prefix_ids: np.ndarray,
        prefix_mask: np.ndarray,
        item_ids: np.ndarray,
        item_mask: np.ndarray,
        *,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> InferResult:
        """Scores of one member's ``N`` items: prefix ``[1, P]`` and items ``[1, N, L]`` (ids and masks)."""
        arrays = [
            np.ascontiguousarray(a, dtype=np.int64) for a in (prefix_ids, prefix_mask, item_ids, item_mask)
        ]
        if arrays[0].ndim != 2 or arrays[2].ndim != 3 or arrays[0].shape[0] != 1 or arrays[2].shape[0] != 1:
            raise ValueError(
                f"prefix {arrays[0].shape} must be [1, P] and items {arrays[2].shape} [1, N, L] (one member)"
            )
        names = self.tensors
        named = dict(
            zip((names.prefix_ids, names.prefix_mask, names.item_ids, names.item_mask), arrays, strict=True)
        )
        return await self._infer(named, arrays[2].shape[1], timeout_s, request_id)

    async def _infer(
        self, arrays: dict[str, np.ndarray], expected: int, timeout_s: float | None, request_id: str
    ) -> InferResult:
        """One infer call with ``arrays`` as INT64 inputs, expecting ``expected`` scores."""
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"infer on {self.model_name!r}: deadline already expired")
        start = time.perf_counter()
        names = self.tensors
        inputs = []
        for name, array in arrays.items():
            tensor = InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [InferRequestedOutput(names.score)]
        if await self._wants_compute_ms():
            outputs.append(InferRequestedOutput(names.compute_ms))
        remaining = None if timeout_s is None else timeout_s - (time.perf_counter() - start)
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded(f"infer on {self.model_name!r}: deadline expired")
        try:
            result = await self._grpc().infer(
                self.model_name,
                inputs,
                model_version=self.model_version,
                outputs=outputs,
                request_id=request_id,
                # Triton's queue-policy timeout override, in microseconds.
                timeout=None if remaining is None else max(1, int(remaining * 1e6)),
                client_timeout=remaining,
            )
        except (InferenceServerException, grpc.RpcError) as exc:
            raise map_triton_error(exc, f"infer on {self.model_name!r}") from exc
        round_trip_ms = (time.perf_counter() - start) * 1e3
        scores = result.as_numpy(names.score)
        if scores is None or scores.size != expected:
            raise InternalError(f"infer on {self.model_name!r}: bad {names.score!r} output")
        compute_ms = None
        if len(outputs) > 1:
            compute = result.as_numpy(names.compute_ms)
            compute_ms = float(compute.max()) if compute is not None and compute.size else None
        return InferResult(
            scores=scores.reshape(-1).astype(np.float32, copy=False),
            compute_ms=compute_ms,
            round_trip_ms=round_trip_ms,
        )


# -- generation: one bidirectional Triton stream per request -------------------------------------------
# The generator model's error for a full queue starts with this text (contract of the generator model).
_GENERATOR_QUEUE_FULL_TEXT = "queue full"
# Ask Triton to deliver the empty response that carries only the final flag, so the end is always seen.
_EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
_FINAL_RESPONSE = "triton_final_response"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request to the decoupled generator model (see docs/generator.md)."""

    input_ids: Sequence[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    repetition_penalty: float = 1.0
    copy_names: Sequence[Sequence[int]] = ()  # the prompt's names as token ids, kept whole when copied


@dataclass(frozen=True)
class GenerationStep:
    """One streamed response: the new tokens, and the finish reason on the last one ("" before)."""

    token_ids: tuple[int, ...]
    finish_reason: str = ""


def map_stream_error(message: str, what: str) -> ServingError:
    """The serving error for an error response on a Triton stream (it carries text, no status code)."""
    lowered = message.lower()
    if _GENERATOR_QUEUE_FULL_TEXT in lowered or _QUEUE_FULL_TEXT.lower() in lowered:
        return ResourceExhausted(f"{what}: the model's queue is full")
    if "cancel" in lowered:
        return Cancelled(f"{what}: cancelled")
    if any(text in lowered for text in ("unknown model", "not ready", "not found", "unloading")):
        return Unavailable(f"{what}: model not found or not ready in Triton")
    return InternalError(f"{what} failed")


def _tensor(name: str, values: Sequence, dtype: str, np_dtype) -> InferInput:
    array = np.asarray(values, dtype=np_dtype).reshape(-1)
    tensor = InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def generation_inputs(request: GenerationRequest) -> list[InferInput]:
    """The model's input tensors; optional ones only when they differ from the model's defaults."""
    inputs = [
        _tensor("input_ids", request.input_ids, "INT64", np.int64),
        _tensor("max_tokens", [request.max_tokens], "INT32", np.int32),
        _tensor("temperature", [request.temperature], "FP32", np.float32),
        _tensor("top_p", [request.top_p], "FP32", np.float32),
    ]
    if request.seed is not None:
        inputs.append(_tensor("seed", [request.seed], "UINT64", np.uint64))
    if request.stop_token_ids:
        inputs.append(_tensor("stop_token_ids", request.stop_token_ids, "INT64", np.int64))
    if request.repetition_penalty != 1.0:  # models published before this input existed still serve
        inputs.append(_tensor("repetition_penalty", [request.repetition_penalty], "FP32", np.float32))
    if request.copy_names:  # each name's ids, then -1 (models whose bundle sets copy_names)
        ids = [token for name in request.copy_names for token in (*name, -1)]
        inputs.append(_tensor("copy_names", ids, "INT64", np.int64))
    return inputs


class TritonGeneratorClient(TritonModelClient):
    """Streams tokens from the decoupled generator model: one gRPC stream per request, so closing the
    iterator early (or cancelling the task consuming it) cancels that request in Triton and frees its slot."""

    async def generate(
        self, request: GenerationRequest, *, timeout_s: float | None = None, request_id: str = ""
    ) -> AsyncIterator[GenerationStep]:
        """Yield the model's responses until one carries a finish reason; raises ``ServingError`` types.

        ``timeout_s`` bounds the whole stream (the caller's remaining deadline)."""
        what = f"generate on {self.model_name!r}"
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"{what}: deadline already expired")
        finished = asyncio.Event()

        async def requests():
            yield {
                "model_name": self.model_name,
                "model_version": self.model_version,
                "inputs": generation_inputs(request),
                "outputs": [InferRequestedOutput("token_ids"), InferRequestedOutput("finish_reason")],
                "request_id": request_id,
                "parameters": {_EMPTY_FINAL_RESPONSE: True},
            }
            await finished.wait()  # half-closing early could end the stream before the last response

        stream = self._grpc().stream_infer(requests(), stream_timeout=timeout_s)
        complete = False
        try:
            async for result, error in stream:
                if error is not None:
                    raise map_stream_error(error.message() or "", what) from error
                step, final = _generation_step(result)
                if step.token_ids or step.finish_reason:
                    yield step
                if step.finish_reason:
                    complete = True
                    return
                if final:
                    raise InternalError(f"{what}: the model ended the stream without a finish reason")
            raise InternalError(f"{what}: Triton closed the stream before the last response")
        except (InferenceServerException, grpc.RpcError) as exc:
            raise map_triton_error(exc, what) from exc
        finally:
            finished.set()
            if not complete:  # an error, the caller's cancellation, or the caller stopped reading
                stream.cancel()


def _generation_step(result) -> tuple[GenerationStep, bool]:
    """(step, whether Triton marked this response final) of one stream response."""
    response = result.get_response()
    final = _FINAL_RESPONSE in response.parameters and response.parameters[_FINAL_RESPONSE].bool_param
    if not response.outputs:  # the empty final response
        return GenerationStep(()), final
    ids = result.as_numpy("token_ids")
    reason = result.as_numpy("finish_reason")
    tokens = tuple(int(t) for t in ids.reshape(-1)) if ids is not None else ()
    text = reason.reshape(-1)[0] if reason is not None and reason.size else b""
    finish = text.decode() if isinstance(text, bytes) else str(text)
    return GenerationStep(tokens, finish), final
