"""Every bound of the supervisor's core lives in core/limits.py, each with the reason it is where it
is: a bound defined elsewhere, or one without its why, fails here."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
CORE = ROOT / "supervisor" / "core"
LIMITS = CORE / "limits.py"
BOUND_PREFIXES = ("MAX_", "MIN_", "KEEP_", "XID_HISTORY")


def _module_constants(path: pathlib.Path) -> list[tuple[str, int, ast.expr]]:
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.append((node.targets[0].id, node.lineno, node.value))
    return found


def test_every_limit_says_why_on_its_line_or_just_above():
    lines = LIMITS.read_text().splitlines()
    missing = [name for name, line_no, _ in _module_constants(LIMITS)
               if "#" not in lines[line_no - 1] and not lines[line_no - 2].lstrip().startswith("#")]
    assert _module_constants(LIMITS), "no limits found"
    assert not missing, f"limits without a reason: {missing}"


def test_no_core_module_defines_a_bound_of_its_own():
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path == LIMITS:
            continue
        for name, line_no, value in _module_constants(path):
            is_alias = isinstance(value, ast.Name)  # a module's name for a limit, e.g. KEEP_COSTS = KEEP_...
            if name.startswith(BOUND_PREFIXES) and not is_alias:
                offenders.append(f"{path.relative_to(ROOT)}:{line_no} {name}")
    assert not offenders, "bounds belong in supervisor/core/limits.py:\n" + "\n".join(offenders)
