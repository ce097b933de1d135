"""The committed gRPC stubs are exactly what the protos generate (regenerate: ``make protos``)."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from slimserve.protos_gen import ROOT, generate, proto_files
from slimserve.v1 import common_pb2, reasoning_pb2, scoring_pb2


def test_committed_stubs_are_not_stale(tmp_path: Path):
    generated = generate(tmp_path)
    assert generated, "protoc produced nothing"
    for fresh in generated:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.is_file(), f"{committed} is missing: run `make protos`"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run `make protos`"


def test_api_conventions():
    assert [p.name for p in proto_files()] == ["common.proto", "reasoning.proto", "scoring.proto"]
    for module in (common_pb2, reasoning_pb2, scoring_pb2):
        file = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file)
        assert file.package == "slimserve.v1"
        for enum in file.enum_type:
            zero = enum.value[0]
            assert zero.number == 0 and zero.name.endswith("_UNSPECIFIED"), enum.name
    methods = scoring_pb2.DESCRIPTOR.services_by_name["ScoringService"].methods_by_name
    assert not methods["Score"].client_streaming and not methods["Score"].server_streaming
    assert methods["ScoreStream"].client_streaming and methods["ScoreStream"].server_streaming
    reasoning = reasoning_pb2.DESCRIPTOR.services_by_name["ReasoningService"].methods_by_name
    for name in ("Explain", "Generate"):
        assert not reasoning[name].client_streaming and reasoning[name].server_streaming, name
        assert reasoning[name].output_type.name == "TextChunk"
