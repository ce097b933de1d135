"""Scoring core: rank candidates for a member with the Triton scoring model, on plain types only.

Steps: validate, refuse at once if the model is not ready (UNAVAILABLE) or its bundle hash differs
(FAILED_PRECONDITION), render and tokenize as the bundle's template says (``slimserve.scoring_tokens``),
build the Triton requests, send them concurrently (the first failure cancels the rest and is raised),
then rank by score (ties keep input order) and apply ``top_k``.

Requests follow the bundle's scoring mode. Multi-item: the member prefix once and the candidates as
item suffixes padded to a length bucket, one request per ``max_items_per_request`` candidates (usually
one per call). Single-sequence: one sequence per candidate, grouped by length bucket, cut into chunks
of ``triton_chunk_size``, each padded to its bucket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slimserve import prompts, schema
from slimserve.bundle import TOKENIZER_FILE, BundleError, ServingBundle, load_bundle
from slimserve.models.batching import padded_batches
from slimserve.scoring_tokens import MultiItemRequest, encode_scoring, multi_item_requests
from slimserve.tokenization import PromptTokenizer

from ..core import ServiceCore, check_template_version
from ..errors import DeadlineExceeded, InternalError
from ..health import ModelHealthWatcher
from .validation import effective_top_k, validate_score_request

if TYPE_CHECKING:
    from ..metrics import ScoringMetrics
    from ..triton.client import InferResult, TritonScorerClient
    from .config import ScoringServiceConfig

log = logging.getLogger(__name__)

SERVICE_NAME = "slimserve.v1.ScoringService"
# Above this many candidates, rendering and tokenizing run in the default executor.
EXECUTOR_THRESHOLD = 64
# Extra time granted past the caller's budget before the core gives up on a Triton call itself.
DEADLINE_SLACK_S = 0.25


@dataclass(frozen=True)
class Chunk:
    """One single-sequence Triton request: which candidates (by input index) and their padded tensors."""

    indices: tuple[int, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.input_ids, self.attention_mask


class ScoringCore(ServiceCore):
    """Scores candidates through Triton; owns the health watcher of its model."""

    service_name = SERVICE_NAME

    def __init__(
        self,
        bundle: ServingBundle,
        tokenizer: PromptTokenizer,
        client: TritonScorerClient,
        config: ScoringServiceConfig,
        *,
        watcher: ModelHealthWatcher | None = None,
        metrics: ScoringMetrics | None = None,
    ):
        super().__init__(bundle, client, config, watcher=watcher, metrics=metrics)
        self.tokenizer = tokenizer
        chunk = config.triton_chunk_size
        self.chunk_size = min(chunk, bundle.max_batch_size) if bundle.max_batch_size > 0 else chunk

    @classmethod
    def from_config(
        cls, config: ScoringServiceConfig, *, metrics: ScoringMetrics | None = None
    ) -> ScoringCore:
        """Load the bundle the config points at, check it, and build the tokenizer and Triton client."""
        from ..triton.client import TritonScorerClient

        directory = config.resolved_bundle_dir()
        bundle = load_bundle(directory)
        check_template_version(
            directory,
            bundle.prompt_template_version,
            prompts.SCORING_TEMPLATE_VERSION,
            also_served=prompts.SERVED_TEMPLATES,
        )
        tokenizer = PromptTokenizer(directory / TOKENIZER_FILE, bundle.max_length)
        for word, expected in (
            (prompts.YES_WORD, bundle.yes_token_id),
            (prompts.NO_WORD, bundle.no_token_id),
        ):
            if tokenizer.token_id(word) != expected:
                raise BundleError(
                    f"{directory}: label {word!r} is not token {expected} in the bundle tokenizer"
                )
        client = TritonScorerClient(
            config.triton_url,
            model_name=bundle.model_name,
            model_version=str(bundle.model_version),
            tensors=bundle.tensors,
            security=config.triton_security(),
        )
        return cls(bundle, tokenizer, client, config, metrics=metrics)

    async def score(
        self,
        member: schema.Member,
        candidates: list[schema.Item],
        top_k: int = 1,
        *,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> schema.ScoreResult:
        """Rank ``candidates`` for ``member``; ``timeout_s`` is the caller's remaining time."""
        start = time.perf_counter()
        validate_score_request(member, candidates, top_k, self.config)
        self.check_serving()
        if self.metrics is not None:
            self.metrics.candidates.observe(len(candidates))
        budget = self.config.default_timeout_s if timeout_s is None else timeout_s
        if len(candidates) > EXECUTOR_THRESHOLD:
            loop = asyncio.get_running_loop()
            chunks = await loop.run_in_executor(None, self.prepare, member, candidates)
        else:
            chunks = self.prepare(member, candidates)
        remaining = budget - (time.perf_counter() - start)
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed before the model was called")
        results = await self._infer_all(chunks, remaining, request_id)
        scores = np.empty(len(candidates), dtype=np.float32)
        for chunk, result in zip(chunks, results, strict=True):
            scores[list(chunk.indices)] = result.scores
        items = rank(candidates, scores, top_k)
        queue_ms, inference_ms = critical_path_timings(results)
        total_ms = (time.perf_counter() - start) * 1e3
        return schema.ScoreResult(items, schema.ScoreTimings(queue_ms, inference_ms, total_ms))

    def prepare(
        self, member: schema.Member, candidates: list[schema.Item]
    ) -> list[Chunk] | list[MultiItemRequest]:
        """Render, tokenize, bucket and pad: the Triton requests of one Score call."""
        bundle = self.bundle
        tokens = encode_scoring(
            self.tokenizer, member, candidates, bundle.prompt_split, bundle.prompt_template_version
        )
        if bundle.multi_item:
            return multi_item_requests(
                tokens, bundle.item_length_buckets, bundle.max_items_per_request, self.tokenizer.pad_token_id
            )
        batches = padded_batches(
            tokens.sequences(), bundle.length_buckets, self.chunk_size, self.tokenizer.pad_token_id
        )
        return [Chunk(tuple(indices), ids, mask) for indices, ids, mask in batches]

    async def _infer_all(self, chunks: list, timeout_s: float, request_id: str) -> list[InferResult]:
        """Send every chunk at once; on the first failure cancel the others and raise it."""
        tasks = [asyncio.ensure_future(self._infer(chunk, timeout_s, request_id)) for chunk in chunks]
        try:
            done, pending = await asyncio.wait(
                tasks, timeout=timeout_s + DEADLINE_SLACK_S, return_when=asyncio.FIRST_EXCEPTION
            )
            failures = [t.exception() for t in tasks if t in done and not t.cancelled() and t.exception()]
            if failures:  # the first failure in input order
                raise failures[0]
            if pending:
                raise DeadlineExceeded(f"the model did not answer within {timeout_s:.3f} s")
            return [task.result() for task in tasks]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _infer(self, chunk: Chunk | MultiItemRequest, timeout_s: float, request_id: str) -> InferResult:
        infer = self.client.infer_multi_item if self.bundle.multi_item else self.client.infer_scores
        with self.triton_call():
            result = await infer(*chunk.arrays(), timeout_s=timeout_s, request_id=request_id)
        if result.scores.shape != (len(chunk.indices),):
            raise InternalError(
                f"model returned {result.scores.shape} scores for a batch of {len(chunk.indices)}"
            )
        return result


def critical_path_timings(results: list[InferResult]) -> tuple[float, float]:
    """(queue_ms, inference_ms) of the slowest Triton call: the calls run concurrently, so the
    slowest one is what the request waited for; its queue and compute add up to its round trip."""
    slowest = max(results, key=lambda r: r.round_trip_ms)
    compute = (
        slowest.round_trip_ms
        if slowest.compute_ms is None
        else min(slowest.compute_ms, slowest.round_trip_ms)
    )
    return max(0.0, slowest.round_trip_ms - compute), compute


def rank(
    candidates: list[schema.Item], scores: np.ndarray, top_k: int | None = None
) -> list[schema.ScoredItem]:
    """Best first (ties keep input order; NaN scores rank last), cut to ``top_k`` (None = all)."""
    order = np.argsort(-scores, kind="stable")  # NaN stays NaN when negated and sorts last
    keep = len(candidates) if top_k is None else effective_top_k(top_k, len(candidates))
    return [
        schema.ScoredItem(candidates[int(i)].id, float(scores[i]), rank + 1)
        for rank, i in enumerate(order[:keep])
    ]
