"""Reasoning core: stream generated text from the Triton generator model, on plain types only.

Steps of one request: validate, refuse at once if the model is not ready or carries another bundle,
render the chat prompt (``prompts.render_chat_prompt``; Explain's user text from
``render_explain_request``), tokenize with the bundle's tokenizer, check that prompt and max_tokens fit
the model's context, then open one Triton stream and turn its token steps into text pieces: incremental
detokenization (never a broken character), stop strings (cut before the match, then the Triton stream is
closed, which cancels the request in the model). The last event is a ``GenerationSummary``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from slimserve import prompts, schema
from slimserve.bundle import TOKENIZER_FILE
from slimserve.generator_bundle import GeneratorBundle, load_generator_bundle
from slimserve.tokenization import copy_name_ids, load_tokenizer

from ..core import ServiceCore, check_template_version
from ..errors import DeadlineExceeded, InternalError, InvalidArgument
from ..health import ModelHealthWatcher
from ..triton.client import GenerationRequest
from .detokenizer import IncrementalDetokenizer
from .stop_strings import StopStringMatcher
from .validation import (
    GenerationOptions,
    ResolvedOptions,
    resolve_options,
    validate_explain,
    validate_prompt,
)

if TYPE_CHECKING:
    from ..metrics import GenerationMetrics
    from ..triton.client import TritonGeneratorClient
    from .config import ReasoningServiceConfig

log = logging.getLogger(__name__)

SERVICE_NAME = "slimserve.v1.ReasoningService"
# The model's finish reasons this service passes on; a stop string match is the service's own.
MODEL_FINISH_REASONS = ("stop", "length")
FINISH_STOP_STRING = "stop_string"


@dataclass(frozen=True)
class GenerationSummary:
    """The last event of a stream: why it ended and how fast it went."""

    finish_reason: str  # "stop" | "length" | "stop_string"
    stop_string: str
    prompt_tokens: int
    tokens_generated: int
    time_to_first_token_ms: float
    tokens_per_second: float
    total_ms: float


class _Clock:
    """Token arrival times of one request: time to first token and the decode rate after it."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.first_tokens = 0
        self.tokens = 0

    def tokens_arrived(self, count: int) -> bool:
        """Record ``count`` tokens now; True when they are the first."""
        now = time.perf_counter()
        first = self.first is None
        if first:
            self.first, self.first_tokens = now, count
        self.last = now
        self.tokens += count
        return first

    @property
    def ttft_ms(self) -> float:
        return 0.0 if self.first is None else (self.first - self.start) * 1e3

    @property
    def tokens_per_second(self) -> float:
        if self.first is None or self.last is None or self.last <= self.first:
            return 0.0
        return (self.tokens - self.first_tokens) / (self.last - self.first)


