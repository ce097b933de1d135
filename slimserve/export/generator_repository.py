"""Publish a generator (causal LM -> checked ONNX decoder -> Triton model ``generator``), atomically.

``publish_generator`` is what the build and the tests call: it saves the model, builds the FP32 decoder
graph, fails unless its greedy tokens equal PyTorch's on the parity prompts, optionally builds a
weight-only quantized graph (INT8/INT4 ``MatMulNBits``) and measures its agreement, then publishes the
served graph, ``model.py`` (``slimserve/triton_models/generator.py``), the serving bundle
(``tokenizer.json`` + ``generation.json``), ``export_report.json`` and a model card as one new version.
``build_tiny_generator_repository`` does the same for a tiny random Llama in seconds (for tests).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..bundle import sha256_file
from ..cache import cache_dir
from ..generator_bundle import GeneratorBundle
from ..prompts import END_OF_TURN, EXPLAIN_TEMPLATE_VERSION
from ..triton_models.generator import GENAI_CONFIG_FILE, OUTPUT_VOCAB_FILE
from .generator_config import GENERATOR_MODEL, GeneratorExportConfig
from .generator_export import DecoderGraph, build_decoder_onnx, save_hf_model
from .generator_parity import (
    GreedyParity,
    compare_greedy,
    encode_prompts,
    explanation_prompts,
    onnx_greedy,
    torch_greedy,
)
from .onnx_export import ExportError
from .output_vocab import shortlist, trim_lm_head
from .repository import publish_version
from .scorer_model import external_data_locations
from .triton_config import InstanceGroupSpec, TensorSpec, TritonModelSpec

log = logging.getLogger(__name__)

MODEL_PY = "model.py"
REPORT_FILE = "export_report.json"
SERVED_GROUNDING_KEY = "served_grounding"  # what ``check_graph`` returned, in the export report
END_OF_TEXT = "<|endoftext|>"
DEFAULT_MAX_CONTEXT = 2048


def generator_model_source() -> Path:
    """Path of the python-backend model file (``generator.py``)."""
    from ..triton_models import generator

    return Path(generator.__file__)


def generator_triton_spec(
    name: str = GENERATOR_MODEL,
    *,
    max_active_sequences: int = 8,
    max_queued_requests: int = 64,
    stream_interval: int = 1,
    max_context: int | None = None,
    intra_op_threads: int = 0,
    parameters: Mapping[str, str] | None = None,
    device: str = "cpu",
) -> TritonModelSpec:
    """Spec of the decoupled generator model (see docs/generator.md for the contract).

    ``max_context`` None leaves the limit to the bundle's ``generation.json``. ``device`` ``"gpu"`` places
    the instance on a GPU (KIND_GPU) and runs ONNX Runtime's CUDA provider there (needs onnxruntime-gpu
    in Triton's Python environment, as in the GPU serving image).
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if max_active_sequences < 1:
        raise ValueError(f"max_active_sequences must be >= 1, got {max_active_sequences}")
    if max_queued_requests < 0:
        raise ValueError(f"max_queued_requests must be >= 0, got {max_queued_requests}")
    if stream_interval < 1:
        raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
    params = {
        "max_active_sequences": str(max_active_sequences),
        "max_queued_requests": str(max_queued_requests),
        "stream_interval": str(stream_interval),
        "intra_op_threads": str(intra_op_threads),
        "execution_provider": "cuda" if device == "gpu" else "cpu",
        **(parameters or {}),
    }
    if max_context is not None:
        params["max_context"] = str(max_context)
    return TritonModelSpec(
        name=name,
        backend="python",
        max_batch_size=0,
        decoupled=True,
        inputs=(
            TensorSpec("input_ids", "TYPE_INT64", (-1,)),
            TensorSpec("max_tokens", "TYPE_INT32", (1,)),
            TensorSpec("temperature", "TYPE_FP32", (1,), optional=True),
            TensorSpec("top_p", "TYPE_FP32", (1,), optional=True),
            TensorSpec("seed", "TYPE_UINT64", (1,), optional=True),
            TensorSpec("stop_token_ids", "TYPE_INT64", (-1,), optional=True),
            TensorSpec("repetition_penalty", "TYPE_FP32", (1,), optional=True),
            TensorSpec("copy_names", "TYPE_INT64", (-1,), optional=True),
        ),
        outputs=(
            TensorSpec("token_ids", "TYPE_INT64", (-1,)),
            TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        ),
        instance_groups=(InstanceGroupSpec(count=1, kind="KIND_GPU" if device == "gpu" else "KIND_CPU"),),
        parameters=params,
    )


