"""``slimserve build`` on the tiny recipe: every stage, resume, gates, and the published INT8 student served."""

from __future__ import annotations

import json

import grpc
import pytest

from slimserve.buildstage.recipe import load_recipe
from slimserve.buildstage.runner import STAGES, run_build
from slimserve.bundle import bundle_dir_for, load_bundle
from slimserve.errors import BuildError
from slimserve.export.repository import list_versions

EXPECTED_STAGES = [
    "teacher",
    "teacher fine-tuned",
    "student distilled",
    "pruned (osscar)",
    "pruned (magnitude+refit)",
    "pruned (magnitude)",
    "pruned + re-distilled",
]


def tiny_recipe(tmp_path, **updates):
    recipe = load_recipe("tiny")
    publish = recipe.publish.model_copy(update={"model_repository": tmp_path / "repo"})
    return recipe.model_copy(update={"work_dir": tmp_path / "work", "publish": publish, **updates})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("build")
    recipe = tiny_recipe(tmp)
    return recipe, run_build(recipe)


def test_every_stage_runs_and_the_int8_student_is_published(built):
    recipe, result = built
    stages = [row.stage for row in result.rows]
    # the single-sequence INT8 graph (report-only, stage int8_single), then the published multi-item one
    assert stages[:-2] == EXPECTED_STAGES and stages[-2].startswith("INT8 (")
    assert stages[-1] == stages[-2].replace("INT8 (", "INT8 multi-item (")
    for row in result.rows:
        assert 0.0 <= row.test_auc <= 1.0 and row.log_loss > 0
    for int8 in result.rows[-2:]:
        assert int8.items_per_s_batch32 > 0 and int8.file_mb > 0
    single, multi = result.rows[-2:]
    assert multi.notes["spearman_vs_student"] > 0.9 and multi.notes["auc_gap_vs_student"] < 0.05  # gated
    assert (
        single.notes["spearman_vs_multi_item_int8"] > 0.9
        and single.notes["auc_gap_vs_multi_item_int8"] < 0.05
    )
    assert result.rows[1].items_per_s_batch32 > 0 and result.rows[1].file_mb > 0  # stage speed
    assert result.rows[-3].items_per_s_batch32 > 0 and result.rows[-3].file_mb > 0  # the FP32 student
    student = result.rows[-3]
    assert 0 < student.non_embedding_parameters < result.rows[1].non_embedding_parameters
    assert result.bayes_optimal_auc is not None and 0.5 < result.bayes_optimal_auc < 1.0

    work = recipe.resolved_work_dir()
    for stage in STAGES[1:-1]:
        assert (work / stage / "config.json").is_file() and (work / stage / "done.json").is_file()
    report = json.loads((work / "report.json").read_text())
    assert [s["stage"] for s in report["stages"]] == stages
    bundle = load_bundle(bundle_dir_for(recipe.publish.model_repository, "scorer"))
    assert bundle.model_version == result.published.version == 1
    assert bundle.multi_item and bundle.prompt_template_version == "scoring-v5"
    card = (result.published.path / "MODEL_CARD.md").read_text()
    assert "| pruned + re-distilled |" in card and "slimserve build" in card


def test_a_generator_setting_changed_keeps_the_published_scorer(built):
    from slimserve.buildstage.runner import published_entry

    recipe, result = built
    assert published_entry(recipe, "scorer")["version"] == result.published.version
    gates = recipe.generator.gates.model_copy(update={"max_kl_increase": 0.5})
    generator = recipe.generator.model_copy(update={"gates": gates})
    changed = recipe.model_copy(update={"generator": generator})
    assert published_entry(changed, "scorer") == published_entry(recipe, "scorer")  # no new scorer
    assert published_entry(changed, "generator") is None  # the generator is rebuilt and published
    student = recipe.student.model_copy(update={"layers": recipe.student.layers + 1})
    assert published_entry(recipe.model_copy(update={"student": student}), "scorer") is None


def test_rerun_skips_finished_stages_and_interrupted_build_resumes(built, caplog):
    recipe, first = built
    work = recipe.resolved_work_dir()
    (work / "redistill" / "done.json").unlink()  # as if the build died during re-distillation
    for stage in ("prune_baselines", "speed"):  # the stages only the report reads
        (work / stage / "done.json").unlink()
    (work / "int8_single" / "done.json").unlink()
    report_only_done_at_publish = []  # slimserve up serves the scorer before the report-only stages

    def on_scorer_published(result):
        done = [(work / s / "done.json").exists() for s in ("prune_baselines", "int8_single", "speed")]
        report_only_done_at_publish.append(done)
        assert [r.stage for r in result.rows if r.notes.get("baseline")] == []

    with caplog.at_level("INFO"):
        again = run_build(recipe, on_scorer_published=on_scorer_published)
    assert report_only_done_at_publish == [[False, False, False]] and again.rows[1].items_per_s_batch32 > 0
    assert again.rows[-2].stage.startswith("INT8 (") and again.rows[-2].items_per_s_batch32 > 0
    report = json.loads((work / "report.json").read_text())  # rewritten with the speeds and baselines
    assert report["stages"][1]["items_per_s_batch32"] > 0
    assert [s["stage"] for s in report["stages"]] == [r.stage for r in first.rows]
    skipped = {r.getMessage().split()[1].rstrip(":") for r in caplog.records if "skipped" in r.getMessage()}
    assert {"teacher", "distill", "prune"} <= skipped
    assert set(again.seconds) >= {"redistill", "int8"} and "teacher" not in again.seconds
    assert [r.stage for r in again.rows] == [r.stage for r in first.rows]
    assert again.rows[2].test_auc == pytest.approx(first.rows[2].test_auc)
    assert again.published.version == 2


