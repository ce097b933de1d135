"""Service config: precedence defaults < file < env < flags, unknown keys rejected, flags from fields."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from slimserve.serving.config import ConfigError, add_config_flags, config_from_args, load_config
from slimserve.serving.scoring.config import ScoringServiceConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, ScoringServiceConfig)
    return parser.parse_args(list(argv))


def test_defaults():
    config = load_config(ScoringServiceConfig, environ={})
    assert config == ScoringServiceConfig()
    assert (config.port, config.metrics_port, config.max_candidates, config.triton_chunk_size) == (
        50051,
        9090,
        500,
        8,
    )
    assert config.model_version is None and config.bundle_dir is None


def test_every_field_has_default_and_description():
    for name, info in ScoringServiceConfig.model_fields.items():
        assert not info.is_required(), name
        assert info.description, name


def test_precedence_defaults_file_env_flags(tmp_path: Path):
    file = tmp_path / "scoring.yaml"
    file.write_text("port: 1111\nmax_candidates: 10\nmodel_name: from-file\ntriton_url: file:8001\n")
    env = {"SLIMSERVE_SCORING_PORT": "2222", "SLIMSERVE_SCORING_MAX_CANDIDATES": "20"}
    args = parse("--port", "3333")
    config = config_from_args(ScoringServiceConfig, args, file=file, environ=env)
    assert config.port == 3333  # flag beats env
    assert config.max_candidates == 20  # env beats file
    assert config.model_name == "from-file"  # file beats default
    assert config.metrics_port == 9090  # default


def test_json_file_and_types(tmp_path: Path):
    file = tmp_path / "scoring.json"
    file.write_text(json.dumps({"bundle_dir": "some/bundle", "default_timeout_s": 2.5, "log_level": "debug"}))
    config = load_config(ScoringServiceConfig, file, environ={})
    assert config.bundle_dir == Path("some/bundle")
    assert config.default_timeout_s == 2.5
    assert config.log_level == "DEBUG"


def test_unknown_key_in_file_is_named(tmp_path: Path):
    file = tmp_path / "scoring.yaml"
    file.write_text("port: 1\nmax_candidate: 3\n")
    with pytest.raises(ConfigError, match="'max_candidate'") as info:
        load_config(ScoringServiceConfig, file, environ={})
    assert str(file) in str(info.value)


def test_unknown_override_key_is_named():
    with pytest.raises(ConfigError, match="'bogus'"):
        load_config(ScoringServiceConfig, environ={}, overrides={"bogus": 1})


def test_invalid_value_names_key_and_source():
    with pytest.raises(ConfigError) as info:
        load_config(ScoringServiceConfig, environ={"SLIMSERVE_SCORING_PORT": "tcp://10.0.0.1:50051"})
    text = str(info.value)
    assert "port" in text and "environment" in text and "enableServiceLinks" in text


def test_env_none_words_for_optional_fields():
    env = {"SLIMSERVE_SCORING_MODEL_VERSION": "3", "SLIMSERVE_SCORING_MAX_CONCURRENT_RPCS": "none"}
    config = load_config(ScoringServiceConfig, environ=env)
    assert config.model_version == 3 and config.max_concurrent_rpcs is None


def test_nothing_read_at_import_or_from_unrelated_env(monkeypatch):
    monkeypatch.setenv("SLIMSERVE_SCORING_PORT", "4444")
    monkeypatch.setenv("SLIMSERVE_REASONING_PORT", "5555")
    assert load_config(ScoringServiceConfig).port == 4444
    assert ScoringServiceConfig().port == 50051  # the model itself never reads the environment


def test_flags_derived_from_fields():
    parser = argparse.ArgumentParser()
    add_config_flags(parser, ScoringServiceConfig)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for name, info in ScoringServiceConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in flags
        action = next(a for a in parser._actions if flag in a.option_strings)
        assert info.description in action.help


def test_absent_flags_do_not_override():
    args = parse("--model-version", "7", "--log-level", "WARNING")
    env = {"SLIMSERVE_SCORING_HOST": "0.0.0.0"}
    config = config_from_args(ScoringServiceConfig, args, environ=env)
    assert config.host == "0.0.0.0" and config.model_version == 7 and config.log_level == "WARNING"


def test_bad_flag_value_is_a_config_error():
    with pytest.raises(ConfigError, match="max_candidates"):
        config_from_args(ScoringServiceConfig, parse("--max-candidates", "lots"), environ={})


def test_generic_over_any_pydantic_model():
    from pydantic import BaseModel, ConfigDict, Field

    class Recipe(BaseModel):  # no env_prefix: flags and file only
        model_config = ConfigDict(extra="forbid")
        buckets: tuple[int, ...] = Field((64, 128), description="Length buckets.")
        verbose: bool = Field(False, description="Talk more.")

    parser = argparse.ArgumentParser()
    add_config_flags(parser, Recipe)
    args = parser.parse_args(["--buckets", "[32, 64]", "--verbose"])
    config = config_from_args(Recipe, args, environ={"SLIMSERVE_BUCKETS": "[1]"})
    assert config == Recipe(buckets=(32, 64), verbose=True)
