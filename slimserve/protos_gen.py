"""Generate the Python gRPC stubs in ``slimserve/v1`` from ``protos/slimserve/v1/*.proto``.

Run ``python -m slimserve.protos_gen`` after editing a proto; ``tests/test_protos.py`` fails when the
committed stubs are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"


def proto_files() -> list[Path]:
    """All proto files of the public API."""
    return sorted((PROTO_DIR / "slimserve" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Generate stubs for every proto into ``out_dir`` (as package ``slimserve.v1``)."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTO_DIR)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "slimserve" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    generated = generate(ROOT)
    for path in generated:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
