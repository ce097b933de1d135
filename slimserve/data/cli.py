"""The ``slimserve data`` commands: ``synth`` writes a synthetic dataset, ``check`` validates one.

Handlers return exit codes; a malformed file raises ``DataError`` (a ``UserError``), which the
top-level CLI prints as ``file:line: field: problem`` with exit code 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

EXIT_OK = 0


def add_data_commands(subparsers) -> None:
    """Add ``data synth`` and ``data check`` under the top-level subparsers."""
    from ..settings import add_config_arguments
    from .synth import SynthConfig

    parser = subparsers.add_parser("data", help="synthesize or check a JSONL dataset")
    commands = parser.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    synth = commands.add_parser("synth", help="write a reproducible synthetic dataset")
    synth.add_argument("--out", type=Path, required=True, help="dataset directory to write (replaced)")
    add_config_arguments(synth, SynthConfig)
    synth.set_defaults(handler=run_synth)
    check = commands.add_parser("check", help="validate a dataset directory and print its splits")
    check.add_argument("directory", type=Path, help="dataset directory (members/items/interactions.jsonl)")
    check.add_argument("--seed", type=int, help="split seed [default: the manifest's, else 0]")
    check.set_defaults(handler=run_check)


def run_synth(args: argparse.Namespace) -> int:
    """``slimserve data synth``: write the dataset, print counts, positive rates and Bayes-optimal AUC."""
    from ..settings import config_from_args
    from .synth import SynthConfig, write_synthetic

    config = config_from_args(SynthConfig, args, getattr(args, "config", None))
    manifest = write_synthetic(config, args.out)
    counts = manifest["counts"]
    print(
        f"wrote {args.out}: {counts['members']} members, {counts['items']} items, "
        f"{counts['interactions']} interactions (seed {manifest['seed']}, "
        f"positive rate {manifest['positive_rate']:.3f})"
    )
    _print_splits(manifest["splits"])
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    """``slimserve data check``: load strictly, then print counts per split."""
    from .records import load_dataset, load_manifest
    from .splits import DEFAULT_FRACTIONS, SPLIT_NAMES, split_dataset

    dataset = load_dataset(args.directory)
    manifest = load_manifest(args.directory) or {}
    split = manifest.get("split", {})
    seed = args.seed if args.seed is not None else split.get("seed", 0)
    fractions = tuple(split.get("fractions", DEFAULT_FRACTIONS))
    splits = split_dataset(dataset, seed, fractions, pool_factor=0)
    positives = sum(row.label for row in dataset.interactions)
    print(
        f"{args.directory}: ok: {len(dataset.members)} members, {len(dataset.items)} items, "
        f"{len(dataset.interactions)} interactions, positive rate {_ratio(positives, len(dataset.interactions))}"
    )
    same_split = seed == split.get("seed") and list(fractions) == split.get("fractions")
    rows = {}
    for name in SPLIT_NAMES:
        examples = splits.by_name(name)
        recorded = manifest.get("splits", {}).get(name, {}) if same_split else {}
        rows[name] = {
            "members": len({e.member_id for e in examples}),
            "interactions": len(examples),
            "positive_rate": sum(e.label for e in examples) / len(examples) if examples else None,
            "bayes_optimal_auc": recorded.get("bayes_optimal_auc"),
        }
    _print_splits(rows, f"split seed {seed}, fractions {list(fractions)}")
    return EXIT_OK


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.3f}" if whole else "n/a"


def _print_splits(splits: dict[str, dict[str, Any]], title: str = "") -> None:
    if title:
        print(title)
    print(f"  {'split':<11}{'members':>8}{'rows':>8}{'positive':>10}{'bayes AUC':>11}")
    for name, row in splits.items():
        rate = "n/a" if row["positive_rate"] is None else f"{row['positive_rate']:.3f}"
        bayes = "n/a" if row.get("bayes_optimal_auc") is None else f"{row['bayes_optimal_auc']:.3f}"
        print(f"  {name:<11}{row['members']:>8}{row['interactions']:>8}{rate:>10}{bayes:>11}")
