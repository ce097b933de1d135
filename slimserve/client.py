"""A small client for the ScoringService: the ``slimserve score`` command and the demo of ``up``."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from .channel import ClientSecurity, open_channel
from .errors import UserError
from .examples import EXAMPLE_MEMBER, example_candidates
from .schema import Item, Member, SchemaError, item_from_dict, member_from_dict


def load_score_input(path: Path | None, example_count: int = 10) -> tuple[Member, list[Item]]:
    """Member and candidates from a JSON file ``{"member": {...}, "candidates": [...]}`` or the example."""
    if path is None:
        return EXAMPLE_MEMBER, example_candidates(example_count)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or "member" not in data or "candidates" not in data:
        raise UserError(f"{path}: expected an object with 'member' and 'candidates'")
    if not isinstance(data["candidates"], list):
        raise UserError(f"{path}: candidates: expected a list")
    try:
        member = member_from_dict(data["member"])
        items = [item_from_dict(c, f"candidates[{i}]") for i, c in enumerate(data["candidates"])]
    except SchemaError as exc:
        raise UserError(f"{path}: {exc}") from exc
    return member, items


def build_request(member: Member, candidates: list[Item], top_k: int = 0, request_id: str = ""):
    """A ``ScoreRequest`` protobuf for plain inputs (``top_k`` 0: all candidates)."""
    from .client_convert import item_to_proto, member_to_proto
    from .v1 import scoring_pb2

    return scoring_pb2.ScoreRequest(
        member=member_to_proto(member),
        candidates=[item_to_proto(c) for c in candidates],
        top_k=top_k or len(candidates),
        request_id=request_id,
    )


def score_once(
    target: str,
    member: Member,
    candidates: list[Item],
    top_k: int = 0,
    timeout_s: float = 30.0,
    security: ClientSecurity | None = None,
):
    """Call ``Score`` once on ``target`` (host:port); returns the ``ScoreResponse``."""
    from .v1 import scoring_pb2_grpc

    with open_channel(target, security) as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        try:
            return stub.Score(build_request(member, candidates, top_k), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise UserError(f"Score failed: {exc.code().name}: {exc.details()}") from None


def format_ranking(response, candidates: list[Item]) -> str:
    """A ranked table (rank, score, id, title, company) and the response metadata, as text."""
    by_id = {c.id: c for c in candidates}
    lines = [f"{'rank':>4}  {'score':>8}  {'item':<10}  title"]
    for scored in response.items:
        item = by_id.get(scored.item_id)
        title = f"{item.title} @ {item.company}" if item else ""
        lines.append(f"{scored.rank:>4}  {scored.score:>8.3f}  {scored.item_id:<10}  {title}")
    meta = response.metadata
    lines.append(
        f"model {meta.model_name} v{meta.model_version} (bundle {meta.bundle_hash[:12]}), "
        f"request {meta.request_id}: total {meta.total_ms:.1f} ms, "
        f"Triton queue {meta.queue_ms:.1f} ms, inference {meta.inference_ms:.1f} ms"
    )
    return "\n".join(lines)


def print_ranking(response, candidates: list[Item], as_json: bool = False) -> None:
    """Print a ScoreResponse as a table or as JSON."""
    if as_json:
        from google.protobuf.json_format import MessageToJson

        print(MessageToJson(response, preserving_proto_field_name=True))  # noqa: T201
    else:
        print(format_ranking(response, candidates))  # noqa: T201