class ReasoningCore(ServiceCore):
    """Streams text through the Triton generator; owns the health watcher of its model."""

    service_name = SERVICE_NAME

    def __init__(
        self,
        bundle: GeneratorBundle,
        tokenizer: Tokenizer,
        client: TritonGeneratorClient,
        config: ReasoningServiceConfig,
        *,
        watcher: ModelHealthWatcher | None = None,
        metrics: GenerationMetrics | None = None,
    ):
        super().__init__(bundle, client, config, watcher=watcher, metrics=metrics)
        self.tokenizer = tokenizer

    @classmethod
    def from_config(
        cls, config: ReasoningServiceConfig, *, metrics: GenerationMetrics | None = None
    ) -> ReasoningCore:
        """Load the generator bundle the config points at, check it, build tokenizer and Triton client."""
        from ..triton.client import TritonGeneratorClient

        directory = config.resolved_bundle_dir()
        bundle = load_generator_bundle(directory)
        check_template_version(
            directory,
            bundle.prompt_template_version,
            prompts.EXPLAIN_TEMPLATE_VERSION,
            prompts.OLDER_EXPLAIN_TEMPLATES,
        )
        tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
        client = TritonGeneratorClient(
            config.triton_url,
            model_name=bundle.model_name,
            model_version=str(bundle.model_version),
            security=config.triton_security(),
        )
        return cls(bundle, tokenizer, client, config, metrics=metrics)

    def explain(
        self,
        member: schema.Member | None,
        item: schema.Item | None,
        options: GenerationOptions,
        *,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> AsyncIterator[str | GenerationSummary]:
        """Stream an explanation of why ``item`` does or does not suit ``member``."""
        clock = _Clock()
        validate_explain(member, item, self.config)
        resolved = resolve_options(
            options,
            self.config,
            self.bundle.max_new_tokens_limit,
            default_penalty=self.config.explain_repetition_penalty,
        )
        text, names = self.explain_prompt(member, item)
        return self._stream(clock, text, resolved, "member and item", timeout_s, request_id, names)

    def explain_prompt(self, member: schema.Member, item: schema.Item) -> tuple[str, list[list[int]]]:
        """The Explain request's user text, and the names it states as token ids (the model's
        ``copy_names``; none when the model takes none or ``explain_copy_names`` is off)."""
        version = self.bundle.prompt_template_version
        text = prompts.render_explain_request(member, item, version)
        if not (self.bundle.copy_names and self.config.explain_copy_names):
            return text, []
        return text, copy_name_ids(self.tokenizer, prompts.explain_names(member, item, version))

    def generate(
        self,
        prompt: str,
        options: GenerationOptions,
        *,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> AsyncIterator[str | GenerationSummary]:
        """Stream the model's answer to a free ``prompt`` (the user turn of a chat)."""
        clock = _Clock()
        validate_prompt(prompt, self.config)
        resolved = resolve_options(options, self.config, self.bundle.max_new_tokens_limit)
        return self._stream(clock, prompt, resolved, "prompt", timeout_s, request_id)

    def encode(self, user_text: str) -> list[int]:
        """Token ids of the chat prompt around ``user_text`` (what the model receives)."""
        chat = prompts.render_chat_prompt(user_text)
        return self.tokenizer.encode(chat, add_special_tokens=False).ids

    def fit_max_tokens(self, prompt_tokens: int, options: ResolvedOptions, field: str) -> int:
        """max_tokens that fits the model's context: a default shrinks, an explicit value is refused."""
        room = self.bundle.max_context - prompt_tokens
        if room < 1:
            raise InvalidArgument(
                field,
                f"the prompt is {prompt_tokens} tokens; the model's context holds {self.bundle.max_context} "
                "including at least one generated token",
            )
        if options.max_tokens <= room:
            return options.max_tokens
        if options.explicit_max_tokens:
            raise InvalidArgument(
                "options.max_tokens",
                f"{options.max_tokens} does not fit: the prompt is {prompt_tokens} tokens and the model's "
                f"context {self.bundle.max_context}, so at most {room}",
            )
        return room

    def _request(
        self, user_text: str, options: ResolvedOptions, field: str, copy_names=()
    ) -> GenerationRequest:
        """The model's request: chat prompt token ids, max_tokens fitted to the context, sampling, and the
        prompt's names as token ids (``copy_names``)."""
        ids = self.encode(user_text)
        return GenerationRequest(
            input_ids=ids,
            max_tokens=self.fit_max_tokens(len(ids), options, field),
            temperature=options.temperature,
            top_p=options.top_p,
            repetition_penalty=options.repetition_penalty,
            seed=options.seed,
            copy_names=copy_names,
        )

    async def _stream(
        self,
        clock: _Clock,
        user_text: str,
        options: ResolvedOptions,
        field: str,
        timeout_s: float | None,
        request_id: str,
        copy_names=(),
    ) -> AsyncIterator[str | GenerationSummary]:
        self.check_serving()
        request = self._request(user_text, options, field, copy_names)
        budget = self.config.default_timeout_s if timeout_s is None else timeout_s
        remaining = budget - (time.perf_counter() - clock.start)
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed before the model was called")
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringMatcher(options.stop)
        finish = ""
        steps = self.client.generate(request, timeout_s=remaining, request_id=request_id)
        with self.triton_call(clock.start):
            try:
                async for step in steps:
                    if step.token_ids and clock.tokens_arrived(len(step.token_ids)) and self.metrics:
                        self.metrics.time_to_first_token.observe(clock.ttft_ms / 1e3)
                    text = detokenizer.push(step.token_ids)
                    if step.finish_reason:
                        text += detokenizer.flush()
                    piece = stops.push(text)
                    if step.finish_reason and not stops.matched:
                        piece += stops.flush()
                    if piece:
                        yield piece
                    if stops.matched:
                        finish = FINISH_STOP_STRING
                        break  # closing the stream below cancels the request in the model
                    if step.finish_reason:
                        finish = step.finish_reason
                if finish not in (*MODEL_FINISH_REASONS, FINISH_STOP_STRING):
                    raise InternalError(f"the model ended generation with finish reason {finish!r}")
            finally:
                await steps.aclose()
        summary = GenerationSummary(
            finish_reason=finish,
            stop_string=stops.matched,
            prompt_tokens=len(request.input_ids),
            tokens_generated=clock.tokens,
            time_to_first_token_ms=clock.ttft_ms,
            tokens_per_second=clock.tokens_per_second,
            total_ms=(time.perf_counter() - clock.start) * 1e3,
        )
        if self.metrics is not None:
            self.metrics.tokens.labels(finish).inc(clock.tokens)
            if clock.tokens_per_second:
                self.metrics.tokens_per_second.observe(clock.tokens_per_second)
        yield summary
