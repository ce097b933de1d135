"""Shared by the TensorRT tests: real prompts of varied lengths and the tiny scorer's FP32 ONNX graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.export.onnx_export import export_scorer_onnx
from slimserve.models.scorer_graph import ScorerGraph
from slimserve.prompts import render_scoring_prompt
from slimserve.tokenization import PromptTokenizer, pad_batch

BUCKETS = (64, 128, 192)
GROUP_SIZE = 8  # candidates per (pseudo) member for the ranking checks


def varied_prompts(tokenizer_file: Path, count: int, seed: int = 1) -> list[list[int]]:
    """Real scoring prompts cut to prefixes of random length in every bucket.

    Whole prompts all end in the same answer cue, and a random tiny model scores them almost alike (std
    about 0.01, below INT8 noise); prefixes end in different tokens, so their scores spread out and a
    ranking check means something.
    """
    prompts = [render_scoring_prompt(EXAMPLE_MEMBER, item) for item in example_candidates(count, seed=seed)]
    tokenizer = PromptTokenizer(tokenizer_file, max_length=max(BUCKETS))
    rng = np.random.default_rng(seed)
    return [ids[: int(rng.integers(8, len(ids) + 1))] for ids in tokenizer.encode(prompts)]


def groups_of(count: int) -> list[str]:
    return [f"member{i // GROUP_SIZE}" for i in range(count)]


def label_ids(tokenizer_file: Path) -> tuple[int, int]:
    from slimserve.prompts import NO_WORD, YES_WORD

    tokenizer = PromptTokenizer(tokenizer_file, max_length=16)
    return tokenizer.token_id(YES_WORD), tokenizer.token_id(NO_WORD)


def export_fp32(model, tokenizer_file: Path, path: Path) -> Path:
    """The scoring graph of ``model`` as FP32 ONNX (the real exporter)."""
    graph = ScorerGraph(model, *label_ids(tokenizer_file)).eval()
    ids, mask = pad_batch(varied_prompts(tokenizer_file, 2), max(BUCKETS))
    export_scorer_onnx(graph, path, torch.from_numpy(ids), torch.from_numpy(mask))
    return path


def torch_scores(model, tokenizer_file: Path, sequences: list[list[int]]) -> torch.Tensor:
    graph = ScorerGraph(model, *label_ids(tokenizer_file)).eval()
    out = []
    with torch.no_grad():
        for sequence in sequences:
            ids, mask = pad_batch([sequence], len(sequence))
            out.append(graph(torch.from_numpy(ids), torch.from_numpy(mask)).ravel())
    return torch.cat(out)


def multi_item_groups(bundle_dir: Path, sizes: list[int], seed: int = 4) -> list:
    """Member groups (``prefix``, ``items``, ``indices``) of real split prompts in a multi-item bundle's
    layout: the example member against ``sizes[i]`` candidates each, examples numbered in order."""
    from slimserve.bundle import TOKENIZER_FILE, load_bundle
    from slimserve.compression.batches import MemberGroup
    from slimserve.scoring_tokens import encode_scoring

    bundle = load_bundle(bundle_dir)
    tokenizer = PromptTokenizer(bundle_dir / TOKENIZER_FILE, bundle.max_length)
    groups, start = [], 0
    for number, size in enumerate(sizes):
        items = example_candidates(size, seed=seed + number)
        tokens = encode_scoring(
            tokenizer, EXAMPLE_MEMBER, items, bundle.prompt_split, bundle.prompt_template_version
        )
        groups.append(MemberGroup(tokens.prefix, tokens.items, np.arange(start, start + size)))
        start += size
    return groups


def multi_item_qdq(repository: Path, directory: Path, provider: str = "cuda"):
    """(bundle, FP32 multi-item graph, its INT8 Q/DQ graph) of the tiny multi-item scorer in
    ``repository``, calibrated on member requests as the GPU stage does (unquantized layers in FP16, the gpu recipe's type)."""
    from slimserve.bundle import bundle_dir_for, load_bundle
    from slimserve.export.tensorrt.modelopt_qdq import quantize_qdq_feeds
    from slimserve.scoring_tokens import multi_item_requests

    bundle_dir = bundle_dir_for(repository, "scorer")
    bundle = load_bundle(bundle_dir)
    layout = (bundle.item_length_buckets, bundle.max_items_per_request)
    groups = multi_item_groups(bundle_dir, [6, 1, 8, 3])
    feeds = [request.feed() for group in groups for request in multi_item_requests(group, *layout)]
    fp32 = bundle_dir.parent / "model.onnx"
    qdq = quantize_qdq_feeds(
        fp32, directory / "model.onnx", feeds, "int8", high_precision_dtype="fp16", provider=provider
    )
    return bundle, fp32, qdq
