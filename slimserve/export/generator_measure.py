"""Measure an exported generator in-process: greedy parity per precision and single-stream decode speed.

``python -m slimserve.export.generator_measure --teacher default --precisions fp32 int8 int4`` builds each
graph with the export path, compares its greedy tokens with PyTorch on explanation prompts, and times
greedy decoding through the Triton model's ``BatchEngine`` (one stream; then all prompts as one batch;
with ``--graphs`` and ``--closed-loop N``, also N streams back to back with their prefills, as served).
Prints one JSON document. Speeds are measurements of this machine, not assertions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from ..cache import cache_dir
from .generator_export import PRECISIONS, build_decoder_onnx, save_hf_model
from .generator_parity import compare_greedy, encode_prompts, explanation_prompts, onnx_greedy, torch_greedy

log = logging.getLogger(__name__)


def _single_stream(engine, request) -> dict:
    """Time one greedy stream alone: prefill (time to first token) and the decode steps after it."""
    started = time.perf_counter()
    engine.start(0, request)
    first = time.perf_counter()
    steps = 0
    while engine.active:
        engine.step()
        steps += 1
    decode_s = time.perf_counter() - first
    return {"ttft_s": first - started, "decode_tokens": steps, "decode_s": decode_s}


def warm_engine(onnx_path: Path, sequence):
    """The Triton model's ``BatchEngine`` over ``onnx_path`` (no stop ids: every request runs to its
    length), warmed up on a short stream of ``sequence``."""
    from ..triton_models.generator import BatchEngine, GenerationRequest, OnnxDecoder

    engine = BatchEngine(OnnxDecoder(onnx_path), eos_token_ids=())
    _single_stream(engine, GenerationRequest(tuple(sequence), 4))
    return engine


def decode_speed(engine, sequences, new_tokens: int, streams: int = 3) -> dict:
    """Single-stream decode tokens/s (mean over ``streams`` prompts), then all prompts as one batch:
    their prefills (one by one) and the batched decode steps after them, timed apart."""
    from ..triton_models.generator import GenerationRequest

    requests = [GenerationRequest(tuple(s), new_tokens) for s in sequences]
    runs = [_single_stream(engine, request) for request in requests[:streams]]
    tokens = sum(r["decode_tokens"] for r in runs)
    started = time.perf_counter()
    for index, request in enumerate(requests):
        engine.start(index, request)
    prefilled = time.perf_counter()
    steps = 0
    while engine.active:
        engine.step()
        steps += 1
    decoded = time.perf_counter()
    return {
        "single_stream_decode_tokens_per_s": tokens / sum(r["decode_s"] for r in runs),
        "single_stream_ttft_s": sum(r["ttft_s"] for r in runs) / len(runs),
        f"batch{len(requests)}_prefill_s": prefilled - started,
        f"batch{len(requests)}_decode_tokens_per_s": steps * len(requests) / (decoded - prefilled),
    }


def closed_loop_speed(engine, sequences, new_tokens: int, slots: int, requests: int) -> dict:
    """What ``bench generators`` loads a served model with, without the serving stack: ``slots`` streams
    back to back until ``requests`` ran, each prompt (cycling ``sequences``) prefilled alone when a slot
    frees, every running sequence decoded in one step. Tokens/s over the whole run, and where it went."""
    from ..triton_models.generator import GenerationRequest

    sent = tokens = steps = rows = 0
    prefill_s = decode_s = 0.0
    started = time.perf_counter()
    while sent < requests or engine.active:
        while engine.active < slots and sent < requests:
            begun = time.perf_counter()
            engine.start(sent, GenerationRequest(tuple(sequences[sent % len(sequences)]), new_tokens))
            prefill_s += time.perf_counter() - begun
            sent, tokens = sent + 1, tokens + 1
        begun, rows = time.perf_counter(), rows + engine.active
        tokens += len(engine.step())
        decode_s += time.perf_counter() - begun
        steps += 1
    wall = time.perf_counter() - started
    return {
        f"closed{slots}_tokens_per_s": tokens / wall,
        f"closed{slots}_prefill_share": prefill_s / wall,
        f"closed{slots}_prefill_ms": 1000 * prefill_s / requests,
        f"closed{slots}_decode_step_ms": 1000 * decode_s / steps,
        f"closed{slots}_mean_batch": rows / steps,
    }


def torch_speed(model, sequence, new_tokens: int, threads: int) -> dict:
    """Greedy decode tokens/s of PyTorch (HF KV cache) on one prompt, prefill included."""
    started = time.perf_counter()
    torch_greedy(model, [sequence], new_tokens, threads)
    return {"tokens_per_s_with_prefill": new_tokens / (time.perf_counter() - started)}


def measure(teacher: str, precisions, prompts: int, new_tokens: int, torch_threads: int = 1) -> dict:
    from ..models.teacher import load_teacher

    loaded = load_teacher(teacher)
    sequences = encode_prompts(loaded.tokenizer_file, explanation_prompts(prompts))
    result: dict = {
        "teacher": loaded.name,
        "prompts": len(sequences),
        "prompt_tokens": [len(s) for s in sequences],
        "new_tokens": new_tokens,
    }
    started = time.perf_counter()
    reference = torch_greedy(loaded.model, sequences, new_tokens, torch_threads)
    result["torch_reference_s"] = time.perf_counter() - started
    result["torch"] = {
        "threads": torch_threads,
        **torch_speed(loaded.model, sequences[0], new_tokens, torch_threads),
    }
    result["load_average_1m"] = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=cache_dir("export"), prefix="generator-measure-") as tmp:
        hf_dir = save_hf_model(loaded.model, Path(tmp) / "hf", loaded.tokenizer_file)
        for precision in precisions:
            graph = build_decoder_onnx(hf_dir, Path(tmp) / precision, precision)
            parity = compare_greedy(reference, onnx_greedy(graph.onnx_path, sequences, new_tokens))
            result[precision] = {
                "build_s": graph.seconds,
                "onnx_mb": graph.size_bytes / 1e6,
                "parity": parity.as_dict(),
                **decode_speed(warm_engine(graph.onnx_path, sequences[0]), sequences, new_tokens),
                "load_average_1m": os.getloadavg()[0],
            }
            log.info("%s: %s", precision, json.dumps(result[precision]))
    return result


def measure_graphs(
    graphs: dict[str, Path], prompts: int, new_tokens: int, closed_loop: int = 0, requests: int = 0
) -> dict:
    """Decode speed of published generator graphs (``<version>/model.onnx``, tokenizer in its bundle) on
    the same explanation prompts, no PyTorch reference: e.g. a student against its teacher. With
    ``closed_loop`` slots, also ``closed_loop_speed`` over ``requests`` requests."""
    result: dict = {"prompts": prompts, "new_tokens": new_tokens}
    for name, onnx_path in graphs.items():
        tokenizer = onnx_path.parent / "bundle" / "tokenizer.json"
        if not onnx_path.is_file() or not tokenizer.is_file():
            raise SystemExit(f"--graphs {name}={onnx_path}: not a published generator version's model.onnx")
        sequences = encode_prompts(tokenizer, explanation_prompts(prompts))
        engine = warm_engine(onnx_path, sequences[0])
        result[name] = decode_speed(engine, sequences, new_tokens)
        if closed_loop:
            result[name].update(closed_loop_speed(engine, sequences, new_tokens, closed_loop, requests))
        result[name]["load_average_1m"] = os.getloadavg()[0]
        log.info("%s: %s", name, json.dumps(result[name]))
    return result


def _graph(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="default", help="'default', 'tiny' or a HF model directory")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--prompts", type=int, default=8, help="explanation prompts")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads of the reference")
    parser.add_argument(
        "--graphs",
        nargs="+",
        type=_graph,
        metavar="NAME=PATH",
        help="instead: decode speed of published graphs (<repository>/generator/<version>/model.onnx)",
    )
    parser.add_argument(
        "--closed-loop",
        type=int,
        default=0,
        metavar="SLOTS",
        help="with --graphs: also SLOTS streams back to back, prefills included, as bench generators loads them",
    )
    parser.add_argument("--requests", type=int, default=48, help="requests of the --closed-loop run")
    args = parser.parse_args(argv)
    if args.closed_loop and not args.graphs:
        parser.error("--closed-loop: only with --graphs")
    if args.closed_loop < 0 or args.requests < 1:
        parser.error(
            f"--closed-loop must be >= 0 and --requests >= 1, got {args.closed_loop} and {args.requests}"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.graphs:
        result = measure_graphs(
            dict(args.graphs), args.prompts, args.new_tokens, args.closed_loop, args.requests
        )
    else:
        result = measure(args.teacher, args.precisions, args.prompts, args.new_tokens, args.torch_threads)
    result["command"] = shlex.join(
        ["python", "-m", "slimserve.export.generator_measure", *(argv or sys.argv[1:])]
    )
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
