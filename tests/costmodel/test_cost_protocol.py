"""The cost-model protocol: the concrete model and the tests' toy model both satisfy it."""

from __future__ import annotations

import inspect

from jigsawrl.costmodel import CostModel, CostModelProtocol
from jigsawrl.workload.accelerators import ACCELERATORS

MEMBERS = sorted(n for n in vars(CostModelProtocol) if not n.startswith("_"))


def test_protocol_lists_what_callers_use() -> None:
    for name in ("prefill_time_s", "decode_span_time_s", "slowdown", "kv_budget_tokens",
                 "activation_bytes", "dispatch_time_s", "pass_tokens", "params", "accel"):
        assert name in MEMBERS


def test_cost_model_satisfies_protocol() -> None:
    cm = CostModel(ACCELERATORS["h100-80gb"])
    assert isinstance(cm, CostModelProtocol)
    for name in MEMBERS:
        want = getattr(CostModelProtocol, name)
        if not callable(want):
            continue
        got = inspect.signature(getattr(CostModel, name))
        # every parameter the protocol names is accepted by the concrete model, same kind
        for p in inspect.signature(want).parameters.values():
            assert p.name in got.parameters, f"CostModel.{name} lacks {p.name}"
            assert got.parameters[p.name].kind == p.kind, f"CostModel.{name}({p.name})"


def test_fake_cost_satisfies_protocol(fake_cost) -> None:  # noqa: ANN001
    missing = [name for name in MEMBERS if not hasattr(fake_cost, name)]
    assert not missing, f"FakeCost lacks {missing}"
    assert isinstance(fake_cost, CostModelProtocol)
