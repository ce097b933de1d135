"""scripts/uv_args.py: pip's configuration handed to uv by scripts/install.sh."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "uv_args.py"


def _uv_args():
    spec = importlib.util.spec_from_file_location("uv_args", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.uv_args


def test_pip_settings_become_uv_options_once_and_missing_local_indexes_are_left_out(tmp_path):
    uv_args = _uv_args()
    wheels, constraints = tmp_path / "wheels", tmp_path / "constraints.txt"
    wheels.mkdir()
    constraints.write_text("torch<=2.14.1\n")
    lines = [
        f"global.constraint='{constraints}'",
        f"global.extra-index-url='file://{tmp_path}/missing/simple https://mirror.example/simple'",
        f"global.find-links='{wheels}'",
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        ":env:.default-timeout='180'",
        f":env:.find-links='{wheels}'",  # the same setting from the environment: passed once
        "user.index-url='https://pypi.example/simple'",
    ]
    assert uv_args(lines) == [
        "--constraint",
        str(constraints),
        "--extra-index-url",
        "https://mirror.example/simple",
        "--find-links",
        str(wheels),
        "--index-url",
        "https://pypi.example/simple",
    ]


def test_no_index_and_an_empty_configuration():
    uv_args = _uv_args()
    assert uv_args([]) == []
    assert uv_args(["global.no-index='true'"]) == ["--no-index"]
    assert uv_args(["global.no-index='false'"]) == []
