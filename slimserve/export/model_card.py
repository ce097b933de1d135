"""The model card written next to every published model version (markdown, human-first)."""

from __future__ import annotations

import datetime as dt
import platform

from .. import __version__
from ..bundle import ServingBundle
from .parity import ParityReport


def scorer_model_card(
    bundle: ServingBundle, parameters: int, parity: ParityReport, onnx_bytes: int, command: str
) -> str:
    """Markdown card for an exported scorer: provenance, contract, parity evidence."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    buckets = ", ".join(str(b) for b in bundle.length_buckets)
    return f"""# Model card: {bundle.model_name}

Scoring model exported by slimserve {__version__} on {now} ({platform.machine()}, Python {platform.python_version()}).

| field | value |
|---|---|
| source model | {bundle.source_model} |
| task | {bundle.task}: score = logit(yes) - logit(no) at the last real token |
| parameters | {parameters:,} |
| ONNX size | {onnx_bytes / 1e6:.1f} MB |
| prompt template | {bundle.prompt_template_version} |
| label token ids | yes={bundle.yes_token_id}, no={bundle.no_token_id} |
| length buckets | {buckets} (right-padded) |
| max batch size | {bundle.max_batch_size} |
| tensors | `{bundle.tensors.input_ids}`, `{bundle.tensors.attention_mask}` (INT64) -> `{bundle.tensors.score}` (FP32 [batch, 1]) |

## Parity with PyTorch

Checked on {parity.prompts} real prompts, padded to their buckets as the service sends them.

| check | result |
|---|---|
| max abs score difference | {parity.max_abs_diff:.3g} (tolerance {parity.tolerance:.3g}) |
| ranking identical | {"yes" if parity.ranking_identical else f"no ({parity.swapped_pairs} pairs swapped)"} |

Reproduce: `{command}`

The serving bundle hash (`bundle/bundle.json`, `content_hash`) also stands in this model's `config.pbtxt`;
services refuse to serve when the two differ.
"""
