"""The committed generated code matches proto/ftsup/v1/*.proto (run `make proto` when this fails)."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_proto  # noqa: E402


def test_generated_code_is_up_to_date(tmp_path: pathlib.Path) -> None:
    gen_proto.generate(tmp_path)
    committed_dir = ROOT / "proto" / "ftsup" / "v1"
    fresh = {p.relative_to(tmp_path / "ftsup" / "v1"): p.read_bytes() for p in (tmp_path / "ftsup" / "v1").iterdir()}
    assert fresh, "protoc generated nothing"
    stale = [str(name) for name, data in fresh.items() if (committed_dir / name).read_bytes() != data]
    assert not stale, f"stale generated files {stale}: run `make proto` and commit"
