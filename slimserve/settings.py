"""Settings machinery shared by every config model: defaults < file < environment < flags.

Nothing is read at import time. ``load_config`` merges the sources; ``add_config_flags`` derives
``--field-name`` flags from a model's fields and ``config_from_args`` turns parsed flags back into a
config, so a CLI never lists the fields twice. Generic over the pydantic model class.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from .errors import UserError

_NONE_WORDS = {"", "none", "null"}
_TRUE_WORDS = {"1", "true", "yes", "on"}
_FALSE_WORDS = {"0", "false", "no", "off"}


class ConfigError(UserError, ValueError):
    """A configuration source is unreadable or holds an invalid or unknown key (named in the message)."""


class Settings(BaseModel):
    """Base of every config model: unknown keys rejected; subclasses set ``env_prefix``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    env_prefix: ClassVar[str] = "SLIMSERVE_"


C = TypeVar("C", bound=BaseModel)


def field_like(model: type[BaseModel], name: str, description: str) -> FieldInfo:
    """A field with the default and bounds of ``model``'s field ``name``, described for another command
    (one definition, so the two cannot drift)."""
    return FieldInfo.merge_field_infos(model.model_fields[name], description=description)


def _env_prefix(model_cls: type[BaseModel]) -> str | None:
    """The model's ``env_prefix`` (None: a plain pydantic model, not read from the environment)."""
    return getattr(model_cls, "env_prefix", None)


def read_config_file(path: Path | str) -> dict[str, Any]:
    """Keys of a YAML or JSON config file (a mapping at the top level)."""
    path = Path(path)
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys, got {type(data).__name__}")
    return data


def _is_optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _is_bool(annotation: Any) -> bool:
    return annotation is bool


def env_values(model_cls: type[C], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Values from ``<env_prefix><FIELD>`` variables; other variables with the prefix are ignored."""
    environ = os.environ if environ is None else environ
    prefix = _env_prefix(model_cls)
    values: dict[str, Any] = {}
    for name, info in model_cls.model_fields.items() if prefix else ():
        raw = environ.get(prefix + name.upper())
        if raw is None:
            continue
        values[name] = _coerce_text(raw, info.annotation)
    return values


def _coerce_text(raw: str, annotation: Any) -> Any:
    """Text (env or flag) to a value pydantic can validate: none words, booleans; the rest as is."""
    word = raw.strip().lower()
    if _is_optional(annotation) and word in _NONE_WORDS:
        return None
    if _is_bool(annotation):
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    return raw


def load_config(
    model_cls: type[C],
    file: Path | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> C:
    """Build a config: field defaults < ``file`` (YAML/JSON) < environment < ``overrides``."""
    sources: list[tuple[str, dict[str, Any]]] = []
    if file is not None:
        sources.append((f"config file {file}", read_config_file(file)))
    sources.append((f"environment ({_env_prefix(model_cls)}*)", env_values(model_cls, environ)))
    sources.append(("flags", dict(overrides or {})))
    merged: dict[str, Any] = {}
    for label, values in sources:
        _check_keys(model_cls, values, label)
        merged.update(values)
    try:
        return model_cls(**merged)
    except ValidationError as exc:
        raise ConfigError(_describe(model_cls, exc, sources)) from None


def _check_keys(model_cls: type[BaseModel], values: Mapping[str, Any], label: str) -> None:
    unknown = sorted(set(values) - set(model_cls.model_fields))
    if unknown:
        known = ", ".join(model_cls.model_fields)
        raise ConfigError(f"{label}: unknown key(s) {', '.join(map(repr, unknown))}; known keys: {known}")


def _describe(model_cls: type[BaseModel], exc: ValidationError, sources: list) -> str:
    lines = [f"invalid {model_cls.__name__}:"]
    for error in exc.errors():
        if not error["loc"]:  # a check across fields (a model validator): its message names them
            lines.append(f"  {error['msg']}")
            continue
        key = ".".join(str(part) for part in error["loc"])
        field = str(error["loc"][0])  # `concurrency.0`: the first level of the field `concurrency`
        origin = next((label for label, values in reversed(sources) if field in values), "default")
        lines.append(f"  {key} = {error.get('input')!r} (from {origin}): {error['msg']}")
        if str(error.get("input", "")).startswith("tcp://"):
            lines.append("    (a Kubernetes service link? set enableServiceLinks: false in the pod spec)")
    return "\n".join(lines)


def _flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, model_cls: type[BaseModel]) -> None:
    """A command's settings on its command line: ``--config FILE`` and one flag per field
    (``add_config_flags``); ``config_from_args`` reads them back."""
    parser.add_argument("--config", type=Path, help=f"YAML/JSON file with {model_cls.__name__} settings")
    add_config_flags(parser, model_cls)


def add_config_flags(parser: argparse.ArgumentParser, model_cls: type[BaseModel]) -> None:
    """Add one ``--field-name`` flag per config field (help = its description); absent flags stay unset.

    A field with ``json_schema_extra={"repeatable": True}`` (and optionally a ``metavar``) is a flag given
    once per value, collected into a list; one with ``{"comma_separated": True}`` takes its value as text
    (``1,4,16``), which the field's own validator splits."""
    group = parser.add_argument_group(f"{model_cls.__name__} (flags override file and environment)")
    for name, info in model_cls.model_fields.items():
        default = info.get_default(call_default_factory=True)
        shown = "unset" if default is None else default
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("comma_separated"):
            shown = ",".join(map(str, default)) or "none"
        prefix = _env_prefix(model_cls)
        env = f"; env {prefix}{name.upper()}" if prefix else ""
        help_text = f"{info.description} [default: {shown}{env}]".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if extra.get("repeatable"):  # a list of text values, one per use of the flag
            kwargs.update(action="append", metavar=extra.get("metavar", name.upper()))
        elif extra.get("comma_separated"):  # text the field splits (not YAML: `--models yes` stays a name)
            kwargs["metavar"] = extra.get("metavar", name.upper())
        elif _is_bool(info.annotation):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif _is_structured(info.annotation):  # lists, mappings, nested models: a YAML/JSON value
            kwargs.update(type=_yaml_value, metavar="YAML")
        else:
            choices = _literal_choices(info.annotation)
            kwargs["metavar"] = "{" + ",".join(choices) + "}" if choices else name.upper()
        group.add_argument(_flag_name(name), **kwargs)


def _is_structured(annotation: Any) -> bool:
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = [a for a in (typing.get_args(annotation) if is_union else (annotation,)) if a is not type(None)]
    return any(
        typing.get_origin(a) in (list, tuple, dict, set)
        or (isinstance(a, type) and issubclass(a, (BaseModel, list, tuple, dict, set)))
        for a in kinds
    )


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"not valid YAML/JSON: {exc}") from None


def _literal_choices(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is Literal:
        return [str(arg) for arg in typing.get_args(annotation)]
    return []


def config_from_args(
    model_cls: type[C],
    args: argparse.Namespace,
    file: Path | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> C:
    """The config from ``file``, the environment and the flags ``add_config_flags`` added to ``args``."""
    overrides: dict[str, Any] = {}
    for name, info in model_cls.model_fields.items():
        if hasattr(args, name):
            value = getattr(args, name)
            overrides[name] = _coerce_text(value, info.annotation) if isinstance(value, str) else value
    return load_config(model_cls, file, environ=environ, overrides=overrides)


__all__ = [
    "ConfigError",
    "Settings",
    "add_config_flags",
    "config_from_args",
    "env_values",
    "load_config",
    "read_config_file",
]
