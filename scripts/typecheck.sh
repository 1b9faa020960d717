#!/usr/bin/env bash
# mypy over the installed layout: the repository's folders are imported as ftsup.<folder> (a
# package-dir mapping mypy cannot follow), so a tree of links under build/typecheck/ftsup stands in.
set -euo pipefail
cd "$(dirname "$0")/.."
root=build/typecheck/ftsup
mkdir -p "$root"
for folder in common checkpoint supervisor agent trainer harness bench; do
  ln -sfn "../../../$folder" "$root/$folder"
done
ln -sfn ../../../proto/ftsup/v1 "$root/v1"
ln -sfn ../../../proto/ftsup/__init__.py "$root/__init__.py"
MYPYPATH=build/typecheck exec "${PYTHON:-.venv/bin/python}" -m mypy -p ftsup "$@"
