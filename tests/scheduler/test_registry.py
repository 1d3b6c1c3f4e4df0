"""The policy registry: every registered policy (and each placement it runs) is a PolicyBase,
so the driver and experiments read ``wants_rank_progress`` and call ``variants()`` directly."""

from __future__ import annotations

import pytest

from jigsawrl.scheduler import get_policy, list_policies, register_policy
from jigsawrl.scheduler.base import PolicyBase


@pytest.mark.parametrize("name", list_policies())
def test_every_registered_policy_is_a_policy_base(name: str) -> None:
    policy = get_policy(name)
    assert isinstance(policy, PolicyBase)
    variants = list(policy.variants())
    assert variants and all(isinstance(v, PolicyBase) for v in variants)
    assert all(isinstance(v.wants_rank_progress, bool) and v.name for v in variants)


def test_registering_a_class_outside_policy_base_is_refused() -> None:
    class Loose:
        name = "loose"

        def decide(self, view):  # noqa: ANN001, ANN201
            raise AssertionError

    with pytest.raises(TypeError, match="PolicyBase"):
        register_policy("loose-test")(Loose)
    assert "loose-test" not in list_policies()
