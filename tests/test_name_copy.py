"""Name copying (``copy_names``): once the generator starts copying a name of its prompt, it finishes it as
the prompt spells it. The request input, the rule, the real tokenizer's word starts, the names an Explain
prompt states, and the serving engine on the tiny published graph."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.export.generator_parity import encode_prompts, explanation_prompts
from slimserve.generator_bundle import generator_bundle_dir, load_generator_bundle
from slimserve.models.teacher import default_tokenizer_file
from slimserve.prompts import explain_names, render_explain_request
from slimserve.serving.triton.client import GenerationRequest as ClientRequest
from slimserve.serving.triton.client import generation_inputs
from slimserve.tokenization import word_token_ids
from slimserve.triton_models.generator import (
    BatchEngine,
    GenerationRequest,
    Limits,
    NameCopier,
    OnnxDecoder,
    OutputColumns,
    RequestError,
    Sampler,
    generate,
    parse_request,
    word_continuations,
)

LIMITS = Limits(vocab_size=100, max_context=64, max_new_tokens_limit=32)
# Tokens 11..13 and 15 continue a word, 10, 14 and 20 start one: the name (10, 11, 12) is one word.
CONTINUES = np.isin(np.arange(30), [11, 12, 13, 15])


def _request(names) -> dict:
    return {
        "input_ids": np.array([1, 2], np.int64),
        "max_tokens": np.array([4], np.int32),
        "copy_names": np.array(names),
    }


def test_copy_names_parse_into_one_tuple_per_name():
    request = parse_request(_request([10, 11, 12, -1, 14, -1]), LIMITS)
    assert request.copy_names == ((10, 11, 12), (14,))
    assert parse_request(_request(np.array([], np.int64)), LIMITS).copy_names == ()


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        ([10, 11], "must end each name with -1"),
        ([10, -1, -1], "empty name"),
        ([-1], "empty name"),
        ([10, 100, -1], "outside the vocabulary"),
        (np.array([10.0, -1.0]), "INT64"),
        (np.tile([5, -1], 1025), "at most 2048"),
    ],
)
def test_bad_copy_names_are_refused_naming_the_input(names, problem):
    with pytest.raises(RequestError, match=f"'copy_names'.*{problem}"):
        parse_request(_request(names), LIMITS)


def _greedy_with(names, steps):
    """A greedy sampler over ``CONTINUES`` that is fed ``steps``: each the token the model prefers."""
    sampler = Sampler(copier=NameCopier(names, CONTINUES))
    chosen = []
    for preferred in steps:
        logits = np.zeros(30, np.float32)
        logits[preferred] = 5.0
        logits[[11, 12, 13]] += [1.0, 2.0, 0.5]  # names' tokens: second choices, in this order
        chosen.append(sampler(logits))
    return chosen


def test_a_name_begun_is_finished_as_the_prompt_spells_it():
    # 10 starts the name; the model's 13 would continue the word otherwise ("postresql"): 11, then 12.
    assert _greedy_with([(10, 11, 12)], [10, 13, 13, 13]) == [10, 11, 12, 13]


def test_a_token_that_ends_the_word_is_left_alone():
    # After 10 the model starts a new word (20): the copy ends there, as the model chose.
    assert _greedy_with([(10, 11, 12)], [10, 20, 13]) == [10, 20, 13]


def test_the_best_of_several_names_begun_wins_and_a_whole_name_frees_the_word():
    # Both (10, 11) and (10, 12) begin with 10: the model's 13 becomes the likelier of 11 and 12 (12).
    assert _greedy_with([(10, 11), (10, 12)], [10, 13]) == [10, 12]
    # (10,) is a whole name ("java" beside "javascript"): the word may go on as the model likes.
    assert _greedy_with([(10,), (10, 11, 12)], [10, 13]) == [10, 13]
    # Without a name begun, nothing changes.
    assert _greedy_with([(10, 11, 12)], [14, 13, 13]) == [14, 13, 13]


def test_sampling_and_a_shortlisted_head_choose_among_the_names_tokens():
    columns = OutputColumns(np.array([10, 13, 14]), np.array([11, 12]))  # logit columns: 10 13 14 11 12
    logits = np.array([9.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    sampler = Sampler(temperature=1.0, seed=3, copier=NameCopier([(10, 11, 12)], CONTINUES))
    assert sampler(logits, columns) == 10
    logits = np.array([0.0, 9.0, 0.0, 1.0, 0.0], np.float32)  # 13 preferred; the name needs 11
    assert sampler(logits, columns) == 11


def test_word_starts_of_the_real_tokenizer():
    """SmolLM2's byte-level BPE: " postgresql" is "Ġpost" "gres" "ql", " node.js" is "Ġnode" "." "js"."""
    tokenizer = Tokenizer.from_file(str(default_tokenizer_file()))
    continues = word_continuations(default_tokenizer_file(), tokenizer.get_vocab_size())
    postgresql, node_js = word_token_ids(tokenizer, ["postgresql", "node.js"])
    assert [bool(continues[t]) for t in postgresql] == [False, True, True]
    assert [bool(continues[t]) for t in node_js] == [False, False, True]
    assert not continues[tokenizer.token_to_id("<|im_end|>")] and not continues[tokenizer.token_to_id("Ċ")]


def test_explain_names_are_the_words_of_the_prompts_names():
    item = example_candidates(3)[0]
    names = explain_names(EXAMPLE_MEMBER, item)
    text = render_explain_request(EXAMPLE_MEMBER, item)
    assert set(item.required_skills) <= set(names) and item.company in names
    assert all(word in text for word in names) and len(set(names)) == len(names)
    assert "Start" not in names and "verdict" not in names  # the instruction's words are no names


def test_the_client_sends_each_name_ended_by_minus_one():
    request = ClientRequest(input_ids=[1, 2], max_tokens=3, copy_names=[(10, 11), (12,)])
    sent = {t.name(): t for t in generation_inputs(request)}
    assert "copy_names" in sent and sent["copy_names"].shape() == [5]
    assert "copy_names" not in {t.name() for t in generation_inputs(ClientRequest([1, 2], 3))}


def test_the_engine_keeps_a_name_whole_where_the_model_would_not(generator_repository):
    """The tiny random graph writes gibberish (sampled, seeded): a name made of one of its tokens and another
    word-continuing token than the one it drew next comes out whole; the text before it is unchanged."""
    version_dir = generator_bundle_dir(generator_repository).parent
    assert load_generator_bundle(generator_bundle_dir(generator_repository)).copy_names
    tokenizer_file = version_dir / "bundle" / "tokenizer.json"
    decoder = OnnxDecoder(version_dir / "model.onnx", 1)
    continues = word_continuations(tokenizer_file, decoder.vocab_size)
    prompt = tuple(encode_prompts(tokenizer_file, explanation_prompts(1))[0])
    plain_request = GenerationRequest(prompt, 48, temperature=1.0, seed=7)
    (plain,) = generate(BatchEngine(decoder, ()), [plain_request])
    at = next(i for i in range(len(plain) - 1) if continues[plain[i + 1]] and plain[i] not in plain[:i])
    other = next(t for t in range(1000, decoder.vocab_size) if continues[t] and t != plain[at + 1])
    request = GenerationRequest(prompt, 48, temperature=1.0, seed=7, copy_names=((plain[at], other),))
    (copied,) = generate(BatchEngine(decoder, (), continues), [request])
    assert copied[: at + 2] == [*plain[: at + 1], other]
    (ignored,) = generate(BatchEngine(decoder, ()), [request])  # an engine without word starts copies nothing
    assert ignored == plain
