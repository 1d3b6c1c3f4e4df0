"""The numpy wire format for torch tensors: exact round trips, owned writable results, and the
same through Ray's object store between a driver and an actor that both registered it."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from jigsawrl.executors.raycluster.placement import start_local  # noqa: E402
from jigsawrl.executors.raycluster.wire import (  # noqa: E402
    tensor_from_wire,
    tensor_to_wire,
    use_numpy_wire,
)

CASES = {
    "float32": lambda: torch.randn(3, 5),
    "bfloat16": lambda: torch.randn(4, 2).to(torch.bfloat16),
    "float16": lambda: torch.randn(7).half(),
    "int64": lambda: torch.arange(-5, 5),
    "bool": lambda: torch.tensor([True, False, True]),
    "scalar": lambda: torch.tensor(2.5),
    "empty": lambda: torch.zeros(0, 3),
    "non_contiguous": lambda: torch.randn(4, 6).t()[1:, ::2],
    "sparse": lambda: torch.eye(3).to_sparse(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_is_exact(name: str) -> None:
    t = CASES[name]()
    back = tensor_from_wire(tensor_to_wire(t))
    assert back.dtype == t.dtype and back.shape == t.shape and back.layout == t.layout
    if t.layout == torch.strided:
        assert torch.equal(back, t)
    else:
        assert torch.equal(back.to_dense(), t.to_dense())


def test_requires_grad_survives_and_result_is_writable_and_owned() -> None:
    leaf = torch.randn(3, requires_grad=True)
    back = tensor_from_wire(tensor_to_wire(leaf))
    assert back.requires_grad and back.is_leaf
    plain = torch.ones(4)
    wire = tensor_to_wire(plain)
    back = tensor_from_wire(wire)
    back.add_(1.0)  # writable, and not a view of the sender's or the wire's memory
    assert torch.equal(plain, torch.ones(4)) and torch.equal(torch.from_numpy(wire[1]),
                                                              torch.ones(4))


@ray.remote
class _Echo:
    def __init__(self) -> None:
        use_numpy_wire()

    def state(self) -> dict[str, Any]:
        torch.manual_seed(0)
        return {"w": torch.randn(64, 64), "b": torch.zeros(64, dtype=torch.bfloat16)}

    def add_one(self, tensors: dict[str, Any]) -> dict[str, Any]:
        return {k: v + 1 for k, v in tensors.items()}


@pytest.fixture(scope="module")
def local_ray() -> Any:
    started = not ray.is_initialized()
    if started:
        start_local(1)
    use_numpy_wire()
    yield
    if started:
        ray.shutdown()


def test_tensors_cross_ray_both_ways(local_ray: Any) -> None:
    echo = _Echo.remote()
    got = ray.get(echo.state.remote())
    torch.manual_seed(0)
    assert torch.equal(got["w"], torch.randn(64, 64))
    assert got["b"].dtype == torch.bfloat16
    got["w"].mul_(2.0)  # received tensors are writable
    back = ray.get(echo.add_one.remote(ray.put(got)))
    assert torch.equal(back["w"], got["w"] + 1) and torch.equal(back["b"], got["b"] + 1)
