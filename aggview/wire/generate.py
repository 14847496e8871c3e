"""Regenerates the checked-in protobuf/gRPC modules from ``proto/``.

Run ``python -m aggview.wire.generate`` after editing a ``.proto``; a test fails when the
checked-in modules drift from the sources.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "proto" / "aggview" / "wire").glob("*.proto"))


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # only needed by developers, not at run time

    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in PROTOS],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(ROOT)
    sys.exit(0)
