"""The ReasoningService gRPC servicer: protobuf <-> plain types around ``ReasoningCore``, nothing more.

Each text piece of the core becomes a ``TextChunk`` (numbered in stream order); the core's closing
summary becomes the last chunk's ``GenerationMetadata``. Errors are ``ServingError``s mapped to statuses
by the interceptor; an error after the first chunk ends the stream with that status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from slimserve.v1 import reasoning_pb2, reasoning_pb2_grpc

from ..convert import item_from_proto, member_from_proto
from ..interceptor import current_request_id
from ..servicer import ServiceServicer, response_metadata
from .core import GenerationSummary, ReasoningCore
from .validation import GenerationOptions

FINISH_REASON_TO_PROTO = {
    "stop": reasoning_pb2.FINISH_REASON_STOP,
    "length": reasoning_pb2.FINISH_REASON_LENGTH,
    "stop_string": reasoning_pb2.FINISH_REASON_STOP_STRING,
}


def options_from_proto(message: reasoning_pb2.GenerationOptions) -> GenerationOptions:
    """Plain options; unset optional fields stay None (the service's defaults)."""
    return GenerationOptions(
        max_tokens=int(message.max_tokens),
        temperature=float(message.temperature),
        top_p=float(message.top_p) if message.HasField("top_p") else None,
        seed=int(message.seed) if message.HasField("seed") else None,
        stop=tuple(message.stop),
        repetition_penalty=(
            float(message.repetition_penalty) if message.HasField("repetition_penalty") else None
        ),
    )


def metadata_to_proto(
    summary: GenerationSummary, core: ReasoningCore, request_id: str
) -> reasoning_pb2.GenerationMetadata:
    """The closing metadata of a stream."""
    return reasoning_pb2.GenerationMetadata(
        response=response_metadata(core.bundle, request_id, total_ms=summary.total_ms),
        finish_reason=FINISH_REASON_TO_PROTO.get(
            summary.finish_reason, reasoning_pb2.FINISH_REASON_UNSPECIFIED
        ),
        stop_string=summary.stop_string,
        time_to_first_token_ms=summary.time_to_first_token_ms,
        prompt_tokens=summary.prompt_tokens,
        tokens_generated=summary.tokens_generated,
        tokens_per_second=summary.tokens_per_second,
    )


class ReasoningServicer(ServiceServicer, reasoning_pb2_grpc.ReasoningServiceServicer):
    """Converts ReasoningService messages and delegates to a ``ReasoningCore``."""

    core: ReasoningCore

    async def _chunks(self, events: AsyncIterator, request_id: str) -> AsyncIterator[reasoning_pb2.TextChunk]:
        index = 0
        async with aclosing(events):  # closing the chunks closes the core's stream (and Triton's) at once
            async for event in events:
                if isinstance(event, GenerationSummary):
                    metadata = metadata_to_proto(event, self.core, request_id)
                    yield reasoning_pb2.TextChunk(index=index, metadata=metadata)
                    return
                yield reasoning_pb2.TextChunk(text=event, index=index)
                index += 1

    async def Explain(self, request: reasoning_pb2.ExplainRequest, context):
        request_id = current_request_id()
        member = member_from_proto(request.member) if request.HasField("member") else None
        item = item_from_proto(request.item, "item") if request.HasField("item") else None
        events = self.core.explain(
            member,
            item,
            options_from_proto(request.options),
            timeout_s=self._timeout(context),
            request_id=request_id,
        )
        async with aclosing(self._chunks(events, request_id)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def Generate(self, request: reasoning_pb2.GenerateRequest, context):
        request_id = current_request_id()
        events = self.core.generate(
            request.prompt,
            options_from_proto(request.options),
            timeout_s=self._timeout(context),
            request_id=request_id,
        )
        async with aclosing(self._chunks(events, request_id)) as chunks:
            async for chunk in chunks:
                yield chunk
