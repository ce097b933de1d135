"""teacher2triton for scoring: load a causal LM, export the scoring graph, check parity, publish.

This is the whole ``slimserve export`` command as one function; compression stages plug in before the
ONNX step in later recipes.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from ..bundle import SCORING_MULTI_ITEM, ServingBundle, sha256_file
from ..cache import cache_dir
from ..examples import EXAMPLE_MEMBER, example_candidates
from ..prompts import NO_WORD, SCORING_TEMPLATE_VERSION, YES_WORD
from ..schema import Item
from ..scoring_tokens import ScoringTokens, encode_scoring
from ..settings import Settings
from ..tokenization import PromptTokenizer, bucket_for, pad_batch
from .exporters import DEFAULT_EXPORTER, EXPORTER_HELP, OnnxExporter
from .model_card import scorer_model_card
from .parity import ParityReport, check_multi_item_parity, check_scorer_parity
from .scoring_layout import ScoringLayout

if TYPE_CHECKING:
    from ..models.teacher import LoadedModel

log = logging.getLogger(__name__)


class ScorerExportConfig(ScoringLayout, Settings):
    """Settings of ``slimserve export`` (teacher -> scorer model in a Triton repository)."""

    env_prefix: ClassVar[str] = "SLIMSERVE_EXPORT_"

    teacher: str = Field(
        "default",
        description="'default' (packaged SmolLM2-135M-Instruct), 'tiny' (random tiny Llama) or a HF model directory",
    )
    seed: int = Field(0, description="Seed for the random tiny model")
    model_repository: Path = Field(
        Path("model_repository"), description="Triton model repository to publish into"
    )
    model_name: str = Field("scorer", description="Triton model name")
    length_buckets: tuple[int, ...] = Field(
        (96, 192, 320, 512), description="Sequence-length buckets (the largest is the max prompt length)"
    )
    max_batch_size: int = Field(64, ge=1, description="Triton max_batch_size")
    max_queue_delay_us: int = Field(200, ge=0, description="Dynamic batcher: longest wait to grow a batch")
    max_queue_size: int = Field(
        0,
        ge=0,
        description="Requests queued in Triton before RESOURCE_EXHAUSTED (0 = unbounded; non-zero brings 500 ms stalls, docs/bench.md Tail latency)",
    )
    default_timeout_us: int = Field(
        0,
        ge=0,
        description="Triton queue timeout (0: none, deadlines end by gRPC cancellation; non-zero brings 500 ms stalls, docs/bench.md Tail latency)",
    )
    instance_count: int = Field(1, ge=1, description="Model instances (processes) in Triton")
    intra_op_threads: int = Field(
        0, ge=0, description="ONNX Runtime threads per instance (0 = cores / instances)"
    )
    opset: int = Field(18, ge=17, description="ONNX opset")
    onnx_exporter: OnnxExporter = Field(DEFAULT_EXPORTER, description=EXPORTER_HELP)
    parity_atol: float = Field(1e-3, gt=0, description="Allowed absolute score difference ONNX vs PyTorch")
    parity_rtol: float = Field(1e-4, ge=0, description="Allowed difference relative to the largest score")
    multi_item_parity_atol: float = Field(
        1e-4,
        gt=0,
        description="Multi-item: allowed absolute score difference against the single-sequence graph",
    )
    parity_prompts: int = Field(24, ge=2, description="Real prompts used for the parity check")


@dataclass
class ExportResult:
    """What an export produced and how long each step took."""

    model_dir: Path
    version: int
    content_hash: str
    parity: ParityReport
    seconds: dict[str, float]


def parity_items(count: int) -> list[Item]:
    """Varied candidates for the example member, some with long descriptions (big buckets)."""
    items = example_candidates(count)
    long_tail = max(1, count // 6)
    for index in range(long_tail):
        item = items[-1 - index]
        items[-1 - index] = dataclasses.replace(item, description=item.description * (6 + 6 * index))
    return items


def parity_tokens(tokenizer: PromptTokenizer, count: int, split) -> ScoringTokens:
    """Real scoring prompts as tokens: the example member against ``parity_items(count)``."""
    return encode_scoring(tokenizer, EXAMPLE_MEMBER, parity_items(count), split)


def parity_prompts(count: int) -> list[str]:
    """Real scoring prompts as whole texts (for single-sequence checks of whole-text templates)."""
    from ..prompts import render_scoring_prompt

    return [render_scoring_prompt(EXAMPLE_MEMBER, item) for item in parity_items(count)]


def build_scorer_bundle(
    config, tokenizer: PromptTokenizer, tokenizer_file: Path, source: str
) -> ServingBundle:
    """The serving bundle of a scorer (name, layout, buckets and batch size from ``config``, which has
    ``ScoringLayout``'s fields; hash at publish)."""
    multi = config.scoring_mode == SCORING_MULTI_ITEM
    return ServingBundle(
        model_name=config.model_name,
        model_version=0,  # set at publish
        task="scoring",
        prompt_template_version=SCORING_TEMPLATE_VERSION,
        yes_token_id=tokenizer.token_id(YES_WORD),
        no_token_id=tokenizer.token_id(NO_WORD),
        length_buckets=tuple(sorted(config.length_buckets)),
        max_batch_size=config.max_members_per_batch if multi else config.max_batch_size,
        tokenizer_sha256=sha256_file(tokenizer_file),
        source_model=source,
        scoring_mode=config.scoring_mode,
        prompt_split=config.prompt_split(),
        item_length_buckets=tuple(sorted(config.item_length_buckets)) if multi else (),
        max_items_per_request=config.max_items_per_request if multi else 0,
    )


def export_checked_onnx(
    graph,
    path: Path,
    sequences: list[list[int]],
    buckets: tuple[int, ...],
    *,
    opset: int = 18,
    atol: float = 1e-3,
    rtol: float = 1e-4,
    seconds: dict[str, float] | None = None,
    exporter: OnnxExporter = DEFAULT_EXPORTER,
) -> tuple[list[Path], ParityReport]:
    """Export a scoring graph to ONNX and check it against PyTorch on ``sequences`` (padded to their
    buckets); raise ``ExportError`` when parity breaks. Returns the files written and the report."""
    import torch  # here, not at module level: `slimserve serve` imports this module's config without torch

    from .onnx_export import export_scorer_onnx

    seconds = {} if seconds is None else seconds
    sample = sequences[:2]
    sample_ids, sample_mask = pad_batch(sample, bucket_for(max(map(len, sample)), buckets))
    started = time.perf_counter()
    files = export_scorer_onnx(
        graph,
        path,
        torch.from_numpy(sample_ids),
        torch.from_numpy(sample_mask),
        opset=opset,
        exporter=exporter,
    )
    seconds["onnx_export"] = time.perf_counter() - started
    started = time.perf_counter()
    parity = check_scorer_parity(graph, files[0], sequences, buckets, atol, rtol)
    seconds["parity"] = time.perf_counter() - started
    _raise_on_failed_parity(parity, "ONNX vs PyTorch")
    return files, parity


def _raise_on_failed_parity(parity: ParityReport, what: str) -> None:
    from .onnx_export import ExportError

    log.info("parity (%s): %s", what, parity.as_dict())
    if not parity.passed:
        raise ExportError(
            f"{what} parity failed on {parity.prompts} prompts: max abs diff {parity.max_abs_diff:.3g} "
            f"(tolerance {parity.tolerance:.3g}), {parity.swapped_pairs} ranking pairs swapped; nothing published"
        )


def export_checked_multi_item_onnx(
    graph,
    path: Path,
    tokens: list,
    layout,
    *,
    opset: int = 18,
    atol: float = 1e-4,
    rtol: float = 0.0,
    seconds: dict[str, float] | None = None,
    exporter: OnnxExporter = DEFAULT_EXPORTER,
) -> tuple[list[Path], ParityReport]:
    """Export ``graph`` (a ``ScorerGraph``) as the multi-item scoring graph and check it against the
    single-sequence PyTorch graph on ``tokens`` (members with ``prefix`` and ``items``), sent as the
    service sends them under ``layout`` (a bundle or settings with ``item_length_buckets``,
    ``max_items_per_request`` and ``length_buckets``); raise ``ExportError`` when parity breaks.
    Returns the files written and the report."""
    import torch

    from ..models.multi_item import MultiItemScorer
    from ..scoring_tokens import multi_item_requests
    from ..tokenization import pad_multi_item
    from .onnx_export import export_multi_item_onnx

    seconds = {} if seconds is None else seconds
    scorer = MultiItemScorer(graph).eval()
    sample = [t for t in tokens if len(t.items) >= 2][:2] or tokens[:1]
    arrays = pad_multi_item([t.prefix for t in sample], [t.items[:2] for t in sample])
    started = time.perf_counter()
    sample_tensors = tuple(torch.from_numpy(a) for a in arrays)
    files = export_multi_item_onnx(scorer, path, sample_tensors, opset=opset, exporter=exporter)
    seconds["onnx_export"] = time.perf_counter() - started
    started = time.perf_counter()
    parity = check_multi_item_parity(
        graph,
        files[0],
        tokens,
        lambda t: multi_item_requests(t, layout.item_length_buckets, layout.max_items_per_request),
        layout.length_buckets,
        atol,
        rtol,
    )
    seconds["parity"] = time.perf_counter() - started
    _raise_on_failed_parity(parity, "multi-item ONNX vs single-sequence PyTorch")
    return files, parity


def export_scorer(
    config: ScorerExportConfig, command: str | None = None, loaded: LoadedModel | None = None
) -> ExportResult:
    """Export ``config.teacher`` as a scorer into the repository; raise ``ExportError`` on failed parity.

    ``loaded``: that teacher already loaded (``load_teacher(config.teacher, seed=config.seed)``), so a
    caller exporting it more than once loads it once; unset: loaded here."""
    from ..models.scorer_graph import ScorerGraph
    from ..models.teacher import load_teacher
    from .repository import publish_version
    from .scorer_model import scorer_model_files
    from .triton_config import check_against_onnx

    seconds: dict[str, float] = {}
    if loaded is None:
        started = time.perf_counter()
        loaded = load_teacher(config.teacher, seed=config.seed)
        seconds["load"] = time.perf_counter() - started

    buckets = tuple(sorted(config.length_buckets))
    tokenizer = PromptTokenizer(loaded.tokenizer_file, max_length=max(buckets))
    bundle = build_scorer_bundle(config, tokenizer, loaded.tokenizer_file, loaded.name)
    graph = ScorerGraph(loaded.model, bundle.yes_token_id, bundle.no_token_id).eval()
    tokens = parity_tokens(tokenizer, config.parity_prompts, bundle.prompt_split)
    spec = scorer_spec(config, bundle, {"source_model": loaded.name})
    with tempfile.TemporaryDirectory(dir=cache_dir("export")) as tmp:
        path = Path(tmp) / "model.onnx"
        if bundle.multi_item:
            onnx_files, parity = export_checked_multi_item_onnx(
                graph,
                path,
                [tokens],
                bundle,
                opset=config.opset,
                exporter=config.onnx_exporter,
                atol=config.multi_item_parity_atol,
                seconds=seconds,
            )
        else:
            onnx_files, parity = export_checked_onnx(
                graph,
                path,
                tokens.sequences(),
                buckets,
                opset=config.opset,
                exporter=config.onnx_exporter,
                atol=config.parity_atol,
                rtol=config.parity_rtol,
                seconds=seconds,
            )
        check_against_onnx(spec, onnx_files[0], extra_outputs=(bundle.tensors.compute_ms,))
        card = scorer_model_card(
            bundle,
            parameters=sum(p.numel() for p in loaded.model.parameters()),
            parity=parity,
            onnx_bytes=sum(f.stat().st_size for f in onnx_files),
            command=command or shlex.join(["slimserve", *sys.argv[1:]]),
        )
        started = time.perf_counter()
        published = publish_version(
            config.model_repository,
            spec,
            files=scorer_model_files(onnx_files[0]),
            bundle=bundle,
            tokenizer_file=loaded.tokenizer_file,
            model_card=card,
            link_files=False,  # a hard link to the source tree's model.py would change with it
        )
        seconds["publish"] = time.perf_counter() - started
    return ExportResult(published.path, published.version, published.content_hash, parity, seconds)


def scorer_spec(config, bundle: ServingBundle, parameters: dict[str, str]):
    """The Triton spec of a CPU scorer for ``bundle``'s layout (``config``: the export's or a recipe's
    publish settings: name, queue and, where set, instance settings)."""
    from .scorer_model import multi_item_scorer_triton_spec, scorer_triton_spec

    common = {
        "name": config.model_name,
        "max_queue_delay_us": config.max_queue_delay_us,
        "max_queue_size": config.max_queue_size,
        "default_timeout_us": config.default_timeout_us,
        "instance_count": getattr(config, "instance_count", 1),
        "intra_op_threads": getattr(config, "intra_op_threads", None),
        "parameters": parameters,
    }
    if bundle.multi_item:
        return multi_item_scorer_triton_spec(
            max_members=bundle.max_batch_size, item_length_buckets=bundle.item_length_buckets, **common
        )
    return scorer_triton_spec(
        max_batch_size=bundle.max_batch_size, length_buckets=bundle.length_buckets, **common
    )
