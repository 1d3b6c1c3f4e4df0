"""The Ray executor (DESIGN.md §3): real pipelines on per-device Ray workers, driven by the same
scheduler as the simulator.

The only package of jigsawrl that imports ``ray`` (install the ``ray`` extra). Start with
:class:`~jigsawrl.executors.raycluster.executor.RayExecutor`; ``jigsawrl.experiments.real`` wires a
config to it.
"""

from jigsawrl.executors.raycluster.executor import RayExecutor, rollout_band

__all__ = ["RayExecutor", "rollout_band"]
