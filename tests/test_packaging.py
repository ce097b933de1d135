"""Packaging: the recipes ship inside the wheel and load from an installed (non-editable) copy."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(p.name for p in (ROOT / "slimserve" / "recipes").glob("*.yaml"))


def test_build_recipes_is_the_package_folder():
    assert {"tiny.yaml", "cpu.yaml", "gpu.yaml"} <= set(RECIPES)
    assert (ROOT / "build" / "recipes").resolve() == (ROOT / "slimserve" / "recipes").resolve()


def test_wheel_ships_the_recipes_and_an_installed_copy_loads_them(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", str(ROOT), "-w", str(tmp_path / "dist")], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("slimserve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(
            Path(n).name
            for n in archive.namelist()
            if n.startswith("slimserve/recipes/") and n.endswith(".yaml")
        )
    assert shipped == RECIPES

    target = tmp_path / "site"
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from slimserve.buildstage import recipe\n"
        "assert recipe.RECIPES_DIR.is_relative_to(sys.argv[1]), recipe.RECIPES_DIR\n"
        "print(recipe.load_recipe('tiny').name, recipe.load_recipe('cpu').name)\n"
    )
    # Run from an empty folder so the checkout is not on sys.path; the installed copy comes first.
    ran = subprocess.run(
        [sys.executable, "-c", code, str(target.resolve())],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["tiny", "cpu"]


def test_help_describes_the_program_in_plain_words():
    from slimserve.cli import build_parser

    text = build_parser().format_help()
    description = text.split("\n\n")[1]
    assert "``" not in text and "thin layer" not in text
    assert "Triton" in description and "gRPC" in description
