"""The published generator graph, gated as it is served.

The generator stages measure the student in PyTorch; what the ReasoningService serves is its exported
(weight-only quantized, LM-head shortlisted) ONNX graph, decoded by the serving engine
(``triton_models.generator.BatchEngine``) at the service's Explain defaults: greedy, with
``explain_repetition_penalty``. Before the graph is published, it explains the same held-out pairs
(and the pairs renamed to unseen skills) that way, and the recipe's grounding gates apply to that row:
a graph that explains worse than the student it came from publishes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from ..evaluation.generator_report import SERVED_SUFFIX, GeneratorRow
from ..export.generator_repository import REPORT_FILE, SERVED_GROUNDING_KEY
from .generator_stages import GeneratorContext, check_grounding_gates, scorer_decisions

log = logging.getLogger(__name__)


FREE_PROMPT_SEED_OFFSET = 97  # held-out template fills (the teacher text's: FREE_PROMPT_TEXT_SEED_OFFSET)
FREE_PROMPT_FILLS = 8


def explain_penalty() -> float:
    """The repetition penalty the ReasoningService gives an Explain request that sets none."""
    return float(_service_default("explain_repetition_penalty"))


def explain_copies_names() -> bool:
    """Whether the ReasoningService sends an Explain request's names by default (``explain_copy_names``)."""
    return bool(_service_default("explain_copy_names"))


def _service_default(field: str):
    from ..serving.reasoning.config import ReasoningServiceConfig

    return ReasoningServiceConfig.model_fields[field].default


def served_label(ctx: GeneratorContext) -> str:
    quantize = ctx.settings.publish.quantize
    graph = "FP32" if quantize == "none" else quantize.upper()
    return f"generator (a)+(b), published {graph} graph{SERVED_SUFFIX}"


def served_explanations(
    ctx: GeneratorContext, decoder, examples: list, penalty: float, copy_names: bool = True
) -> list[str]:
    """``decoder`` (an ``OnnxDecoder``) explains ``examples`` through the serving engine, all admitted
    at once, greedy at ``penalty``, each with its prompt's names as Explain sends them (``copy_names``:
    ``ReasoningServiceConfig.explain_copy_names``); the texts, special tokens dropped."""
    from ..compression.generator_data import explain_prompts
    from ..prompts import explain_names
    from ..tokenization import copy_name_ids

    prompts = explain_prompts(examples, ctx.tokenizer_file, ctx.settings.teacher_text.max_prompt_tokens)
    names = [
        copy_name_ids(ctx.tokenizer, explain_names(e.member, e.item)) if copy_names else [] for e in examples
    ]
    return _served_texts(ctx, decoder, prompts, penalty, names)


def _served_texts(
    ctx: GeneratorContext, decoder, prompts: list[list[int]], penalty: float, names: list | None = None
) -> list[str]:
    """``prompts`` decoded through the serving engine, all admitted at once, greedy at ``penalty``;
    ``names``: each prompt's ``copy_names`` (None: none)."""
    from ..triton_models.generator import BatchEngine, GenerationRequest, generate

    limit = ctx.settings.evaluation.max_new_tokens
    names = names or [[] for _ in prompts]
    requests = [
        GenerationRequest(tuple(p), limit, repetition_penalty=penalty, copy_names=tuple(map(tuple, n)))
        for p, n in zip(prompts, names, strict=True)
    ]
    texts = _token_texts(ctx.tokenizer_file, decoder.vocab_size) if any(names) else None
    outputs = generate(BatchEngine(decoder, ctx.end_ids, texts), requests)
    return [ctx.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]


@lru_cache(maxsize=2)
def _token_texts(tokenizer_file: Path, vocab_size: int):
    """The ``TokenTexts`` of the tokenizer (read once: a served row decodes several sets of pairs)."""
    from ..triton_models.generator import TokenTexts

    return TokenTexts.of_tokenizer(tokenizer_file, vocab_size)


