"""Regenerate the protobuf/gRPC modules from ``sharefl.proto`` (needs ``grpcio-tools``).

Run from anywhere: ``python -m sharefl.proto.generate [OUT_DIR]``. The generated modules
are committed; ``tests/test_wire.py`` regenerates them into a temporary folder and checks
that they are identical, so the .proto and the code never drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO = "sharefl/proto/sharefl.proto"
ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("sharefl_pb2.py", "sharefl_pb2.pyi", "sharefl_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Write the generated modules for ``sharefl/proto/sharefl.proto`` under ``out_dir``
    (as ``out_dir/sharefl/proto/...``); raises RuntimeError if protoc fails."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    out_dir.mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(ROOT / PROTO),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
