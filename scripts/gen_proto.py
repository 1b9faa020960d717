"""Regenerates the Python code and .pyi stubs for proto/ftsup/v1/*.proto.

The generated files are committed so a node needs no protoc; tests/unit/test_proto_fresh.py
regenerates into a temporary folder and fails when the committed files differ.
Usage: python scripts/gen_proto.py [OUT_DIR]   (OUT_DIR defaults to proto/)
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def sources() -> list[pathlib.Path]:
    return sorted((PROTO_ROOT / "ftsup" / "v1").glob("*.proto"))


def generate(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    bin_dir = pathlib.Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in sources()],
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
