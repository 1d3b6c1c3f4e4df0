"""Scheduling policies: the pure ``decide(view) -> Decision`` contract and its implementations.

Importing this package registers the built-in policies.
"""

from jigsawrl.scheduler import (  # noqa: F401,E402  (importing registers the policies)
    areal,
    jigsaw,
    muxserve,
    rollmux,
    streamrl,
    verl,
    verl_async,
)
from jigsawrl.scheduler.base import (  # noqa: F401
    Decision,
    Interrupt,
    Migrate,
    Policy,
    Regroup,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    View,
    get_policy,
    list_policies,
    register_policy,
)
