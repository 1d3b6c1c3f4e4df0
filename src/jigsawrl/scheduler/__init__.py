"""Scheduling policies: the pure ``decide(view) -> Decision`` contract and its implementations.

Importing this package registers the built-in policies.
"""

from jigsawrl.scheduler import verl  # noqa: F401,E402  (registers verl-split / verl-serial)
from jigsawrl.scheduler.base import (  # noqa: F401
    Decision,
    Interrupt,
    Migrate,
    Policy,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    View,
    get_policy,
    list_policies,
    register_policy,
)
