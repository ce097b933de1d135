"""The benchmark workload: real scoring requests from a dataset, tokenized with the served bundle.

Every benchmark of one run uses the same workload, so the in-process engines, perf_analyzer and the gRPC
load generator score the same prompts. A request (``ScoreCall``) is one member with ``candidates``
items: the member's own impressions first, then other items of the split. Without a dataset a small
synthetic one is generated in memory (the generator of ``slimserve data synth``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..bundle import TOKENIZER_FILE, load_bundle
from ..models.batching import bucket_batches
from ..schema import Item, Member
from ..scoring_tokens import ScoringTokens, encode_scoring
from ..tokenization import PromptTokenizer


@dataclass(frozen=True)
class ScoreCall:
    """One Score request: a member and its candidates."""

    member: Member
    items: tuple[Item, ...]


@dataclass
class Workload:
    """Requests and the token sequences of all their (member, item) prompts, in request order."""

    calls: list[ScoreCall]
    sequences: list[list[int]]
    buckets: tuple[int, ...]
    source: str
    tokens: list[ScoringTokens] = field(default_factory=list)  # per call: prefix and item suffixes

    @property
    def items(self) -> int:
        return len(self.sequences)

    def by_bucket(self) -> dict[int, list[list[int]]]:
        """Sequences grouped by the length bucket they pad to (the service's batching, whole buckets)."""
        return {
            bucket: [self.sequences[i] for i in indices]
            for bucket, indices in bucket_batches(self.sequences, self.buckets)
        }

    def describe(self) -> str:
        if not self.sequences:
            return f"{len(self.calls)} requests from {self.source} (not tokenized for scoring)"
        sizes = ", ".join(f"{b}: {len(s)}" for b, s in self.by_bucket().items())
        return (
            f"{len(self.calls)} requests x {len(self.calls[0].items)} candidates from {self.source} "
            f"(prompts per length bucket {sizes})"
        )


def _examples(dataset_dir: Path | None, split: str, seed: int) -> tuple[list, str]:
    from ..data.splits import split_dataset

    if dataset_dir is not None:
        from ..data.records import load_dataset

        dataset, source = load_dataset(dataset_dir), f"dataset {dataset_dir} ({split} split)"
    else:
        from ..data.synth import SynthConfig, synthesize

        dataset, _ = synthesize(SynthConfig(seed=seed, members=80, items=60))
        source = f"a synthetic dataset (seed {seed}, {split} split)"
    examples = split_dataset(dataset, seed=seed).by_name(split)
    if not examples:
        raise ValueError(f"the {split} split of {source} is empty")
    return examples, source


def build_calls(examples: list, requests: int, candidates: int) -> list[ScoreCall]:
    """``requests`` calls of ``candidates`` items: each member's impressions, topped up from the split."""
    if requests < 1 or candidates < 1:
        raise ValueError("requests and candidates must be at least 1")
    by_member: dict[str, list] = defaultdict(list)
    for example in examples:
        by_member[example.member_id].append(example)
    distinct = list({e.item.id: e.item for e in examples}.values())
    if len(distinct) < candidates:
        raise ValueError(f"the split has {len(distinct)} distinct items, fewer than {candidates} candidates")
    calls, filler = [], 0
    members = list(by_member.values())
    while len(calls) < requests:
        group = members[len(calls) % len(members)]
        items = list({e.item.id: e.item for e in group}.values())[:candidates]
        taken = {item.id for item in items}
        while len(items) < candidates:  # distinct ids: the service refuses duplicates
            item = distinct[filler % len(distinct)]
            filler += 1
            if item.id not in taken:
                items.append(item)
                taken.add(item.id)
        calls.append(ScoreCall(group[0].member, tuple(items)))
    return calls


def load_calls(
    dataset_dir: Path | None = None,
    *,
    requests: int = 64,
    candidates: int = 8,
    split: str = "test",
    seed: int = 0,
) -> tuple[list[ScoreCall], str]:
    """Requests (member and candidates) from a dataset split, and a description of where they came from."""
    examples, source = _examples(dataset_dir, split, seed)
    return build_calls(examples, requests, candidates), source


def load_workload(
    bundle_dir: Path,
    dataset_dir: Path | None = None,
    *,
    requests: int = 64,
    candidates: int = 8,
    split: str = "test",
    seed: int = 0,
) -> Workload:
    """Real scoring requests tokenized as the bundle's template says (its tokenizer, split and buckets);
    ``sequences`` are every candidate's single-sequence input, ``tokens`` each call's prefix and items."""
    bundle = load_bundle(Path(bundle_dir))
    tokenizer = PromptTokenizer(Path(bundle_dir) / TOKENIZER_FILE, bundle.max_length)
    calls, source = load_calls(dataset_dir, requests=requests, candidates=candidates, split=split, seed=seed)
    tokens = [
        encode_scoring(
            tokenizer, call.member, call.items, bundle.prompt_split, bundle.prompt_template_version
        )
        for call in calls
    ]
    sequences = [seq for call in tokens for seq in call.sequences()]
    return Workload(calls, sequences, tuple(sorted(bundle.length_buckets)), source, tokens)
