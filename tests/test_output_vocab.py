"""The generator's LM-head shortlist (``export.output_vocab``): the trimmed graph, its engine, its export."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from slimserve.export.generator_config import GeneratorExportConfig
from slimserve.export.generator_export import build_decoder_onnx, save_hf_model
from slimserve.export.generator_parity import encode_prompts, explanation_prompts, torch_greedy
from slimserve.export.generator_repository import REPORT_FILE, publish_generator
from slimserve.export.onnx_export import ExportError
from slimserve.export.output_vocab import shortlist, trim_lm_head
from slimserve.export.repository import MODEL_CARD_FILE
from slimserve.models.teacher import load_teacher
from slimserve.triton_models.generator import (
    OUTPUT_VOCAB_FILE,
    BatchEngine,
    GenerationRequest,
    OnnxDecoder,
    OutputColumns,
    generate,
    penalize_repeats,
)

LOWEST = 1000  # the tiny model's shortlist: ids 0..999 (its prompts hold many ids above)
SPECIAL = 3  # a shortlist of the special ids 0..2 only: nearly every written token is a prompt's


@pytest.fixture(scope="module")
def tiny():
    return load_teacher("tiny", seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    sequences = encode_prompts(tiny.tokenizer_file, explanation_prompts(2))
    return [sequences[0][:120], sequences[1][:90]]


@pytest.fixture(scope="module")
def graphs(tiny, tmp_path_factory):
    """The tiny model's FP32 decoder graph, whole and with its head trimmed to ``LOWEST`` and to
    ``SPECIAL`` ids."""
    root = tmp_path_factory.mktemp("output-vocab")
    full = build_decoder_onnx(save_hf_model(tiny.model, root / "hf", tiny.tokenizer_file), root / "full")
    vocab = int(tiny.model.config.vocab_size)
    trimmed = []
    for lowest in (LOWEST, SPECIAL):
        shutil.copytree(root / "full", root / f"short{lowest}")
        trim_lm_head(root / f"short{lowest}" / "model.onnx", shortlist(vocab, lowest, [2]), vocab)
        trimmed.append(OnnxDecoder(root / f"short{lowest}" / "model.onnx", 1))
    return OnnxDecoder(full.onnx_path, 1), *trimmed


class MaskedHead:
    """The whole graph with every column outside ``allowed`` at -inf: what a shortlist must equal."""

    def __init__(self, decoder, allowed):
        self.decoder, self.past_names, self.kv_headroom = decoder, decoder.past_names, decoder.kv_headroom
        self.blocked = ~np.isin(np.arange(decoder.vocab_size), allowed)

    def extra_tokens(self, tokens):
        return np.zeros(0, np.int64)

    def output_columns(self, extra):
        return None

    def _masked(self, logits):
        logits = logits.copy()
        logits[..., self.blocked] = -np.inf
        return logits

    def decode(self, tokens, batch, extra=None):
        return self._masked(self.decoder.decode(tokens, batch))

    def prefill(self, prompt, extra=None):
        logits, cache = self.decoder.prefill(prompt)
        return self._masked(logits), cache


def test_shortlist_keeps_the_lowest_ids_and_the_extra_ones():
    assert shortlist(10, 3, [7, 2]) == [0, 1, 2, 7]
    with pytest.raises(ExportError, match="output_vocab must be in"):
        shortlist(10, 0)
    with pytest.raises(ExportError, match="token id 12 is outside"):
        shortlist(10, 3, [12])


def test_trimmed_logits_are_the_whole_heads_columns_of_the_shortlist_and_the_prompt(graphs, prompts):
    full, short, _ = graphs
    assert short.vocab_size == full.vocab_size  # every id still reads as input
    assert short.shortlist.tolist() == list(range(LOWEST))
    prompt = prompts[0]
    extra = short.extra_tokens(prompt)
    assert extra.size and extra.min() >= LOWEST and set(extra) <= set(prompt)
    columns = short.output_columns(extra).ids
    whole, whole_cache = full.prefill(prompt)
    trimmed, trimmed_cache = short.prefill(prompt, extra)
    np.testing.assert_allclose(trimmed, whole[columns], rtol=1e-5, atol=1e-5)
    step = np.array([[int(columns[np.argmax(trimmed)])]], dtype=np.int64)
    mask = np.ones((1, len(prompt) + 1), dtype=np.int64)
    whole, _ = full.run(step, mask, whole_cache)
    trimmed, _ = short.run(step, mask, trimmed_cache, extra)
    np.testing.assert_allclose(trimmed[0], whole[0][columns], rtol=1e-5, atol=1e-5)
    inside = [t for t in prompt if t < LOWEST]  # a prompt the shortlist covers: no extra rows
    assert short.extra_tokens(inside).size == 0
    whole, _ = full.prefill(inside)
    trimmed, _ = short.prefill(inside, short.extra_tokens(inside))
    np.testing.assert_allclose(trimmed, whole[:LOWEST], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shortlisted", [1, 2], ids=["lowest-1000", "special-only"])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_engine_writes_what_the_whole_head_writes_when_masked_to_the_same_tokens(
    graphs, prompts, penalty, shortlisted
):
    full, short = graphs[0], graphs[shortlisted]
    for prompt in prompts:
        allowed = np.union1d(short.shortlist, prompt)
        request = GenerationRequest(tuple(prompt), 12, repetition_penalty=penalty)
        (tokens,) = generate(BatchEngine(short), [request])
        (expected,) = generate(BatchEngine(MaskedHead(full, allowed)), [request])
        assert tokens == expected
        assert set(tokens) <= set(allowed.tolist())
        if short.shortlist.size == SPECIAL:
            assert any(t >= SPECIAL for t in tokens)  # prompt tokens the shortlist lacks were written


def test_a_batch_scores_every_running_prompts_tokens(graphs, prompts):
    short = graphs[2]
    requests = [GenerationRequest(tuple(p), 10) for p in prompts]
    batched = generate(BatchEngine(short), requests)
    allowed = set(np.union1d(short.shortlist, np.concatenate(prompts)).tolist())
    assert all(set(tokens) <= allowed for tokens in batched)
    assert batched[0][0] == generate(BatchEngine(short), requests[:1])[0][0]  # prefill alone either way


def test_repetition_penalty_reaches_the_column_of_each_seen_id():
    columns = OutputColumns(np.array([0, 1, 2, 40]), np.array([7, 90]))
    assert columns.ids.tolist() == [0, 1, 2, 40, 7, 90] and columns.token(4) == 7
    assert sorted(columns.of(np.array([40, 7, 5, 99])).tolist()) == [3, 4]  # 5 and 99 have no column
    logits = np.array([1.0, 1.0, 1.0, 4.0, -2.0, 3.0], dtype=np.float32)
    penalized = penalize_repeats(logits, {40, 7, 5}, 2.0, columns)
    np.testing.assert_allclose(penalized, [1.0, 1.0, 1.0, 2.0, -4.0, 3.0])
    assert OutputColumns(np.array([0, 1]), np.zeros(0, np.int64)).of(np.array([1, 3])).tolist() == [1]


def _config(repository, output_vocab) -> GeneratorExportConfig:
    return GeneratorExportConfig(
        model_repository=repository,
        quantize=None,
        parity_prompts=3,
        parity_tokens=8,
        max_context=1024,
        intra_op_threads=1,
        output_vocab=output_vocab,
    )


@pytest.fixture(scope="module")
def contrary(tiny):
    """The tiny model with its final norm negated: a random tied model echoes its input token; this one
    writes the tokens least like it, which its prompts mostly lack."""
    import copy

    import torch

    model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        model.model.norm.weight.mul_(-1)
    return model


def test_publish_trims_the_head_keeping_what_the_parity_prompts_write(contrary, tiny, tmp_path):
    sequences = encode_prompts(tiny.tokenizer_file, explanation_prompts(3))
    greedy = torch_greedy(contrary, sequences, 8)
    pairs = zip(sequences, greedy, strict=True)
    outside = [t for prompt, tokens in pairs for t in tokens if t >= 10 and t not in prompt]
    assert outside  # a 10-token shortlist and the prompts lack tokens PyTorch writes

    version = publish_generator(contrary, tiny.tokenizer_file, _config(tmp_path / "repo", 10))
    vocab = json.loads((version / OUTPUT_VOCAB_FILE).read_text())
    assert vocab["vocab_size"] == tiny.model.config.vocab_size
    assert vocab["token_ids"] == sorted({*range(10), *outside})  # the end ids 0 and 2 are among 0..9
    report = json.loads((version / REPORT_FILE).read_text())
    assert report["output_vocab"] == {
        "shortlist": len(vocab["token_ids"]),
        "vocab_size": tiny.model.config.vocab_size,
        "parity_tokens_outside": len(outside),
        "parity_tokens_written": 3 * 8,
    }
    assert report["parity_fp32"]["identical"]  # the gate ran on the trimmed graph
    assert "shortlist" in (version / MODEL_CARD_FILE).read_text()
    decoder = OnnxDecoder(version / "model.onnx", 1)
    requests = [GenerationRequest(tuple(s), 8) for s in sequences]
    assert generate(BatchEngine(decoder), requests) == greedy


def test_output_vocab_needs_a_tied_lm_head(tmp_path):
    from transformers import LlamaForCausalLM

    from slimserve.models.teacher import tiny_llama_config

    loaded = load_teacher("tiny", seed=0)
    config = tiny_llama_config(loaded.model.config.vocab_size)
    config.tie_word_embeddings = False
    untied = LlamaForCausalLM(config)
    with pytest.raises(ExportError, match="tied to its embedding"):
        publish_generator(untied, loaded.tokenizer_file, _config(tmp_path, 100))
