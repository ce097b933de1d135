"""ReasoningService units: streaming-safe detokenization, stop strings, validation, proto conversion, config."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from slimserve.models.teacher import default_tokenizer_file
from slimserve.serving.errors import InvalidArgument
from slimserve.serving.reasoning.config import ReasoningServiceConfig
from slimserve.serving.reasoning.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from slimserve.serving.reasoning.servicer import options_from_proto
from slimserve.serving.reasoning.stop_strings import StopStringMatcher
from slimserve.serving.reasoning.validation import (
    GenerationOptions,
    resolve_options,
    validate_explain,
    validate_prompt,
)
from slimserve.settings import load_config
from slimserve.v1 import reasoning_pb2

MULTI_BYTE = "Grüße aus Köln 🙂 \u2013 東京タワー, ça va? Ünïcödé ✓✓ 👩‍💻 done."


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_tokenizer_file()))


def stream(detokenizer: IncrementalDetokenizer, ids: list[int], step: int) -> list[str]:
    pieces = [detokenizer.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    return [*pieces, detokenizer.flush()]


@pytest.mark.parametrize("step", [1, 2, 3])
def test_detokenizer_never_splits_a_character(tokenizer, step):
    ids = tokenizer.encode(MULTI_BYTE, add_special_tokens=False).ids
    single = [tokenizer.decode([i]) for i in ids]
    assert any(REPLACEMENT_CHAR in text for text in single), "the text must split characters over tokens"
    pieces = stream(IncrementalDetokenizer(tokenizer), ids, step)
    assert "".join(pieces) == tokenizer.decode(ids) == MULTI_BYTE
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)
    assert "" in pieces[:-1], "some tokens must have been held back until their character completed"


def test_detokenizer_skips_special_tokens_and_keeps_spaces(tokenizer):
    text = "Hello there,  world<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = stream(IncrementalDetokenizer(tokenizer), ids, 1)
    assert "".join(pieces) == "Hello there,  world"


def test_detokenizer_flushes_an_incomplete_character_at_the_end(tokenizer):
    ids = tokenizer.encode("東", add_special_tokens=False).ids
    assert len(ids) > 1
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(ids[:-1]) == ""
    assert detokenizer.flush() == tokenizer.decode(ids[:-1])  # the replacement character, once
    assert detokenizer.flush() == ""


def feed(matcher: StopStringMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.push(p) for p in pieces)
    return out + matcher.flush()


def test_stop_string_cuts_before_the_match_across_pieces():
    matcher = StopStringMatcher(["\n\n", "END"])
    assert feed(matcher, ["Hello E", "N", "D and more"]) == "Hello "
    assert matcher.matched == "END"
    matcher = StopStringMatcher(["\n\n", "END"])
    assert feed(matcher, ["one\n", "\ntwo"]) == "one"
    assert matcher.matched == "\n\n"


def test_stop_string_holds_back_only_possible_prefixes():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("abc ST") == "abc "  # "ST" may become STOP
    assert matcher.push("ART") == "START"  # it did not
    assert matcher.push(" xS") == " x"
    assert matcher.flush() == "S"  # the end: the held-back tail was plain text
    assert not matcher.matched


def test_stop_string_earliest_match_wins_and_nothing_after():
    matcher = StopStringMatcher(["b", "abc"])
    assert matcher.push("xxabc") == "xx"  # "abc" starts before "b"
    assert matcher.matched == "abc"
    assert matcher.push("more") == "" and matcher.flush() == ""


def test_no_stop_strings_passes_text_through():
    matcher = StopStringMatcher([])
    assert matcher.push("a") == "a" and matcher.flush() == ""


CONFIG = ReasoningServiceConfig(max_tokens_limit=100, default_max_tokens=32)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (GenerationOptions(max_tokens=101), "options.max_tokens"),
        (GenerationOptions(temperature=-0.1), "options.temperature"),
        (GenerationOptions(temperature=2.5), "options.temperature"),
        (GenerationOptions(temperature=float("nan")), "options.temperature"),
        (GenerationOptions(top_p=0.0), "options.top_p"),
        (GenerationOptions(top_p=1.5), "options.top_p"),
        (GenerationOptions(stop=("a", "b", "c", "d", "e")), "options.stop"),
        (GenerationOptions(stop=("ok", "")), "options.stop[1]"),
        (GenerationOptions(stop=("x" * 65,)), "options.stop[0]"),
        (GenerationOptions(repetition_penalty=0.9), "options.repetition_penalty"),
        (GenerationOptions(repetition_penalty=2.5), "options.repetition_penalty"),
        (GenerationOptions(repetition_penalty=float("inf")), "options.repetition_penalty"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(InvalidArgument) as info:
        resolve_options(options, CONFIG, model_limit=512)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_options_defaults_and_model_limit():
    resolved = resolve_options(GenerationOptions(), CONFIG, model_limit=512)
    assert (resolved.max_tokens, resolved.temperature, resolved.top_p, resolved.seed) == (32, 0.0, 1.0, None)
    assert not resolved.explicit_max_tokens
    assert resolved.repetition_penalty == CONFIG.default_repetition_penalty == 1.15
    assert resolve_options(GenerationOptions(repetition_penalty=1.0), CONFIG, 512).repetition_penalty == 1.0
    explain = resolve_options(
        GenerationOptions(), CONFIG, 512, default_penalty=CONFIG.explain_repetition_penalty
    )
    assert explain.repetition_penalty == CONFIG.explain_repetition_penalty == 1.0  # Explain's default
    assert (
        resolve_options(
            GenerationOptions(repetition_penalty=1.3), CONFIG, 512, default_penalty=1.0
        ).repetition_penalty
        == 1.3
    )
    assert resolve_options(GenerationOptions(max_tokens=100), CONFIG, 512).max_tokens == 100
    with pytest.raises(InvalidArgument, match="over the limit of 50"):  # the model's limit wins
        resolve_options(GenerationOptions(max_tokens=60), CONFIG, model_limit=50)
    assert resolve_options(GenerationOptions(), CONFIG, model_limit=20).max_tokens == 20


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [("", "required"), ("   ", "required"), ("x" * 8001, "at most 8000"), ("bell\x07", "control")],
)
def test_bad_prompt(prompt, problem):
    with pytest.raises(InvalidArgument, match=problem) as info:
        validate_prompt(prompt, ReasoningServiceConfig())
    assert info.value.field == "prompt"


def test_explain_needs_member_and_item():
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates

    config = ReasoningServiceConfig()
    with pytest.raises(InvalidArgument) as info:
        validate_explain(None, example_candidates(1)[0], config)
    assert info.value.field == "member"
    with pytest.raises(InvalidArgument) as info:
        validate_explain(EXAMPLE_MEMBER, None, config)
    assert info.value.field == "item"
    validate_explain(EXAMPLE_MEMBER, example_candidates(1)[0], config)


def test_options_from_proto_keeps_unset_apart_from_zero():
    unset = options_from_proto(reasoning_pb2.GenerationOptions())
    assert (unset.top_p, unset.seed, unset.max_tokens) == (None, None, 0)
    zero = options_from_proto(reasoning_pb2.GenerationOptions(top_p=0.0, seed=0, stop=["\n"]))
    assert (zero.top_p, zero.seed, zero.stop) == (0.0, 0, ("\n",))


def test_config_from_environment_and_defaults():
    config = load_config(
        ReasoningServiceConfig,
        environ={"SLIMSERVE_REASONING_PORT": "6000", "SLIMSERVE_SCORING_PORT": "7000"},
    )
    assert config.port == 6000 and config.model_name == "generator" and config.metrics_port == 9091
    for name, info in ReasoningServiceConfig.model_fields.items():
        assert not info.is_required() and info.description, name


def test_service_container_config_loads():
    from slimserve.protos_gen import ROOT

    config = load_config(ReasoningServiceConfig, ROOT / "services" / "reasoning" / "config.yaml", environ={})
    assert (config.host, config.port, config.triton_url) == ("0.0.0.0", 50052, "triton:8001")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("queue full: 8 requests already waiting", "ResourceExhausted"),
        ("Request for unknown model: 'generator' is not found", "Unavailable"),
        ("the generator model is unloading", "Unavailable"),
        ("generation failed: RuntimeError: boom", "InternalError"),
    ],
)
def test_stream_errors_map_by_the_models_message(message, error):
    from slimserve.serving.triton.client import map_stream_error

    mapped = map_stream_error(message, "generate on 'generator'")
    assert type(mapped).__name__ == error
    assert "boom" not in mapped.message  # internals stay in the log
