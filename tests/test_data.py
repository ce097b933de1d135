"""The dataset: loader errors name file, line and field; the generator is reproducible and calibrated."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from slimserve.data import vocab
from slimserve.data.cli import add_data_commands
from slimserve.data.records import (
    DATA_FILES,
    DataError,
    Dataset,
    Interaction,
    load_dataset,
    load_manifest,
    write_dataset,
)
from slimserve.data.splits import assign_members, bayes_optimal_auc, split_dataset
from slimserve.data.synth import SynthConfig, oracle_probabilities, synthesize, write_synthetic
from slimserve.errors import UserError
from slimserve.evaluation.metrics import auc
from slimserve.schema import ActivityKind, Seniority

SMALL = SynthConfig(seed=3, members=150, items=120)


@pytest.fixture(scope="module")
def default_synth():
    """The default-config dataset and manifest (generated once; about a second)."""
    return synthesize(SynthConfig())


@pytest.fixture
def small_dir(tmp_path) -> Path:
    write_synthetic(SMALL, tmp_path / "ds")
    return tmp_path / "ds"


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# -- generator ----------------------------------------------------------------------------------------
def test_same_seed_same_files_and_different_seed_different(tmp_path):
    write_synthetic(SMALL, tmp_path / "a")
    write_synthetic(SMALL, tmp_path / "b")
    write_synthetic(SMALL.model_copy(update={"seed": 4}), tmp_path / "c")
    assert set(_files(tmp_path / "a")) == {*DATA_FILES, "manifest.json"}
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    differing = [n for n, data in _files(tmp_path / "a").items() if _files(tmp_path / "c")[n] != data]
    assert set(differing) == {*DATA_FILES, "manifest.json"}


def test_tiny_catalogues_terminate():
    dataset, manifest = synthesize(SynthConfig(members=5, items=30, relevant_fraction=1.0, history_len=4))
    assert len(dataset.interactions) == 5 * 8
    assert manifest["counts"]["items"] == 30


def test_config_rejects_unknown_keys_and_documents_every_field():
    with pytest.raises(ValueError, match="extra"):
        SynthConfig(memberz=3)
    assert all(info.description for info in SynthConfig.model_fields.values())


def test_write_then_load_round_trips(small_dir):
    dataset, _ = synthesize(SMALL)
    loaded = load_dataset(small_dir)
    assert loaded.members == dataset.members
    assert loaded.items == dataset.items
    assert loaded.interactions == dataset.interactions
    assert all(len(m.history) == SMALL.history_len for m in loaded.members.values())


def test_default_positive_rate_and_bayes_auc(default_synth):
    _, manifest = default_synth
    assert 0.25 <= manifest["positive_rate"] <= 0.40
    for name in ("train", "validation", "test"):
        assert 0.8 <= bayes_optimal_auc(manifest, name) <= 0.95


def test_bayes_auc_recomputes_from_the_oracle(small_dir):
    dataset, manifest = load_dataset(small_dir), load_manifest(small_dir)
    splits = split_dataset(dataset, manifest["split"]["seed"], tuple(manifest["split"]["fractions"]))
    for name in ("train", "validation", "test"):
        examples = splits.by_name(name)
        recomputed = auc([e.label for e in examples], oracle_probabilities(examples, manifest))
        assert recomputed == pytest.approx(bayes_optimal_auc(manifest, name), abs=1e-6)


def test_bayes_auc_without_manifest_is_a_user_error():
    with pytest.raises(UserError, match="no Bayes-optimal AUC"):
        bayes_optimal_auc(None, "test")


def test_history_reflects_the_hidden_taste(default_synth):
    dataset, manifest = default_synth
    tastes = manifest["hidden"]["preferred_company_type"]
    share = {ActivityKind.ENGAGED: [0, 0], ActivityKind.DISMISSED: [0, 0]}
    for member in dataset.members.values():
        for activity in member.history:
            share[activity.kind][0] += vocab.company_type(activity.company) == tastes[member.id]
            share[activity.kind][1] += 1
    engaged = share[ActivityKind.ENGAGED][0] / share[ActivityKind.ENGAGED][1]
    dismissed = share[ActivityKind.DISMISSED][0] / share[ActivityKind.DISMISSED][1]
    chance = 1 / len(vocab.COMPANY_TYPES)
    assert engaged > chance + 0.15
    assert dismissed < chance


def test_descriptions_name_the_company_type(default_synth):
    dataset, _ = default_synth
    for item in list(dataset.items.values())[:50]:
        assert vocab.company_type(item.company) in item.description.lower()
        assert item.description.count(".") == 1


def test_prompts_stay_short_for_smollm2(default_synth):
    from slimserve.models.teacher import TeacherError, default_tokenizer_file
    from slimserve.prompts import render_scoring_prompt
    from slimserve.tokenization import PromptTokenizer

    try:
        tokenizer = PromptTokenizer(default_tokenizer_file(), max_length=10_000)
    except (TeacherError, ImportError) as exc:
        pytest.skip(f"SmolLM2 tokenizer unavailable: {exc}")
    dataset, _ = default_synth
    examples = split_dataset(dataset, seed=0, pool_factor=0).train[:1500]
    lengths = [
        len(ids) for ids in tokenizer.encode([render_scoring_prompt(e.member, e.item) for e in examples])
    ]
    assert max(lengths) < 220


# -- splits -------------------------------------------------------------------------------------------
def test_split_by_member_has_no_leakage_and_is_deterministic(default_synth):
    dataset, _ = default_synth
    splits = split_dataset(dataset, seed=11, pool_factor=0)
    members = {name: {e.member_id for e in splits.by_name(name)} for name in ("train", "validation", "test")}
    assert not members["train"] & members["validation"]
    assert not members["train"] & members["test"]
    assert not members["validation"] & members["test"]
    total = sum(len(splits.by_name(n)) for n in ("train", "validation", "test"))
    assert total == len(dataset.interactions)
    assert len(members["train"]) == round(0.7 * len(dataset.members))
    again = split_dataset(dataset, seed=11, pool_factor=0)
    assert [(e.member_id, e.item_id) for e in again.test] == [(e.member_id, e.item_id) for e in splits.test]
    assert assign_members(dataset.members, 11) != assign_members(dataset.members, 12)


def test_split_rejects_bad_fractions(default_synth):
    with pytest.raises(UserError, match="fractions"):
        split_dataset(default_synth[0], seed=0, fractions=(0.5, 0.5, 0.5))


def test_pool_pairs_are_unseen_train_pairs(default_synth):
    dataset, _ = default_synth
    splits = split_dataset(dataset, seed=5, pool_factor=1.0)
    train_members = {e.member_id for e in splits.train}
    seen = {(row.member_id, row.item_id) for row in dataset.interactions}
    pairs = [(e.member_id, e.item_id) for e in splits.pool]
    assert len(pairs) == len(splits.train) == len(set(pairs))
    assert all(e.label is None for e in splits.pool)
    assert {m for m, _ in pairs} <= train_members
    assert not set(pairs) & seen
    assert [(e.member_id, e.item_id) for e in split_dataset(dataset, seed=5).pool] == pairs


# -- loader errors ------------------------------------------------------------------------------------
def _set_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _edit(path: Path, number: int, **changes) -> None:
    record = json.loads(path.read_text().splitlines()[number - 1])
    record.update(changes)
    _set_line(path, number, json.dumps(record))


def _history_kind(path: Path, number: int, kind: str) -> None:
    record = json.loads(path.read_text().splitlines()[number - 1])
    record["history"][0]["kind"] = kind
    _set_line(path, number, json.dumps(record))


BAD_ROWS = [
    (
        "interactions.jsonl",
        lambda p: _edit(p, 17, label=2),
        "interactions.jsonl:17: label: expected 0 or 1, got 2",
    ),
    ("interactions.jsonl", lambda p: _edit(p, 4, label=True), "interactions.jsonl:4: label: expected 0 or 1"),
    ("interactions.jsonl", lambda p: _edit(p, 2, timestamp=1.5), "interactions.jsonl:2: timestamp: expected"),
    (
        "interactions.jsonl",
        lambda p: _edit(p, 3, member_id="m-x"),
        "interactions.jsonl:3: member_id: unknown member",
    ),
    (
        "interactions.jsonl",
        lambda p: _edit(p, 6, item_id="nope"),
        "interactions.jsonl:6: item_id: unknown item",
    ),
    ("interactions.jsonl", lambda p: _edit(p, 8, clicks=1), "interactions.jsonl:8: clicks: unknown field"),
    (
        "members.jsonl",
        lambda p: _history_kind(p, 3, "maybe"),
        "members.jsonl:3: member.history[0].kind: 'maybe'",
    ),
    ("members.jsonl", lambda p: _edit(p, 2, seniority="guru"), "members.jsonl:2: member.seniority: 'guru'"),
    (
        "members.jsonl",
        lambda p: _edit(p, 4, id="m-000"),
        "members.jsonl:4: id: duplicate 'm-000' (first on line 1)",
    ),
    ("items.jsonl", lambda p: _set_line(p, 5, '{"id": "job-x",'), "items.jsonl:5: not valid JSON: "),
    ("items.jsonl", lambda p: _edit(p, 7, salary=3), "items.jsonl:7: item.salary: unknown field"),
    (
        "items.jsonl",
        lambda p: _edit(p, 9, required_skills="go"),
        "items.jsonl:9: item.required_skills: expected",
    ),
    ("items.jsonl", lambda p: p.unlink(), "items.jsonl: missing"),
]


@pytest.mark.parametrize(("name", "corrupt", "message"), BAD_ROWS, ids=[m for _, _, m in BAD_ROWS])
def test_malformed_rows_name_file_line_and_field(small_dir, name, corrupt, message):
    corrupt(small_dir / name)
    with pytest.raises(DataError) as caught:
        load_dataset(small_dir)
    assert message in str(caught.value)


def test_blank_lines_are_skipped_and_line_numbers_kept(small_dir):
    path = small_dir / "interactions.jsonl"
    path.write_text("\n" + path.read_text())
    load_dataset(small_dir)
    _edit(path, 3, label=-1)
    with pytest.raises(DataError, match=r"interactions.jsonl:3: label"):
        load_dataset(small_dir)


def test_write_replaces_a_dataset_but_not_other_directories(tmp_path, small_dir):
    tiny = Dataset(interactions=[])
    write_dataset(tiny, small_dir)
    assert load_dataset(small_dir).members == {}
    assert load_manifest(small_dir) is None
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="not a dataset directory"):
        write_dataset(tiny, other)
    assert (other / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "notes"]


def test_interaction_is_plain_data():
    row = Interaction("m-1", "job-1", 1, 5)
    assert (row.member_id, row.item_id, row.label, row.timestamp) == ("m-1", "job-1", 1, 5)


# -- commands -----------------------------------------------------------------------------------------
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="slimserve")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_synth_and_check_commands(tmp_path, capsys):
    out = tmp_path / "ds"
    args = _parse(["data", "synth", "--out", str(out), "--members", "100", "--items", "80", "--seed", "2"])
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert "100 members, 80 items, 800 interactions" in printed
    assert "test" in printed and "bayes AUC" in printed
    assert load_manifest(out)["config"]["seed"] == 2
    args = _parse(["data", "check", str(out)])
    assert args.handler(args) == 0
    assert "ok: 100 members" in capsys.readouterr().out


def test_check_command_raises_a_user_error_for_a_bad_file(small_dir):
    _edit(small_dir / "interactions.jsonl", 17, label=2)
    args = _parse(["data", "check", str(small_dir)])
    with pytest.raises(UserError, match=r"interactions.jsonl:17: label: expected 0 or 1, got 2"):
        args.handler(args)


# -- renamed skills (generator distillation prompts) ---------------------------------------------------
def test_renamed_skills_keep_the_pair_s_facts_with_unseen_names(default_synth):
    import random

    from slimserve.data.renaming import RENAMING_SKILLS, renamed_skills, with_renamed_share
    from slimserve.pair_facts import verdict_for

    dataset, _ = default_synth
    examples = split_dataset(dataset, seed=0, pool_factor=0).train[:200]
    rng = random.Random(3)
    for example in examples:
        renamed = renamed_skills(example, rng)
        member, item = renamed.member, renamed.item
        assert set(member.skills) | set(item.required_skills) <= set(RENAMING_SKILLS)
        shared = set(member.skills) & set(item.required_skills)
        assert len(shared) == len(set(example.member.skills) & set(example.item.required_skills))
        assert verdict_for(member, item) == verdict_for(example.member, example.item)
        assert (member.id, item.id, renamed.label) == (example.member.id, example.item.id, example.label)
    assert with_renamed_share(examples, 0.0, seed=1) == examples
    assert with_renamed_share(examples, 0.5, seed=1) == with_renamed_share(examples, 0.5, seed=1)
    changed = sum(a != b for a, b in zip(with_renamed_share(examples, 0.5, seed=1), examples, strict=True))
    assert 70 < changed < 130


def test_invented_names_are_new_per_pair_and_keep_the_facts(default_synth):
    """Invented names: in no list, distinct within a pair, different across pairs, seeded; the pair's
    facts survive; ``invented_share`` 0 renames exactly as before."""
    from slimserve.data.renaming import HELD_OUT_SKILLS, RENAMING_SKILLS, with_renamed_share
    from slimserve.pair_facts import verdict_for

    dataset, _ = default_synth
    examples = split_dataset(dataset, seed=0, pool_factor=0).train[:120]
    renamed = with_renamed_share(examples, 1.0, seed=4, invented_share=1.0)
    assert renamed == with_renamed_share(examples, 1.0, seed=4, invented_share=1.0)
    known = set(RENAMING_SKILLS) | set(HELD_OUT_SKILLS) | set(vocab.SKILLS)
    names_per_pair = []
    for before, after in zip(examples, renamed, strict=True):
        old = set(before.member.skills) | set(before.item.required_skills)
        names = set(after.member.skills) | set(after.item.required_skills)
        assert len(names) == len(old) and not names & known  # every name invented, distinct
        assert verdict_for(after.member, after.item) == verdict_for(before.member, before.item)
        names_per_pair.append(names)
    every = set().union(*names_per_pair)
    assert len(every) > 0.9 * sum(map(len, names_per_pair))  # fresh names, not a small recalled set
    assert with_renamed_share(examples, 0.5, seed=1, invented_share=0.0) == with_renamed_share(
        examples, 0.5, seed=1
    )
    mixed = with_renamed_share(examples, 1.0, seed=1, invented_share=0.5)
    listed = sum(bool(e.member.skills) and set(e.member.skills) <= set(RENAMING_SKILLS) for e in mixed)
    assert 30 < listed < 90


def test_renaming_list_leaves_out_the_dataset_and_the_demo_skills():
    from slimserve.data.renaming import RENAMING_SKILLS
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates

    demo = set(EXAMPLE_MEMBER.skills) | {s for item in example_candidates() for s in item.required_skills}
    assert len(set(RENAMING_SKILLS)) == len(RENAMING_SKILLS) > 100
    assert not set(RENAMING_SKILLS) & (set(vocab.SKILLS) | demo)


def test_held_out_skills_are_in_no_training_prompt_and_hold_the_demo_s():
    from slimserve.data.renaming import HELD_OUT_SKILLS, RENAMING_SKILLS
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates

    demo = set(EXAMPLE_MEMBER.skills) | {s for item in example_candidates() for s in item.required_skills}
    assert len(set(HELD_OUT_SKILLS)) == len(HELD_OUT_SKILLS) > 50
    assert not set(HELD_OUT_SKILLS) & (set(vocab.SKILLS) | set(RENAMING_SKILLS))
    assert demo - set(vocab.SKILLS) <= set(HELD_OUT_SKILLS)


def test_full_matches_get_renamed_copies_listed_then_invented(default_synth):
    """``teacher_text.full_match_copies``: the full matches of the train prompts, copied with renamed
    skills (the renaming list's, then invented ones), still full matches with the same verdict."""
    from slimserve.buildstage.generator_stages import full_matches
    from slimserve.data.renaming import RENAMING_SKILLS, renamed_copies
    from slimserve.pair_facts import pair_facts, verdict_for

    dataset, _ = default_synth
    examples = split_dataset(dataset, seed=0, pool_factor=0).train[:400]
    full = full_matches(examples)
    assert full and all(set(e.item.required_skills) <= set(e.member.skills) for e in full)
    assert len(full) < len(examples)
    copies = renamed_copies(full, 2, seed=5)
    assert len(copies) == 2 * len(full) and copies == renamed_copies(full, 2, seed=5)
    assert renamed_copies(full, 0, seed=5) == []
    for index, (copy, original) in enumerate(zip(copies, full + full, strict=True)):
        facts = pair_facts(copy.member, copy.item)
        assert facts.shared_skills and not facts.missing_skills
        assert verdict_for(copy.member, copy.item) == verdict_for(original.member, original.item)
        listed = set(copy.item.required_skills) <= set(RENAMING_SKILLS)
        assert listed == (index < len(full))  # listed names first, then invented ones
        assert not set(copy.item.required_skills) & set(original.item.required_skills)


def test_varied_titles_keep_the_pair_s_facts_with_longer_titles(default_synth):
    """``teacher_text.varied_title_share``: history titles get a level and/or a domain word, the same
    title the same way within a pair; the verdict, kinds, companies and industries stay; the demo's
    "Python" and the dataset's vocabulary are in neither word list."""
    from slimserve.data.renaming import HELD_OUT_TITLE_WORDS, TITLE_WORDS, varied_titles, with_varied_titles
    from slimserve.evaluation.grounding import mentions
    from slimserve.pair_facts import pair_facts, verdict_for

    dataset, _ = default_synth
    examples = [e for e in split_dataset(dataset, seed=0, pool_factor=0).train[:200] if e.member.history]
    assert (
        not set(TITLE_WORDS) & set(HELD_OUT_TITLE_WORDS)
        and "Python" not in TITLE_WORDS + HELD_OUT_TITLE_WORDS
    )
    assert not [w for w in TITLE_WORDS + HELD_OUT_TITLE_WORDS if mentions(w.lower())]
    rng = random.Random(2)
    for example in examples:
        varied = varied_titles(example, rng, HELD_OUT_TITLE_WORDS)
        before, after = example.member.history, varied.member.history
        assert [(a.kind, a.company, a.industry) for a in after] == [
            (a.kind, a.company, a.industry) for a in before
        ]
        for old, new in zip(before, after, strict=True):
            assert new.item_title.endswith(" " + old.item_title) and len(new.item_title.split()) > len(
                old.item_title.split()
            )
        mapping = {old.item_title: new.item_title for old, new in zip(before, after, strict=True)}
        assert len(mapping) == len({a.item_title for a in before})  # one new title per old one
        assert verdict_for(varied.member, varied.item) == verdict_for(example.member, example.item)
        assert (
            pair_facts(varied.member, varied.item).activity_relation
            == pair_facts(example.member, example.item).activity_relation
        )
    assert with_varied_titles(examples, 0.0, seed=1) == examples
    half = with_varied_titles(examples, 0.5, seed=1)
    assert half == with_varied_titles(examples, 0.5, seed=1)
    assert (
        0.3 * len(examples) < sum(a != b for a, b in zip(half, examples, strict=True)) < 0.7 * len(examples)
    )


def test_sample_jobs_whose_title_names_a_level_have_that_level():
    from slimserve.examples import example_candidates

    titled = {"Senior": Seniority.SENIOR, "Staff": Seniority.LEAD}
    jobs = example_candidates(30)
    for job in jobs:
        word = job.title.split()[0]
        if word in titled:
            assert job.seniority is titled[word], (job.title, job.seniority)
    assert len({job.seniority for job in jobs}) == 4  # the other titles keep varied levels