def generator_model_files(graph: DecoderGraph) -> dict[str, Path]:
    """Files of one generator version: ``model.py``, ``model.onnx`` and the graph's external data."""
    files = {
        MODEL_PY: generator_model_source(),
        "model.onnx": graph.onnx_path,
        GENAI_CONFIG_FILE: graph.onnx_path.parent / GENAI_CONFIG_FILE,
    }
    for location in external_data_locations(graph.onnx_path):
        files[location] = graph.onnx_path.parent / location
    if (graph.onnx_path.parent / OUTPUT_VOCAB_FILE).is_file():
        files[OUTPUT_VOCAB_FILE] = graph.onnx_path.parent / OUTPUT_VOCAB_FILE
    return files


def default_eos_token_ids(model, tokenizer_file: Path) -> tuple[int, ...]:
    """End-of-turn and end-of-text ids of the tokenizer, plus the model config's eos ids."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = {tokenizer.token_to_id(token) for token in (END_OF_TURN, END_OF_TEXT)}
    configured = getattr(model.config, "eos_token_id", None)
    ids |= set(configured if isinstance(configured, list | tuple) else [configured])
    return tuple(sorted(i for i in ids if i is not None))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _model_card(bundle: GeneratorBundle, report: dict) -> str:
    lines = [
        f"# {bundle.model_name}: generator ({bundle.precision})",
        "",
        f"- source model: {bundle.source_model or 'unknown'}",
        f"- graph: ONNX decoder with KV cache (onnxruntime-genai model builder), precision {bundle.precision}",
        f"- prompt template: {bundle.prompt_template_version}; eos ids {list(bundle.eos_token_ids)}",
        f"- max context {bundle.max_context}, max new tokens {bundle.max_new_tokens_limit}",
        f"- FP32 greedy parity with PyTorch: {report['parity_fp32']}",
    ]
    if report.get("output_vocab"):
        vocab = report["output_vocab"]
        lines.append(
            f"- LM head: a shortlist of {vocab['shortlist']} of {vocab['vocab_size']} tokens, plus each "
            "running prompt's own tokens"
        )
    if report.get("agreement_quantized"):
        lines.append(f"- {bundle.precision} greedy agreement with PyTorch: {report['agreement_quantized']}")
    served = report.get(SERVED_GROUNDING_KEY)
    if served:
        lines.append(
            f"- grounding as served (greedy, repetition penalty {served['notes']['repetition_penalty']:g}"
            f"{', names copied whole' if served['notes'].get('copy_names') else ''}) on "
            f"{served['grounding_pairs']} held-out pairs: hallucination {_rate(served['hallucination_rate'])}, "
            f"coverage {_rate(served['coverage'])}, verdict agreement {_rate(served['verdict_agreement'])}"
        )
        if served.get("full_match_pairs"):
            lines.append(
                f"- as served on {served['full_match_pairs']} test-split full matches (the member has every "
                f"required skill): hallucination {_rate(served['full_match_hallucination_rate'])}"
            )
        free = served["notes"].get("free_prompts")
        if free:
            count = len(free["answers"])
            lines.append(
                f"- free Generate prompts answered as an explanation of fit (none asks for one): "
                f"{round(free['as_explanations'] * count)} of {count}"
            )
    return "\n".join(lines) + "\n"


def _checked(graph: DecoderGraph, sequences, reference, threads: int) -> GreedyParity:
    started = time.perf_counter()
    parity = compare_greedy(reference, onnx_greedy(graph.onnx_path, sequences, len(reference[0]), threads))
    log.info(
        "%s greedy agreement (%.1f s): %s", graph.precision, time.perf_counter() - started, parity.as_dict()
    )
    return parity


def _context_limits(model, config: GeneratorExportConfig) -> tuple[int, int]:
    """``max_context`` (unset: the model's positions, at most 2048) and the ``max_new_tokens`` limit in it."""
    positions = int(getattr(model.config, "max_position_embeddings", DEFAULT_MAX_CONTEXT))
    max_context = min(positions, DEFAULT_MAX_CONTEXT) if config.max_context is None else config.max_context
    if not 2 <= max_context <= positions:
        raise ExportError(
            f"max_context must be in [2, {positions}] (the model's positions), got {max_context}"
        )
    return max_context, min(config.max_new_tokens_limit, max_context - 1)


def _output_tokens(model, config: GeneratorExportConfig, keep: Iterable[int]) -> list[int] | None:
    """The LM head's shortlist (``config.output_vocab`` lowest ids and ``keep``), or None for the whole
    vocabulary."""
    if config.output_vocab is None:
        return None
    if not getattr(model.config, "tie_word_embeddings", False):
        raise ExportError(
            "output_vocab needs a model whose LM head is tied to its embedding (the prompt's own tokens "
            "are scored with embedding rows); this model's is not: leave output_vocab unset"
        )
    return shortlist(int(model.config.vocab_size), config.output_vocab, keep)


def _with_reference_tokens(shortlisted: list[int], sequences, reference, vocab_size: int):
    """The shortlist with every token PyTorch wrote on the parity prompts, so the parity gate checks the
    trimmed graph rather than the shortlist's reach; and the report entry, which counts the written
    tokens the shortlist and their prompt did not hold (its coverage on these prompts)."""
    kept = set(shortlisted)
    outside = []
    for prompt, tokens in zip(sequences, reference, strict=True):
        held = kept | set(prompt)
        outside += [t for t in tokens if t not in held]
    kept |= set(outside)
    entry = {
        "shortlist": len(kept),
        "vocab_size": vocab_size,
        "parity_tokens_outside": len(outside),
        "parity_tokens_written": sum(len(tokens) for tokens in reference),
    }
    return sorted(kept), entry


def _build(hf_dir: Path, out_dir: Path, precision: str, output_tokens, vocab_size: int, options=None):
    """Build one decoder graph and, with ``output_tokens``, trim its LM head to them."""
    graph = build_decoder_onnx(hf_dir, out_dir, precision, options)
    if output_tokens is not None:
        trim_lm_head(graph.onnx_path, output_tokens, vocab_size)
    return graph


def _export_checked(
    model, tokenizer_file: Path, sequences, config: GeneratorExportConfig, keep: Iterable[int], tmp: Path
) -> tuple[DecoderGraph, dict]:
    """The graph to serve and the export report: the FP32 graph's greedy parity with PyTorch (the gate,
    on the trimmed head when there is a shortlist), then the quantized graph's agreement (reported)."""
    threads, quantize = config.intra_op_threads, config.quantize
    report: dict = {"parity_prompts": len(sequences), "parity_tokens": config.parity_tokens, "seconds": {}}
    started = time.perf_counter()
    hf_dir = save_hf_model(model, tmp / "hf", tokenizer_file)
    reference = torch_greedy(model.eval(), sequences, config.parity_tokens)
    report["seconds"]["torch_reference"] = time.perf_counter() - started
    vocab_size = int(model.config.vocab_size)
    output_tokens = _output_tokens(model, config, keep)
    if output_tokens is not None:
        output_tokens, report["output_vocab"] = _with_reference_tokens(
            output_tokens, sequences, reference, vocab_size
        )
    graph = _build(hf_dir, tmp / "fp32", "fp32", output_tokens, vocab_size)
    report["seconds"]["build_fp32"] = graph.seconds
    parity = _checked(graph, sequences, reference, threads)
    report["parity_fp32"] = parity.as_dict()
    if not parity.identical:
        raise ExportError(
            f"generator parity failed: FP32 ONNX greedy tokens differ from PyTorch on "
            f"{parity.prompts - parity.identical_sequences} of {parity.prompts} prompts "
            f"(token agreement {parity.token_agreement:.3f}); nothing published"
        )
    if quantize is not None:
        graph = _build(hf_dir, tmp / quantize, quantize, output_tokens, vocab_size, config.quantize_options)
        report["seconds"][f"build_{quantize}"] = graph.seconds
        report["agreement_quantized"] = _checked(graph, sequences, reference, threads).as_dict()
    report["onnx_bytes"] = graph.size_bytes
    return graph, report


def publish_generator(
    model,
    tokenizer_file: Path,
    config: GeneratorExportConfig,
    output_tokens: Iterable[int] = (),
    check_graph: Callable[[Path], dict] | None = None,
) -> Path:
    """Export ``model`` (a HF Llama causal LM) as a new version of ``config.model_name`` in
    ``config.model_repository``; return the version's path.

    With ``config.output_vocab`` the LM head scores the lowest ids, the end ids and ``output_tokens``
    (say, every token of the texts the model was trained to write), plus each running prompt's own.

    Raises ``ExportError`` when the FP32 graph's greedy tokens differ from PyTorch's on
    ``config.parity_prompts`` explanation prompts for ``config.parity_tokens`` new tokens; nothing is
    published then. ``config.quantize`` ``"int8"``/``"int4"`` publishes a weight-only quantized graph (its
    agreement with PyTorch is reported, not gated); None publishes the FP32 graph. ``check_graph``, when
    given, is called with the graph to publish (its ``.onnx`` path) and may raise to publish nothing; what
    it returns goes into the export report under ``served_grounding`` (the build's grounding gate on it).
    """
    max_context, max_new_tokens_limit = _context_limits(model, config)
    sequences = encode_prompts(tokenizer_file, explanation_prompts(config.parity_prompts))
    too_long = [len(s) for s in sequences if len(s) + config.parity_tokens > max_context]
    if too_long:
        raise ExportError(f"parity prompts of {too_long} tokens do not fit max_context {max_context}")
    name, source_model = config.model_name, config.source_model
    eos_token_ids = (
        config.eos_token_ids
        if config.eos_token_ids is not None
        else default_eos_token_ids(model, tokenizer_file)
    )
    with tempfile.TemporaryDirectory(dir=cache_dir("export"), prefix="generator-") as tmp:
        tmp = Path(tmp)
        keep = {*eos_token_ids, *output_tokens}
        graph, report = _export_checked(model, tokenizer_file, sequences, config, keep, tmp)
        if check_graph is not None:
            report[SERVED_GROUNDING_KEY] = check_graph(graph.onnx_path)
        bundle = GeneratorBundle(
            model_name=name,
            model_version=0,  # set at publish
            prompt_template_version=EXPLAIN_TEMPLATE_VERSION,
            eos_token_ids=eos_token_ids,
            max_context=max_context,
            max_new_tokens_limit=max_new_tokens_limit,
            vocab_size=int(model.config.vocab_size),
            tokenizer_sha256=sha256_file(tokenizer_file),
            precision=graph.precision,
            source_model=source_model,
            copy_names=True,
        )
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        spec = generator_triton_spec(
            name,
            max_active_sequences=config.max_active_sequences,
            max_queued_requests=config.max_queued_requests,
            stream_interval=config.stream_interval,
            intra_op_threads=config.intra_op_threads,
            parameters={"source_model": source_model} if source_model else None,
            device=config.device,
        )
        files = {**generator_model_files(graph), REPORT_FILE: tmp / REPORT_FILE}
        weights = tuple(name for name in files if name not in (MODEL_PY, REPORT_FILE))
        published = publish_version(
            config.model_repository,
            spec,
            files=files,
            bundle=bundle,
            tokenizer_file=tokenizer_file,
            model_card=_model_card(bundle, report),
            version=config.version,
            weight_files=weights,
            link_files=False,  # model.py comes from the source tree
        )
    log.info("published %s version %d at %s", name, published.version, published.path)
    return published.path


# The tiny model's export: small limits, few parity prompts and tokens (seconds on 2 cores).
TINY_EXPORT = {
    "quantize": None,
    "parity_prompts": 3,
    "parity_tokens": 8,
    "max_context": 1024,
    "max_active_sequences": 4,
    "max_queued_requests": 8,
    "intra_op_threads": 1,
}


def build_tiny_generator_repository(repository: Path, *, seed: int = 0, **settings) -> Path:
    """A repository with a tiny random Llama as ``generator`` (fast: seconds); returns the version path.

    The real export path (builder, parity, publish) on ``load_teacher("tiny", seed)``; ``settings`` are
    ``GeneratorExportConfig`` fields over ``TINY_EXPORT``. The prompts are explanation prompts, so the
    SmolLM2 tokenizer's eos ids (``<|im_end|>`` 2, ``<|endoftext|>`` 0) apply.
    """
    from ..models.teacher import load_teacher

    loaded = load_teacher("tiny", seed=seed)
    config = GeneratorExportConfig(
        **{**TINY_EXPORT, "source_model": loaded.name, **settings, "model_repository": repository}
    )
    return publish_generator(loaded.model, loaded.tokenizer_file, config)
