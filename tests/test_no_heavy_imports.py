"""The simulator and schedulers import and run without torch or ray (DESIGN.md §4)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules['torch'] = None  # any `import torch` now raises ImportError
sys.modules['ray'] = None
sys.modules['transformers'] = None
from jigsawrl.config import load_config
from jigsawrl.experiments.simulated import simulate
from jigsawrl.experiments.compare import compare_policies
from jigsawrl.cli.main import app
cfg = load_config('configs/two-gsm8k.yaml', ['pipelines.0.steps=1', 'pipelines.1.steps=1',
                  'pipelines.0.batch_size=4', 'pipelines.1.batch_size=4'])
run = simulate(cfg, solo=False)
assert run.summary['throughput_tokens_per_s'] > 0
assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]
print('ok')
"""


def test_simulator_runs_without_torch_and_ray() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
