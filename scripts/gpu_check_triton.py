"""GPU check: the published tensorrt_plan model served by a real Triton (24.10) answers like the engine.

Starts Triton on a model repository (a local ``tritonserver`` with the tensorrt backend, or the
``tritonserver:24.10-py3`` image through docker/podman), waits for the model, then scores real prompts
at every bucket through gRPC and compares them with the same engine run in-process (TensorRT Python). A
multi-item model (bundle ``scoring_mode: multi_item``) gets the requests the scoring service sends: one
member per request, ``prefix_*`` [1, P] and ``item_*`` [1, N, L], split and folded as the service does.
Exit 0 pass, 1 fail, 3 skipped (no way to run Triton here). Used by scripts/gpu-check.sh.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SKIP = 3


def start_triton(
    repository: Path, image: str, port: int
) -> tuple[list[str] | None, subprocess.Popen | None, str]:
    """Start a server; returns (cleanup command, process, how)."""
    local = Path("/opt/tritonserver/bin/tritonserver")
    if local.is_file() and Path("/opt/tritonserver/backends/tensorrt").is_dir():
        process = subprocess.Popen(
            [
                str(local),
                f"--model-repository={repository}",
                f"--grpc-port={port}",
                "--allow-http=false",
                "--allow-metrics=false",
            ]
        )
        return None, process, f"local {local}"
    for engine in ("docker", "podman"):
        if (
            shutil.which(engine)
            and subprocess.run([engine, "image", "inspect", image], capture_output=True).returncode == 0
        ):
            name = f"slimserve-gpu-check-{port}"
            gpus = ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
            subprocess.run(
                [
                    engine,
                    "run",
                    "-d",
                    "--rm",
                    "--name",
                    name,
                    *gpus,
                    "-p",
                    f"{port}:8001",
                    "-v",
                    f"{repository.resolve()}:/models:ro",
                    image,
                    "tritonserver",
                    "--model-repository=/models",
                ],
                check=True,
            )
            return [engine, "rm", "-f", name], None, f"{engine} {image}"
    return None, None, ""


def multi_item_scores(client, model: str, bundle, tokenizer, plan: Path) -> tuple[np.ndarray, np.ndarray]:
    """(Triton's, the in-process engine's) scores of the example member's candidates at 1, 3 and 40
    candidates per call, sent as the scoring service sends them."""
    import tritonclient.grpc as grpcclient

    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.export.tensorrt.profiles import served_multi_item_profiles
    from slimserve.export.tensorrt.runtime import EngineScorer
    from slimserve.scoring_tokens import encode_scoring, multi_item_requests

    split = bundle.prompt_split
    profiles = served_multi_item_profiles(
        bundle.item_length_buckets,
        split.prefix_max_tokens,
        split.item_max_tokens,
        bundle.max_items_per_request,
    )
    engine = EngineScorer(plan, profiles)
    served, local = [], []
    for count in (1, 3, 40):
        items = example_candidates(count, seed=count)
        tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, items, split, bundle.prompt_template_version)
        for request in multi_item_requests(tokens, bundle.item_length_buckets, bundle.max_items_per_request):
            inputs = []
            for name, array in request.feed(bundle.tensors).items():
                inputs.append(grpcclient.InferInput(name, list(array.shape), "INT64"))
                inputs[-1].set_data_from_numpy(array)
            served.append(client.infer(model, inputs).as_numpy("score").ravel())
            local.append(engine.run(request.feed(bundle.tensors)).ravel())
    return np.concatenate(served), np.concatenate(local)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("repository", type=Path)
    parser.add_argument("--model", default="scorer")
    parser.add_argument("--image", default="nvcr.io/nvidia/tritonserver:24.10-py3")
    parser.add_argument("--port", type=int, default=18001)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    import tritonclient.grpc as grpcclient

    from slimserve.bundle import TOKENIZER_FILE, bundle_dir_for, load_bundle
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.export.tensorrt.device import compute_capability, plan_filename
    from slimserve.export.tensorrt.profiles import bucket_profiles
    from slimserve.export.tensorrt.runtime import EngineScorer
    from slimserve.models.batching import padded_batches
    from slimserve.prompts import render_scoring_prompt
    from slimserve.tokenization import PromptTokenizer

    cleanup, process, how = start_triton(args.repository, args.image, args.port)
    if not how:
        print(
            f"SKIP: no tritonserver with a tensorrt backend here and no local image {args.image} for docker/podman"
        )
        return SKIP
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{args.port}")
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                if client.is_model_ready(args.model):
                    break
            except Exception:  # not up yet
                pass
            if time.monotonic() > deadline or (process is not None and process.poll() is not None):
                print(f"FAIL: model {args.model!r} not ready within {args.timeout:.0f} s ({how})")
                return 1
            time.sleep(2)
        config = client.get_model_config(args.model).config
        print(
            f"Triton ({how}): {args.model} ready, platform {config.platform}, cc files {dict(config.cc_model_filenames)}"
        )
        bundle_dir = bundle_dir_for(args.repository, args.model)
        bundle = load_bundle(bundle_dir)
        tokenizer = PromptTokenizer(bundle_dir / TOKENIZER_FILE, max_length=max(bundle.length_buckets))
        if bundle.multi_item:
            plan = bundle_dir.parent / plan_filename(compute_capability())
            served, local = multi_item_scores(client, args.model, bundle, tokenizer, plan)
            return _compare(served, local, "multi-item requests")
        prompts = [render_scoring_prompt(EXAMPLE_MEMBER, item) for item in example_candidates(48, seed=3)]
        rng = np.random.default_rng(0)
        sequences = [ids[: int(rng.integers(8, len(ids) + 1))] for ids in tokenizer.encode(prompts)]
        served = np.zeros(len(sequences))
        for chunk, ids, mask in padded_batches(
            sequences, bundle.length_buckets, batch_size=bundle.max_batch_size
        ):
            inputs = [
                grpcclient.InferInput("input_ids", ids.shape, "INT64"),
                grpcclient.InferInput("attention_mask", mask.shape, "INT64"),
            ]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
            served[chunk] = client.infer(args.model, inputs).as_numpy("score").ravel()
        version_dir = bundle_dir.parent
        # opt batch only tunes kernels; the profiles' indices and length ranges depend on buckets alone
        profiles = bucket_profiles(bundle.length_buckets, bundle.max_batch_size)
        local = EngineScorer(version_dir / plan_filename(compute_capability()), profiles).score(
            sequences, bundle.length_buckets, batch_size=bundle.max_batch_size
        )
        return _compare(served, local, "prompts")
    finally:
        if cleanup:
            subprocess.run(cleanup, capture_output=True)
        if process is not None:
            process.terminate()
            process.wait(timeout=60)


def _compare(served: np.ndarray, local: np.ndarray, what: str) -> int:
    from slimserve.export.tensorrt.parity import pairwise_agreement

    diff = float(np.max(np.abs(served - local)))
    agreement = pairwise_agreement(local, served, None)
    print(
        f"Triton vs in-process engine on {len(served)} {what}: max |diff| {diff:.2e}, pair agreement {agreement:.4f}"
    )
    if not np.all(np.isfinite(served)) or diff > 1e-2 or agreement < 0.99:
        print("FAIL: Triton's scores differ from the engine's")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