def free_prompt_answers(ctx: GeneratorContext, decoder) -> dict:
    """Free ``Generate`` prompts as the service decodes them (its default repetition penalty): held-out
    fills of the free-instruction templates and off-topic questions. ``as_explanations`` is the share
    answered as an explanation of fit (a verdict in the first sentence), which no free prompt asks for."""
    from ..compression.generator_data import chat_prompts
    from ..data.explanations import OFF_TOPIC_INSTRUCTIONS, general_instructions
    from ..evaluation.grounding import parse_verdict

    seed = ctx.settings.teacher_text.seed + FREE_PROMPT_SEED_OFFSET
    instructions = [*general_instructions(FREE_PROMPT_FILLS, seed), *OFF_TOPIC_INSTRUCTIONS]
    prompts = chat_prompts(instructions, ctx.tokenizer_file, ctx.settings.teacher_text.max_prompt_tokens)
    texts = _served_texts(ctx, decoder, prompts, float(_service_default("default_repetition_penalty")))
    verdicts = [parse_verdict(t) is not None for t in texts]
    return {
        "as_explanations": sum(verdicts) / len(verdicts),
        "answers": [{"prompt": i, "text": t} for i, t in zip(instructions, texts, strict=True)],
    }


def _keyed(examples: list, texts: list[str]) -> list[dict]:
    """Each pair's ``member_id/item_id`` with its text (kept in the export report)."""
    return [{"key": f"{e.member_id}/{e.item_id}", "text": t} for e, t in zip(examples, texts, strict=True)]


def served_row(ctx: GeneratorContext, onnx_path: Path, threads: int = 0) -> GeneratorRow:
    """The grounding of the graph at ``onnx_path`` as served (its teacher-forced columns stay empty)."""
    from ..evaluation.grounding import evaluate_grounding
    from ..triton_models.generator import OnnxDecoder

    started = time.perf_counter()
    decoder, penalty, names = OnnxDecoder(onnx_path, threads), explain_penalty(), explain_copies_names()
    nan = float("nan")
    notes = {"repetition_penalty": penalty, "copy_names": names}
    row = GeneratorRow(served_label(ctx), nan, nan, nan, notes=notes)
    examples = ctx.grounding_examples()
    decisions, source = scorer_decisions(ctx, examples)
    texts = served_explanations(ctx, decoder, examples, penalty, names)
    summary, _ = evaluate_grounding([(e.member, e.item) for e in examples], texts, decisions)
    row.set_grounding(summary, source if decisions is not None else None)
    row.notes["explanations"] = _keyed(examples, texts)
    for examples_of, take, note in (
        (ctx.unseen_skill_examples, row.set_unseen_grounding, "unseen_skill_explanations"),
        (ctx.full_match_examples, row.set_full_match_grounding, "full_match_explanations"),
    ):
        more = examples_of()
        if more:
            more_texts = served_explanations(ctx, decoder, more, penalty, names)
            take(evaluate_grounding([(e.member, e.item) for e in more], more_texts)[0])
            row.notes[note] = _keyed(more, more_texts)
    free = row.notes["free_prompts"] = free_prompt_answers(ctx, decoder)
    row.notes["seconds"] = round(time.perf_counter() - started, 1)
    log.info("%s: %s", row.stage, {k: v for k, v in row.as_dict().items() if k != "notes"})
    log.info(
        "free Generate prompts answered as an explanation of fit: %d of %d (not gated)",
        round(free["as_explanations"] * len(free["answers"])),
        len(free["answers"]),
    )
    return row


def served_check(ctx: GeneratorContext, threads: int = 0) -> Callable[[Path], dict] | None:
    """The ``check_graph`` of ``publish_generator``: the graph's served row (a dict, kept in the export
    report), after the recipe's grounding gates passed on it; None when the recipe has no grounding pairs."""
    if not ctx.grounding_examples():
        return None

    def check(onnx_path: Path) -> dict:
        row = served_row(ctx, onnx_path, threads)
        check_grounding_gates(ctx.settings, row)
        return row.as_dict()

    return check


def served_rows(version_dir: Path | None) -> list[GeneratorRow]:
    """The served row that a published generator version's export report holds ([] when none)."""
    import json

    if version_dir is None:
        return []
    try:
        report = json.loads((Path(version_dir) / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return []
    row = report.get(SERVED_GROUNDING_KEY)
    return [GeneratorRow.from_dict(row)] if row else []
