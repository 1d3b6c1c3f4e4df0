#!/usr/bin/env bash
# Download into .whl/ the wheels scripts/gpu-check.sh needs on a GPU image that has torch and
# transformers but not pydantic (this workplace's 'cuda' image, Python 3.12, x86-64): pydantic,
# pydantic-core, annotated-types, typing-inspection and typing-extensions, at the versions of the
# interpreter that runs this script (the ones the tests ran with), about 2.5 MB. .whl/ is
# ignored through .git/info/exclude (never committed).
#
# Usage, from anywhere in the repo:  scripts/gpu-wheels.sh      (PYTHON=..., PYVER=3.12 to change)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYVER=${PYVER:-3.12}
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
pins=$("$PY" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("pydantic", "pydantic-core", "annotated-types",
                                           "typing-inspection", "typing-extensions")))')
echo "downloading $pins for Python $PYVER"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl $pins
ls -l .whl
