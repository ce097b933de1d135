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
from slimserve.tokenization import MAX_COPY_NAME_VALUES, copy_name_ids
from slimserve.triton_models.generator import (
    MAX_COPY_NAME_IDS,
    BatchEngine,
    GenerationRequest,
    Limits,
    NameCopier,
    OnnxDecoder,
    OutputColumns,
    RequestError,
    Sampler,
    TokenTexts,
    generate,
    parse_request,
)

LIMITS = Limits(vocab_size=100, max_context=64, max_new_tokens_limit=32)


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


# A byte-level BPE vocabulary in small: "Ġ" is the space before a word.
VOCAB = {"Ġpost": 10, "gres": 11, "ql": 12, "res": 13, "Ġand": 14, "g": 15, "Ġaudit": 16, "Ġaud": 17}
VOCAB |= {
    "t": 18,
    "it": 19,
    "i": 20,
    ",": 21,
    "Ġjava": 22,
    "script": 23,
    "Ġgr": 24,
    "pc": 25,
    "Ġ": 26,
    "2": 27,
}
TEXTS = TokenTexts(VOCAB, 30)
POSTGRESQL, AUDIT, JAVA, GRPC = (10, 11, 12), (16,), (22,), (24, 25)


def _greedy_with(names, preferred, liked=()):
    """A greedy sampler fed one step per ``preferred`` token (the model's first choice); ``liked``: tokens
    a little likelier than the rest, in rising order."""
    sampler = Sampler(copier=NameCopier(names, TEXTS))
    chosen = []
    for token in preferred:
        logits = np.zeros(30, np.float32)
        logits[list(liked)] = np.arange(1, len(liked) + 1)
        logits[token] = 10.0
        chosen.append(sampler(logits))
    return chosen


def test_a_name_begun_is_finished_as_the_prompt_spells_it():
    # " post" begins postgresql; the model's "res" would write "postresql": the likelier of the pieces
    # that go on with it ("g" or "gres") comes instead, then "ql".
    assert _greedy_with([POSTGRESQL], [10, 13, 13], liked=(15, 11, 12)) == [10, 11, 12]
    # a name of one token, begun by a shorter one: " aud" + "t" would be "audt"; "it" (or "i") goes on
    assert _greedy_with([AUDIT], [17, 18], liked=(20, 19)) == [17, 19]


def test_a_token_that_ends_the_word_or_stays_on_the_name_is_left_alone():
    assert _greedy_with([POSTGRESQL], [10, 14, 13]) == [10, 14, 13]  # " post and res": the copy ended
    assert _greedy_with([POSTGRESQL], [10, 21]) == [10, 21]  # " post,": punctuation ends it too
    assert _greedy_with([POSTGRESQL], [10, 15, 13]) == [10, 15, 13]  # " post" "g" "res": still postgres-


def test_the_best_of_several_names_begun_wins_and_a_whole_name_frees_the_word():
    # " gr" begins grpc, " post" postgresql: after " gr" the model's "t" becomes "pc"
    assert _greedy_with([POSTGRESQL, GRPC], [24, 18], liked=(11, 25)) == [24, 25]
    # " java" is a whole name: the word may go on as the model likes ("javascript" is no name here)
    assert _greedy_with([JAVA, POSTGRESQL], [22, 23]) == [22, 23]
    # without a name begun, nothing changes; a space alone begins none ("Ġ" then "2": " 2")
    assert _greedy_with([POSTGRESQL], [14, 13, 13]) == [14, 13, 13]
    assert _greedy_with([POSTGRESQL], [26, 27], liked=(11,)) == [26, 27]


def test_sampling_and_a_shortlisted_head_choose_among_the_pieces_that_go_on():
    columns = OutputColumns(np.array([10, 13, 14]), np.array([11, 12]))  # logit columns: 10 13 14 11 12
    sampler = Sampler(temperature=1.0, seed=3, copier=NameCopier([POSTGRESQL], TEXTS))
    assert sampler(np.array([9.0, 0.0, 0.0, 0.0, 0.0], np.float32), columns) == 10
    # "res" preferred; of the pieces that go on ("g", "gres") only "gres" has a column
    assert sampler(np.array([0.0, 9.0, 0.0, 1.0, 0.0], np.float32), columns) == 11


