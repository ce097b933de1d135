"""The one module that imports ``tritonclient``: an asyncio gRPC client for a Triton scoring model.

Every tritonclient/gRPC error is mapped here, by status code, to a ``slimserve.serving.errors`` type; the
original exception stays chained (``raise ... from exc``) for the logs. Deadlines travel twice: as the
gRPC deadline (``client_timeout``) and as Triton's per-request queue ``timeout`` (microseconds), which
needs ``allow_timeout_override: true`` in the model's queue policy. Cancelling the awaiting task cancels
the gRPC call (grpc.aio does this; Triton then cancels the request).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from slimserve.bundle import TensorNames
from slimserve.serving.errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    ResourceExhausted,
    ServingError,
    Unavailable,
)

__all__ = ["InferResult", "ModelStats", "TritonScorerClient", "map_triton_error"]

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


def map_triton_error(exc: BaseException, what: str) -> ServingError:
    """The serving error for a tritonclient/gRPC error, chosen by status code. ``what`` names the call."""
    if isinstance(exc, InferenceServerException):
        status, message = _status_name(exc), exc.message() or ""
    elif isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        status, message = exc.code().name, exc.details() or ""  # type: ignore[attr-defined]
    else:
        return InternalError(f"{what} failed")
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


class TritonScorerClient:
    """Scores token-id batches with one Triton model over one reused gRPC channel."""

    def __init__(
        self,
        url: str,
        *,
        model_name: str,
        model_version: str = "",
        tensors: TensorNames = DEFAULT_TENSORS,
        control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S,
    ):
        self.url = url
        self.model_name = model_name
        self.model_version = model_version
        self.tensors = tensors
        self.control_timeout_s = control_timeout_s
        self._client: triton_aio.InferenceServerClient | None = None
        self._has_compute_ms: bool | None = None

    def _grpc(self) -> triton_aio.InferenceServerClient:
        # Created on first use, inside the running event loop the channel will belong to.
        if self._client is None:
            self._client = triton_aio.InferenceServerClient(self.url, channel_args=CHANNEL_ARGS)
        return self._client

    async def _config(self):
        try:
            response = await self._grpc().get_model_config(
                self.model_name, self.model_version, client_timeout=self.control_timeout_s
            )
        except (InferenceServerException, grpc.RpcError) as exc:
            raise map_triton_error(exc, f"model config of {self.model_name!r}") from exc
        return response.config

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
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"infer on {self.model_name!r}: deadline already expired")
        start = time.perf_counter()
        names = self.tensors
        inputs = []
        for name, array in ((names.input_ids, input_ids), (names.attention_mask, attention_mask)):
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
        if scores is None or scores.size != input_ids.shape[0]:
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

    async def model_ready(self) -> bool:
        """Whether Triton serves the model now; False (never an exception) when unreachable."""
        try:
            return bool(
                await self._grpc().is_model_ready(
                    self.model_name, self.model_version, client_timeout=self.control_timeout_s
                )
            )
        except Exception:
            return False

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

    async def __aenter__(self) -> TritonScorerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
