#!/usr/bin/env bash
# The engine on one GPU without Ray: two pipelines' rollout and GRPO step, each stage timed
# (src/jigsawrl/engine/gpucheck.py). Prints a table; writes $OUT/gpu-check.json when OUT is set.
#
# Usage, from anywhere in the repo:
#   scripts/gpu-check.sh                      # CUDA (exits 2 with a message when torch sees none)
#   scripts/gpu-check.sh --device cpu         # the same check on the CPU
#   scripts/gpu-check.sh --models qwen2-1m,qwen2-50m --batch-size 16 --steps 3
#   PYTHON=.venv/bin/python scripts/gpu-check.sh --device cpu   # a given interpreter
#
# Needs torch, transformers, tokenizers, safetensors, numpy, pyyaml and pydantic; no Ray. A GPU
# image without pydantic (this workplace's: README.md "GPU") takes it as wheels in .whl/
# (made by scripts/gpu-wheels.sh), installed here into /tmp/jigsawrl-site when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NEEDED="torch transformers tokenizers safetensors numpy yaml pydantic"

missing() {
  "$PY" -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' $NEEDED
}

gone=$(missing)
if [ -n "$gone" ] && compgen -G ".whl/*.whl" >/dev/null; then
  echo "gpu-check: installing .whl/ into /tmp/jigsawrl-site (missing: $gone)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/jigsawrl-site .whl/*.whl ||
    echo "gpu-check: .whl/ does not install on $PY (wheels for another Python? see" \
         "scripts/gpu-wheels.sh, PYVER=...)" >&2
  export PYTHONPATH="/tmp/jigsawrl-site${PYTHONPATH:+:$PYTHONPATH}"
  gone=$(missing)
fi
if [ -n "$gone" ]; then
  echo "gpu-check: $PY lacks: $gone" >&2
  echo "  fix: pip install them, or run scripts/gpu-wheels.sh where pip reaches an index and" \
       "bring .whl/ along (the device tool: carry [\".whl\"])" >&2
  exit 2
fi

export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" -m jigsawrl.engine.gpucheck "$@"
