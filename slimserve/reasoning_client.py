"""A small client for the ReasoningService: ``slimserve explain`` / ``generate`` and the demo of ``up``.

Streams text to a writer as chunks arrive, then returns the closing ``GenerationMetadata``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from .channel import ClientSecurity, open_channel
from .errors import UserError
from .examples import EXAMPLE_MEMBER, example_candidates
from .schema import Item, Member, SchemaError, item_from_dict, member_from_dict

FINISH_NAMES = {0: "unspecified", 1: "stop", 2: "length", 3: "stop string"}


def _json_arg(value: str, flag: str) -> object:
    """A flag's JSON value, given inline or as the path of a JSON file."""
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as exc:
            raise UserError(f"{flag}: neither a JSON object nor a readable file: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{flag}: not valid JSON: {exc}") from None


def load_explain_input(member: str | None, item: str | None, example_index: int = 0) -> tuple[Member, Item]:
    """The member and item to explain: JSON (inline or a file) or the built-in example."""
    try:
        chosen_member = EXAMPLE_MEMBER if member is None else member_from_dict(_json_arg(member, "--member"))
        if item is None:
            if example_index < 0:
                raise UserError(f"--example-item must be >= 0, got {example_index}")
            chosen_item = example_candidates(example_index + 1)[example_index]
        else:
            chosen_item = item_from_dict(_json_arg(item, "--item"), "item")
    except SchemaError as exc:
        raise UserError(str(exc)) from None
    return chosen_member, chosen_item


def build_options(
    max_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    repetition_penalty: float | None = None,
):
    """A ``GenerationOptions`` protobuf (unset values stay unset: the service's defaults)."""
    from .v1 import reasoning_pb2

    options = reasoning_pb2.GenerationOptions(max_tokens=max_tokens, temperature=temperature, stop=list(stop))
    if top_p is not None:
        options.top_p = top_p
    if seed is not None:
        options.seed = seed
    if repetition_penalty is not None:
        options.repetition_penalty = repetition_penalty
    return options


def explain_request(member: Member, item: Item, options=None, request_id: str = ""):
    """An ``ExplainRequest`` protobuf for plain inputs."""
    from .client_convert import item_to_proto, member_to_proto
    from .v1 import reasoning_pb2

    return reasoning_pb2.ExplainRequest(
        member=member_to_proto(member), item=item_to_proto(item), options=options, request_id=request_id
    )


def generate_request(prompt: str, options=None, request_id: str = ""):
    """A ``GenerateRequest`` protobuf."""
    from .v1 import reasoning_pb2

    return reasoning_pb2.GenerateRequest(prompt=prompt, options=options, request_id=request_id)


def format_metadata(metadata) -> str:
    """One line: model, request id, tokens, finish reason, time to first token, decode rate, total."""
    response = metadata.response
    finish = FINISH_NAMES.get(metadata.finish_reason, str(metadata.finish_reason))
    if metadata.stop_string:
        finish += f" {metadata.stop_string!r}"
    return (
        f"model {response.model_name} v{response.model_version} (bundle {response.bundle_hash[:12]}), "
        f"request {response.request_id}: {metadata.tokens_generated} tokens after a "
        f"{metadata.prompt_tokens}-token prompt, finish {finish}; first token "
        f"{metadata.time_to_first_token_ms:.1f} ms, {metadata.tokens_per_second:.1f} tokens/s, "
        f"total {response.total_ms:.1f} ms"
    )


def stream_text(
    target: str,
    request,
    *,
    timeout_s: float = 60.0,
    write: Callable[[str], object] | None = None,
    security: ClientSecurity | None = None,
):
    """Call Explain (an ExplainRequest) or Generate on ``target``, writing text as it arrives; return
    the closing ``GenerationMetadata``."""
    from .v1 import reasoning_pb2_grpc

    write = write or _write_stdout
    method = "Explain" if request.DESCRIPTOR.name == "ExplainRequest" else "Generate"
    metadata = None
    with open_channel(target, security) as channel:
        call = getattr(reasoning_pb2_grpc.ReasoningServiceStub(channel), method)
        try:
            for chunk in call(request, timeout=timeout_s):
                if chunk.text:
                    write(chunk.text)
                if chunk.HasField("metadata"):
                    metadata = chunk.metadata
        except grpc.RpcError as exc:
            raise UserError(f"{method} failed: {exc.code().name}: {exc.details()}") from None
    if metadata is None:
        raise UserError(f"{method}: the stream ended without metadata")
    return metadata


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