def test_a_rerun_of_only_the_report_stages_publishes_nothing_new(built):
    recipe, _ = built
    work, repository = recipe.resolved_work_dir(), recipe.publish.model_repository
    before = list_versions(repository, "scorer")
    for stage in ("prune_baselines", "int8_single", "speed"):
        (work / stage / "done.json").unlink()
    again = run_build(recipe)
    assert set(again.seconds) - {"data"} == {"prune_baselines", "int8_single", "speed"}
    assert list_versions(repository, "scorer") == before


def test_gate_above_what_was_reached_fails_and_publishes_nothing(built, tmp_path):
    recipe, _ = built
    gates = recipe.gates.model_copy(update={"distilled": 1.5})
    publish = recipe.publish.model_copy(update={"model_repository": tmp_path / "other_repo"})
    strict = recipe.model_copy(update={"gates": gates, "publish": publish})
    with pytest.raises(
        BuildError, match=r"quality gate failed at stage 'student distilled'.*nothing was published"
    ):
        run_build(strict)
    assert not (tmp_path / "other_repo").exists() or list_versions(tmp_path / "other_repo", "scorer") == []


def test_a_published_graph_that_ranks_unlike_the_student_fails_its_gate(built, tmp_path):
    import shutil

    import numpy as np

    recipe, _ = built
    work = tmp_path / "work"
    shutil.copytree(recipe.resolved_work_dir(), work)
    (work / "int8" / "done.json").unlink()
    logits = np.load(work / "redistill" / "logits_test.npy")
    np.save(work / "redistill" / "logits_test.npy", logits[:, ::-1])  # the student's scores negated
    gates = recipe.gates.model_copy(update={"multi_item_spearman": 0.5})
    publish = recipe.publish.model_copy(update={"model_repository": tmp_path / "other_repo"})
    strict = recipe.model_copy(update={"gates": gates, "publish": publish, "work_dir": work})
    with pytest.raises(BuildError, match=r"multi-item INT8 graph against the re-distilled student.*spearman"):
        run_build(strict)
    assert not (tmp_path / "other_repo").exists() or list_versions(tmp_path / "other_repo", "scorer") == []


async def test_the_published_student_is_served(built):
    from slimserve.client import build_request
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.serving.scoring.server import ScoringServer
    from slimserve.v1 import scoring_pb2_grpc
    from tests.conftest import start_triton
    from tests.test_e2e_scoring import service_config

    recipe, _ = built
    repository = recipe.publish.model_repository
    triton = start_triton(repository)
    server = ScoringServer(service_config(repository, triton.grpc_url))
    try:
        await server.start()
        assert await server.core.watcher.wait_until_ready(timeout=30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scoring_pb2_grpc.ScoringServiceStub(channel)
            response = await stub.Score(build_request(EXAMPLE_MEMBER, example_candidates(5)), timeout=30)
        assert len(response.items) == 5
        assert "student" in load_bundle(bundle_dir_for(repository, "scorer")).source_model
    finally:
        await server.stop(grace=1)
        triton.stop()


def test_stage_line_names_the_model_the_stage_carries_on():
    from slimserve.buildstage.scorer_stages import quality as _quality
    from slimserve.evaluation.report import StageRow

    osscar = StageRow("pruned (osscar)", 0.79, 0.8, 0.5, retention=0.98)
    baselines = [StageRow(f"pruned ({m})", 0.5, 0.6, 0.9, notes={"baseline": True}) for m in ("a", "b")]
    assert _quality([osscar, *baselines]) == ": pruned (osscar), test AUC 0.790, retention 0.980"
    assert _quality(baselines).startswith(": pruned (b)")  # only baselines: the last one
    assert _quality([]) == ""


def test_the_onnx_exporter_is_part_of_the_exporting_stages_ids_only(tmp_path):
    from slimserve.buildstage.context import stage_config

    recipe = tiny_recipe(tmp_path)
    dynamo = recipe.model_copy(
        update={"publish": recipe.publish.model_copy(update={"onnx_exporter": "dynamo"})}
    )
    assert stage_config(recipe, "int8")["onnx_exporter"] == "torchscript"
    for stage in ("redistill", "prune_baselines"):
        assert stage_config(recipe, stage) == stage_config(dynamo, stage)
    for stage in ("int8", "speed", "tensorrt"):
        assert stage_config(recipe, stage) != stage_config(dynamo, stage)
