"""Project-level contracts: dependency direction, recipes and service configs that load, packaging."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slimserve.export.pipeline import ScorerExportConfig
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.settings import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_serving_never_imports_torch_transformers_or_build_code():
    code = (
        "import sys, slimserve.serving.scoring.server, slimserve.serving.triton.launcher, slimserve.client,"
        " slimserve.serving.reasoning.server, slimserve.reasoning_client;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'onnx')"
        " or m.startswith('slimserve.export')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_export_never_imports_serving():
    code = (
        "import sys, slimserve.export.pipeline, slimserve.export.repository, slimserve.export.scorer_model;"
        "bad = [m for m in sys.modules if m.startswith('slimserve.serving')]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


CLIENT_MODULES = ("client", "reasoning_client", "client_convert")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` (a module of the slimserve package) imports, at the top or in a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "slimserve" if node.level == 1 else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_cli_clients_never_import_serving(module):
    """The clients build requests with ``slimserve.client_convert``; ``slimserve.serving`` is the server's."""
    bad = sorted(
        n for n in imported_modules(ROOT / "slimserve" / f"{module}.py") if n.startswith("slimserve.serving")
    )
    assert not bad, bad


def modules_loaded_by(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_client_requests_are_built_without_serving():
    loaded = modules_loaded_by(
        "import slimserve.client as c, slimserve.reasoning_client as r\n"
        "from slimserve.examples import EXAMPLE_MEMBER, example_candidates\n"
        "items = example_candidates(2)\n"
        "c.build_request(EXAMPLE_MEMBER, items, top_k=1)\n"
        "r.explain_request(EXAMPLE_MEMBER, items[0], r.build_options(stop=['x']))\n"
        "r.generate_request('hi')"
    )
    assert "slimserve.client_convert" in loaded
    assert not [m for m in loaded if m.startswith("slimserve.serving")]


@pytest.mark.parametrize("recipe", sorted((ROOT / "build" / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_recipes_load(recipe):
    from slimserve.buildstage.recipe import load_recipe

    config = load_recipe(str(recipe))
    assert config.name == recipe.stem and config.publish.model_name == "scorer"


def test_recipe_with_unknown_key_is_rejected(tmp_path):
    from slimserve.buildstage.recipe import load_recipe

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nteacher: {source: tiny, train_layers: 2}\n")
    with pytest.raises(ConfigError, match="train_layers"):
        load_recipe(str(bad))
    bad.write_text("teacher: tiny\nmax_batch: 8\n")
    with pytest.raises(ConfigError, match="max_batch"):
        load_config(ScorerExportConfig, bad, environ={})


def test_service_container_config_loads():
    config = load_config(ScoringServiceConfig, ROOT / "services" / "scoring" / "config.yaml", environ={})
    assert config.host == "0.0.0.0" and config.triton_url == "triton:8001"


def test_member_json_with_history_parses_and_names_bad_fields():
    from slimserve.schema import ActivityKind, SchemaError, member_from_dict

    member = member_from_dict(
        {"id": "m", "seniority": "senior", "history": [{"item_title": "SRE", "kind": "dismissed"}]}
    )
    assert member.history[0].kind is ActivityKind.DISMISSED
    with pytest.raises(SchemaError, match=r"member\.history\[0\]\.kind"):
        member_from_dict({"id": "m", "history": [{"item_title": "SRE", "kind": "maybe"}]})
    with pytest.raises(SchemaError, match=r"member\.history\[1\]\.item_title: required"):
        member_from_dict({"id": "m", "history": [{"item_title": "SRE"}, {"company": "x"}]})
