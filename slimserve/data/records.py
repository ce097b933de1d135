"""The dataset on disk: three JSONL files (members, items, interactions), loaded strictly or written atomically.

Every malformed row is reported as ``file:line: field: problem`` so it can be fixed by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..schema import Item, Member, SchemaError, item_from_dict, member_from_dict

MEMBERS_FILE, ITEMS_FILE, INTERACTIONS_FILE = "members.jsonl", "items.jsonl", "interactions.jsonl"
MANIFEST_FILE = "manifest.json"
DATA_FILES = (MEMBERS_FILE, ITEMS_FILE, INTERACTIONS_FILE)
_INTERACTION_FIELDS = ("member_id", "item_id", "label", "timestamp")


class DataError(UserError):
    """A dataset file is missing or holds a malformed row (the message names file, line and field)."""


@dataclass(frozen=True)
class Interaction:
    """One impression of an item to a member: label 1 = applied/engaged, 0 = dismissed."""

    member_id: str
    item_id: str
    label: int
    timestamp: int


@dataclass
class Dataset:
    """Members and items by id, and the interactions between them."""

    members: dict[str, Member] = field(default_factory=dict)
    items: dict[str, Item] = field(default_factory=dict)
    interactions: list[Interaction] = field(default_factory=list)


def _rows(path: Path):
    """(line number, parsed object) per non-blank line of a JSONL file."""
    if not path.is_file():
        raise DataError(f"{path}: missing (a dataset directory holds {', '.join(DATA_FILES)})")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path.name}:{number}: not valid JSON: {exc}") from None


def _load_records(path: Path, parse) -> dict[str, Any]:
    records: dict[str, Any] = {}
    first_line: dict[str, int] = {}
    for number, data in _rows(path):
        try:
            record = parse(data)
        except SchemaError as exc:
            raise DataError(f"{path.name}:{number}: {exc}") from None
        if record.id in records:
            raise DataError(
                f"{path.name}:{number}: id: duplicate {record.id!r} (first on line {first_line[record.id]})"
            )
        records[record.id] = record
        first_line[record.id] = number
    return records


def interaction_from_dict(data: object, members=None, items=None) -> Interaction:
    """An ``Interaction`` from a JSON object; ids checked against ``members``/``items`` when given."""
    if not isinstance(data, dict):
        raise SchemaError(f"expected an object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_INTERACTION_FIELDS))
    if unknown:
        raise SchemaError(f"{unknown[0]}: unknown field (known: {', '.join(_INTERACTION_FIELDS)})")
    for name, known in (("member_id", members), ("item_id", items)):
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise SchemaError(f"{name}: required (a non-empty string), got {value!r}")
        if known is not None and value not in known:
            raise SchemaError(f"{name}: unknown {name[:-3]} {value!r}")
    label = data.get("label")
    if isinstance(label, bool) or label not in (0, 1) or not isinstance(label, int):
        raise SchemaError(f"label: expected 0 or 1, got {label!r}")
    timestamp = data.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise SchemaError(f"timestamp: expected whole seconds (an integer >= 0), got {timestamp!r}")
    return Interaction(data["member_id"], data["item_id"], label, timestamp)


def load_dataset(directory: Path | str) -> Dataset:
    """Read and validate a dataset directory; ``DataError`` names the first bad file, line and field."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: not a dataset directory (expected {', '.join(DATA_FILES)})")
    members = _load_records(directory / MEMBERS_FILE, member_from_dict)
    items = _load_records(directory / ITEMS_FILE, item_from_dict)
    interactions = []
    for number, data in _rows(directory / INTERACTIONS_FILE):
        try:
            interactions.append(interaction_from_dict(data, members, items))
        except SchemaError as exc:
            raise DataError(f"{INTERACTIONS_FILE}:{number}: {exc}") from None
    return Dataset(members, items, interactions)


def load_manifest(directory: Path | str) -> dict[str, Any] | None:
    """The generator's ``manifest.json`` of a dataset directory (None when there is none)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable manifest: {exc}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def record_to_dict(record: Member | Item | Interaction) -> dict[str, Any]:
    """A JSON-ready dict of a member, item or interaction (enums by name, tuples as lists)."""
    return _plain(asdict(record))


def _write_jsonl(path: Path, records) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record_to_dict(record), ensure_ascii=False, separators=(",", ":")) + "\n")


def write_dataset(dataset: Dataset, directory: Path | str, manifest: dict[str, Any] | None = None) -> Path:
    """Write the dataset (and manifest) into ``directory`` atomically: a temp dir, then one rename."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise DataError(f"{directory}: exists and is not a directory")
    if directory.exists() and any(directory.iterdir()) and not (directory / MEMBERS_FILE).is_file():
        raise DataError(f"{directory}: exists and is not a dataset directory; refusing to replace it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        _write_jsonl(staging / MEMBERS_FILE, dataset.members.values())
        _write_jsonl(staging / ITEMS_FILE, dataset.items.values())
        _write_jsonl(staging / INTERACTIONS_FILE, dataset.interactions)
        if manifest is not None:
            text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
            (staging / MANIFEST_FILE).write_text(text, encoding="utf-8")
        os.chmod(staging, 0o755)
        if directory.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.replace(directory, retired / "dataset")
            os.replace(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return directory
