"""A new model version published into the repository while the service serves under load.

What a build does when it publishes into the repository ``slimserve up`` serves: a new version directory
and a ``config.pbtxt`` stamped with the new bundle hash, moved in atomically (``export.repository``).
Triton runs with explicit model control, so it keeps the version it loaded; the service keeps the
version whose bundle it verified. Target: no call fails, and every answer carries the verified version
and bundle hash. The new version is the served one's files again (same weights, the next number); it is
removed and the config restored afterwards.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ...bundle import BUNDLE_DIR, TOKENIZER_FILE, load_bundle
from .config import FaultsConfig
from .load import OK, codes, describe_codes, under_load
from .report import CaseResult, info, zero
from .stack import CONFIG_FILE, Stack

MODEL_CARD = "MODEL_CARD.md"


@dataclass(frozen=True)
class _PublishSettings:
    """The settings ``export.pipeline.scorer_spec`` reads, taken from the served ``config.pbtxt``."""

    model_name: str
    max_queue_delay_us: int
    max_queue_size: int
    default_timeout_us: int
    instance_count: int
    intra_op_threads: int | None


def _settings_of(config_path: Path, model_name: str) -> _PublishSettings:
    from ...export.triton_config import parse_config_pbtxt

    served = parse_config_pbtxt(config_path.read_text())
    batching = served.dynamic_batching
    threads = served.parameters.get("intra_op_threads")
    return _PublishSettings(
        model_name=model_name,
        max_queue_delay_us=batching.max_queue_delay_microseconds,
        max_queue_size=batching.default_queue_policy.max_queue_size,
        default_timeout_us=batching.default_queue_policy.default_timeout_microseconds,
        instance_count=served.instance_group[0].count if served.instance_group else 1,
        intra_op_threads=int(threads.string_value) if threads is not None else None,
    )


def publish_next_version(repository: Path, model_name: str, bundle_dir: Path):
    """Publish the files of the version holding ``bundle_dir`` again as the next version (hard links)."""
    from ...export.pipeline import scorer_spec
    from ...export.repository import publish_version

    version_dir = bundle_dir.parent
    bundle = load_bundle(bundle_dir)
    files = {
        path.relative_to(version_dir).as_posix(): path
        for path in sorted(version_dir.rglob("*"))
        if path.is_file() and path.relative_to(version_dir).parts[0] not in (BUNDLE_DIR, MODEL_CARD)
    }
    settings = _settings_of(version_dir.parent / CONFIG_FILE, model_name)
    spec = scorer_spec(settings, bundle, {"source_model": bundle.source_model})
    card = f"# {model_name}\n\nVersion {bundle.model_version} published again by `slimserve bench faults`.\n"
    return publish_version(
        repository, spec, files, bundle, bundle_dir / TOKENIZER_FILE, card, link_files=True
    )


async def _publish(stack: Stack, target: str, requests: list, config: FaultsConfig):
    async with under_load(target, requests, config.deadline_s, config.load_workers) as (call, health):
        await asyncio.sleep(config.observe_seconds)
        published_at = time.perf_counter()
        published = await asyncio.to_thread(
            publish_next_version, stack.repository, stack.model_name, stack.bundle_dir
        )
        await asyncio.sleep(config.observe_seconds)
    return call, health, published_at, published


def run_publish(stack: Stack, config: FaultsConfig, requests: list) -> CaseResult:
    """Publish a version while loaded; failed calls, answers from another bundle, health."""
    config_path = stack.repository / stack.model_name / CONFIG_FILE
    served_config = config_path.read_text()
    bundle = stack.bundle
    verified = f"{bundle.model_version}:{bundle.content_hash}"
    published = None
    try:
        with stack.service() as service:
            call, health, published_at, published = asyncio.run(
                _publish(stack, service.target, requests, config)
            )
    finally:
        if published is not None:
            shutil.rmtree(published.path, ignore_errors=True)
        config_path.write_text(served_config)
    after = call.between(published_at)
    result = CaseResult("new version published")
    result.figures = [
        info("published", f"version {published.version} next to served version {bundle.model_version}"),
        info("calls after publishing", len(after)),
        zero("failed calls", sum(1 for o in call.outcomes if o.code != OK)),
        zero(
            "answers from another version or bundle",
            sum(1 for o in call.outcomes if o.code == OK and o.served != verified),
        ),
        zero(
            "health not SERVING after publishing",
            sum(n for s, n in health.seen(published_at).items() if s != "SERVING"),
        ),
        info("codes", describe_codes(codes(call.outcomes))),
    ]
    return result
