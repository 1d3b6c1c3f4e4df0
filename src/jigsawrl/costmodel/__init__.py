"""Cost model: roofline times, FLOPs, memory and share slowdowns of RL sub-stages.

:class:`CostModel` is both the schedulers' deterministic belief model and, with ``noise_sigma >
0``, the simulator's seeded truth model. :class:`CostModelProtocol` is what the scheduler, graph,
simulator and driver call on one: type against it. Imports neither torch nor ray (numpy only).
"""

from jigsawrl.costmodel.deploy import Deployment, deployment_of
from jigsawrl.costmodel.model import CostModel
from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.costmodel.slowdown import SHARE_LEVELS

__all__ = ["SHARE_LEVELS", "CostModel", "CostModelProtocol", "CostParams", "Deployment",
           "deployment_of"]