def test_word_starts_of_the_real_tokenizer():
    """SmolLM2's byte-level BPE: " postgresql" is "Ġpost" "gres" "ql", " node.js" is "Ġnode" "." "js"."""
    tokenizer = Tokenizer.from_file(str(default_tokenizer_file()))
    texts = TokenTexts.of_tokenizer(default_tokenizer_file(), tokenizer.get_vocab_size())
    postgresql, node_js = copy_name_ids(tokenizer, ["postgresql", "node.js"])
    assert [texts.continues_word(t) for t in postgresql] == [False, True, True]
    assert [texts.opens_word(t) for t in postgresql] == [True, False, False]
    assert [texts.continues_word(t) for t in node_js] == [False, False, True]
    assert [texts.texts[t] for t in postgresql] == ["Ġpost", "gres", "ql"]
    end, newline = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("Ċ")
    assert not texts.continues_word(end) and texts.opens_word(newline) and not texts.continues_word(newline)


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


def _a_name_to_copy(texts, plain, vocab_size):
    """(position, name) such that ``plain[position]`` opens a word of 2 characters or more, the next token
    continues it, and the name (that word, then a continuation the model did not write) begins no word
    written before; None when ``plain`` has no such position."""
    word, words = "", []
    for token in plain:
        word = texts.texts[token] if texts.opens_word(token) else word + texts.texts[token]
        words.append(word)
    for at in range(len(plain) - 1):
        first, drawn = texts.texts[plain[at]], texts.texts[plain[at + 1]]
        if not (texts.opens_word(plain[at]) and len(first) >= 2 and texts.continues_word(plain[at + 1])):
            continue
        other = next(
            t
            for t in range(1000, vocab_size)
            if texts.continues_word(t) and not texts.texts[t].startswith(drawn)
        )
        name = first + texts.texts[other]
        if not any(len(w) >= 2 and name.startswith(w) for w in words[:at]):
            return at, (plain[at], other)
    return None


def test_the_engine_keeps_a_name_whole_where_the_model_would_not(generator_repository):
    """The tiny random graph writes gibberish (sampled, seeded). Given a name made of a word it began and
    another ending than the one it drew next, it goes on with the name instead; the text before is unchanged."""
    version_dir = generator_bundle_dir(generator_repository).parent
    assert load_generator_bundle(generator_bundle_dir(generator_repository)).copy_names
    tokenizer_file = version_dir / "bundle" / "tokenizer.json"
    decoder = OnnxDecoder(version_dir / "model.onnx", 1)
    texts = TokenTexts.of_tokenizer(tokenizer_file, decoder.vocab_size)
    prompt = tuple(encode_prompts(tokenizer_file, explanation_prompts(1))[0])
    for seed in range(7, 40):  # the first seed whose text has a word to copy (seed 7 here)
        (plain,) = generate(
            BatchEngine(decoder, ()), [GenerationRequest(prompt, 48, temperature=1.0, seed=seed)]
        )
        found = _a_name_to_copy(texts, plain, decoder.vocab_size)
        if found:
            break
    assert found, "no sampled text began a word to copy"
    at, name = found
    request = GenerationRequest(prompt, 48, temperature=1.0, seed=seed, copy_names=(name,))
    (copied,) = generate(BatchEngine(decoder, (), texts), [request])
    assert copied[: at + 1] == plain[: at + 1] and copied[at + 1] != plain[at + 1]
    assert texts.texts[name[1]].startswith(texts.texts[copied[at + 1]])  # a piece of the name's rest
    (ignored,) = generate(BatchEngine(decoder, ()), [request])  # an engine without token texts copies nothing
    assert ignored == plain


def test_names_beyond_the_models_limit_are_left_out():
    """Explain sends as many names as the model's ``copy_names`` takes (a long title must not fail it)."""
    tokenizer = Tokenizer.from_file(str(default_tokenizer_file()))
    assert MAX_COPY_NAME_VALUES == MAX_COPY_NAME_IDS
    words = [f"vorlak{i}" for i in range(2000)]
    names = copy_name_ids(tokenizer, words)
    values = sum(len(n) + 1 for n in names)
    assert 0 < len(names) < len(words) and MAX_COPY_NAME_VALUES - 8 < values <= MAX_COPY_NAME_VALUES
    flat = np.array([t for n in names for t in (*n, -1)], np.int64)
    assert len(parse_request(_request(flat), Limits(49152, 64, 32)).copy_names) == len(names)
    assert copy_name_ids(tokenizer, ["postgresql", "grpc"], max_values=5) == copy_name_ids(
        tokenizer, ["postgresql"]
    )
