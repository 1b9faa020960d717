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


def core_files() -> list[pathlib.Path]:
    return [p for core in CORES for p in sorted((ROOT / core).rglob("*.py"))]


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
    for path in core_files():
        package = path.relative_to(ROOT).parts[0]
        for name in imported_modules(path):
            if name in ALLOWED_STDLIB or name.startswith(f"ftsup.{package}.core"):
                continue
            offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_core_never_reads_the_clock():
    offenders = []
    for path in core_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and (node.value.id, node.attr) in FORBIDDEN_CALLS):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not offenders, "\n".join(offenders)
