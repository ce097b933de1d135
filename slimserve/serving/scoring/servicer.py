"""The ScoringService gRPC servicer: protobuf <-> plain types around ``ScoringCore``, nothing more.

Errors are raised as ``ServingError``s and mapped to statuses by the interceptor. ``ScoreStream``
answers each request in order while scoring up to ``stream_window`` of them concurrently; the first
request that fails ends the stream with its status, its message prefixed by ``requests[i]`` (for
bad input: ``requests[i].candidates[3].id: ...``). Requests before it have been answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from slimserve import schema
from slimserve.v1 import common_pb2, scoring_pb2, scoring_pb2_grpc

from ..convert import item_from_proto, member_from_proto
from ..errors import InvalidArgument, ServingError
from ..interceptor import check_request_id, current_request_id, request_id_var
from ..servicer import ServiceServicer
from .core import ScoringCore

STREAM_WINDOW = 32


def request_from_proto(
    request: scoring_pb2.ScoreRequest,
) -> tuple[schema.Member | None, list[schema.Item], int]:
    """(member or None when absent, candidates, top_k) of a ScoreRequest."""
    member = member_from_proto(request.member) if request.HasField("member") else None
    candidates = [item_from_proto(c, f"candidates[{i}]") for i, c in enumerate(request.candidates)]
    return member, candidates, int(request.top_k)


def response_to_proto(
    result: schema.ScoreResult, metadata: common_pb2.ResponseMetadata
) -> scoring_pb2.ScoreResponse:
    """A plain result and its metadata as a ScoreResponse (timings copied into the metadata)."""
    metadata.queue_ms = result.timings.queue_ms
    metadata.inference_ms = result.timings.inference_ms
    metadata.total_ms = result.timings.total_ms
    items = [scoring_pb2.ScoredItem(item_id=s.item_id, score=s.score, rank=s.rank) for s in result.items]
    return scoring_pb2.ScoreResponse(items=items, metadata=metadata)


def _prefixed(exc: ServingError, index: int) -> ServingError:
    """The same error, its field or message prefixed with ``requests[index]``."""
    if isinstance(exc, InvalidArgument):
        problem = exc.message.removeprefix(f"{exc.field}: ")
        return InvalidArgument(f"requests[{index}].{exc.field}", problem)
    return type(exc)(f"requests[{index}]: {exc.message}")


class ScoringServicer(ServiceServicer, scoring_pb2_grpc.ScoringServiceServicer):
    """Converts ScoringService messages and delegates to a ``ScoringCore``."""

    core: ScoringCore

    def __init__(self, core: ScoringCore, *, stream_window: int = STREAM_WINDOW):
        super().__init__(core)
        self.stream_window = stream_window

    async def _score(
        self, request: scoring_pb2.ScoreRequest, request_id: str, context
    ) -> scoring_pb2.ScoreResponse:
        member, candidates, top_k = request_from_proto(request)
        result = await self.core.score(
            member, candidates, top_k, timeout_s=self._timeout(context), request_id=request_id
        )
        return response_to_proto(result, self._metadata(request_id))

    async def Score(self, request, context):
        return await self._score(request, current_request_id(), context)

    async def _score_in_stream(self, request, index: int, stream_id: str, context):
        try:
            if request.request_id:
                request_id = check_request_id(request.request_id, "request_id")
            else:
                request_id = f"{stream_id}-{index}"
            request_id_var.set(request_id)  # this task's own context
            return await self._score(request, request_id, context)
        except ServingError as exc:
            raise _prefixed(exc, index) from None

    async def ScoreStream(self, request_iterator: AsyncIterator, context):
        stream_id = current_request_id()
        window: asyncio.Queue = asyncio.Queue(maxsize=max(1, self.stream_window - 1))

        async def read() -> None:
            try:
                index = 0
                async for request in request_iterator:
                    task = asyncio.ensure_future(self._score_in_stream(request, index, stream_id, context))
                    try:
                        await window.put(task)
                    except asyncio.CancelledError:
                        task.cancel()
                        raise
                    index += 1
                await window.put(None)
            except Exception as exc:  # surfaced by the writer, after the answers before it
                await window.put(exc)

        reader = asyncio.ensure_future(read())
        taken: list[asyncio.Future] = []
        try:
            while (item := await window.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                taken.append(item)
                yield await item
                taken.pop()
        finally:
            reader.cancel()
            leftovers = taken + [window.get_nowait() for _ in range(window.qsize())]
            futures = [f for f in leftovers if isinstance(f, asyncio.Future)]
            for future in futures:
                future.cancel()
            await asyncio.gather(reader, *futures, return_exceptions=True)
