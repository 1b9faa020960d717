"""The functional core imports only the standard library's pure modules and other core modules."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORES = ["supervisor/core", "agent/core", "trainer/core"]
ALLOWED_STDLIB = {
    "__future__", "dataclasses", "enum", "typing", "math", "statistics", "collections", "collections.abc",
    "types", "functools", "itertools", "operator", "re", "random", "hashlib", "struct", "bisect", "heapq", "string",
    # numpy: the per-step detectors work on arrays of 100,000 ranks (issue 14); it does no I/O.
    "numpy", "numpy.typing",
}
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("datetime", "now")}
# Rules that must be one rule on both sides of a layer (the agent's flags, the server and the core),
# so they live in common/ and a core may import them; each is held to the core's own purity here.
PURE_SHARED = {"ftsup.common.node_id": "common/node_id.py", "ftsup.common.checkpoint_ids": "common/checkpoint_ids.py"}


def core_files() -> list[pathlib.Path]:
    return [p for core in CORES for p in sorted((ROOT / core).rglob("*.py"))]


def checked_files() -> list[pathlib.Path]:
    """The cores and the shared modules they may import: all held to the same rules."""
    return core_files() + [ROOT / path for path in PURE_SHARED.values()]


def imported_modules(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_modules_import_only_pure_stdlib_and_core():
    assert core_files(), "no core modules found"
    offenders = []
    for path in checked_files():
        package = path.relative_to(ROOT).parts[0]
        for name in imported_modules(path):
            if name in ALLOWED_STDLIB or name in PURE_SHARED or name.startswith(f"ftsup.{package}.core"):
                continue
            offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_core_never_reads_the_clock():
    offenders = []
    for path in checked_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and (node.value.id, node.attr) in FORBIDDEN_CALLS):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not offenders, "\n".join(offenders)
