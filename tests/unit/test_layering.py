"""Everything installed is imported as `ftsup.*`: no module, test or string names a bare top-level
`supervisor` (supervisord's import name), `agent`, `trainer`, `harness` or `bench`."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("common", "checkpoint", "supervisor", "agent", "trainer", "harness", "bench", "tests")
BARE = {"common", "checkpoint", "supervisor", "agent", "trainer", "harness", "bench"}


def python_files() -> list[pathlib.Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_module_imports_a_bare_top_level_package():
    offenders = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in BARE]
    assert not offenders, "\n".join(offenders)


def test_no_subprocess_runs_a_bare_module():
    """`python -m supervisor...` would run supervisord's package if one is installed beside ours."""
    offenders = []
    for path in python_files():
        tree = ast.parse(path.read_text())
        logger_names = {  # `logs.get("supervisor.runtime")` names a logger, not a module
            id(call.args[0]) for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get" and call.args
        }
        for node in ast.walk(tree):
            if id(node) in logger_names:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                top = node.value.split(".")[0]
                parts = node.value.split(".")
                if top in BARE and len(parts) > 1 and (ROOT / "/".join(parts[:-1]) / f"{parts[-1]}.py").exists():
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} names module {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_no_command_line_runs_a_bare_package():
    """`[python, "-m", "agent", ...]` only works from the checkout's root (its folder shadows): found
    in argument lists as the word after "-m"."""
    offenders = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.List, ast.Tuple)):
                continue
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for flag, module in zip(words, words[1:], strict=False):
                if flag == "-m" and isinstance(module, str) and module.split(".")[0] in BARE:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} runs `-m {module}`")
    assert not offenders, "\n".join(offenders)


def test_every_package_folder_is_installed_under_ftsup():
    """A package folder missing from pyproject's list would import from the checkout and not from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        "ftsup." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in BARE for init in (ROOT / folder).rglob("__init__.py")
    }
    assert on_disk - listed == set(), f"packages on disk but not installed: {sorted(on_disk - listed)}"


# Which ftsup packages each may import (besides itself and the generated `ftsup.v1` wire types).
# One way only: common <- checkpoint <- trainer; common <- supervisor, agent; harness and bench on top.
ALLOWED_IMPORTS = {
    "common": set(),
    "checkpoint": {"common"},
    "trainer": {"common", "checkpoint"},
    "supervisor": {"common", "checkpoint"},
    "agent": {"common"},
}


def ftsup_imports(path: pathlib.Path) -> set[tuple[int, str]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        )
        found |= {(node.lineno, n) for n in names if n.startswith("ftsup.")}
    return found


def test_package_dependencies_point_one_way():
    offenders = []
    for package, allowed in ALLOWED_IMPORTS.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in ftsup_imports(path):
                target = name.split(".")[1]
                if target not in {package, "v1", *allowed}:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} ({package}) imports {name}")
    assert not offenders, "\n".join(sorted(offenders))
