"""Device placement of the engine: resolution of ``train.device``, tensor moves, the CPU path
through the device code, and the GPU check script on the CPU (the GPU path itself is untested
until a GPU machine is lent: README.md "GPU")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.engine import gpucheck  # noqa: E402
from jigsawrl.engine.checkpoint import capture_rng, restore_rng  # noqa: E402
from jigsawrl.engine.device import resolve_device, to_device, to_host  # noqa: E402
from jigsawrl.engine.kvcache import SlotKVCache, build_layout  # noqa: E402
from jigsawrl.engine.pipeline import RealPipeline  # noqa: E402
from jigsawrl.engine.trainer import TrainBatch  # noqa: E402
from jigsawrl.errors import ConfigError  # noqa: E402

torch.set_num_threads(1)


def _cuda(monkeypatch: pytest.MonkeyPatch, available: bool, count: int = 1) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if available else 0)


# --------------------------------------------------------------------------- resolution


def test_auto_is_cuda_only_when_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, False)
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    _cuda(monkeypatch, True)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device(" CUDA ") == torch.device("cuda", 0)


def test_explicit_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, True, count=2)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ConfigError, match="sees 2 CUDA device") as err:
        resolve_device("cuda:2")
    assert err.value.fix and "cuda:0..cuda:1" in err.value.fix


def test_cuda_without_a_gpu_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, False)
    with pytest.raises(ConfigError, match="sees no CUDA device") as err:
        resolve_device("cuda", where="pipelines[p].train.device")
    assert err.value.where == "pipelines[p].train.device"
    assert err.value.fix and "'cpu'" in err.value.fix
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        resolve_device("tpu")


def test_under_ray_auto_follows_the_assigned_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, True)  # a GPU node: a worker Ray gave no GPU stays on the CPU
    assert resolve_device("auto", gpus_assigned=False) == torch.device("cpu")
    assert resolve_device("auto", gpus_assigned=True) == torch.device("cuda", 0)
    assert resolve_device("cpu", gpus_assigned=True) == torch.device("cpu")
    _cuda(monkeypatch, False)  # Ray assigned a GPU that this torch cannot use
    with pytest.raises(ConfigError, match="sees no CUDA") as err:
        resolve_device("auto", gpus_assigned=True)
    assert "Ray assigned this worker a GPU" in str(err.value.where)


def test_config_knob_defaults_to_auto_and_is_validated() -> None:
    base = {"name": "t", "model": "qwen2-1m", "task": "arithmetic"}
    assert PipelineSpec.model_validate(base).train.device == "auto"
    for ok in ("cpu", "cuda", "cuda:3"):
        assert PipelineSpec.model_validate({**base, "train": {"device": ok}}).train.device == ok
    for bad in ("gpu", "cuda:", "cuda:x", ""):
        with pytest.raises(ValueError):
            PipelineSpec.model_validate({**base, "train": {"device": bad}})


# --------------------------------------------------------------------------- moves


def test_to_device_and_to_host_walk_containers_and_batches() -> None:
    t = torch.arange(4)
    batch = TrainBatch(t[None], torch.ones(1, 4), torch.ones(1, 3), torch.zeros(1))
    assert to_device(batch, "cpu") is batch and batch.input_ids is not None
    assert batch.input_ids.data_ptr() == t.data_ptr()  # CPU to CPU: nothing copied
    nested = {"a": [t, (t, 1)], "b": None}
    assert to_device(nested, torch.device("cpu")) is nested  # unchanged: the same objects
    host = to_host(nested, copy=True)
    assert host["a"][0].data_ptr() != t.data_ptr() and torch.equal(host["a"][1][0], t)
    model = torch.nn.Linear(2, 2)
    sd = to_host(model.state_dict())
    assert sd._metadata == model.state_dict()._metadata  # module versions kept for loading
    model.load_state_dict(sd)


def test_layout_tensors_are_made_on_the_cache_device() -> None:
    """On the shape-only ``meta`` device any tensor made on the CPU and mixed in would fail."""
    meta = torch.device("meta")
    for segments in ([[5], [6]], [[1, 2, 3], [4]]):
        for mask_dtype in (None, torch.float32):
            lay = build_layout([0, 1], [3, 0], segments, 64, mask_dtype, meta)
            for name in ("input_ids", "position_ids", "attention_mask", "slots", "write_pos"):
                assert getattr(lay, name).device == meta, name
    cache = SlotKVCache(meta, torch.float32, 128)
    cache.reserve(2, 8)
    cache.begin(build_layout([0, 1], [0, 0], [[1, 2], [3, 4]], cache.trash_pos, None, meta))
    k, v = cache.update(torch.zeros(2, 2, 2, 4, device=meta), torch.zeros(2, 2, 2, 4, device=meta),
                        0)
    cache.end()
    assert k.device == v.device == meta and tuple(k.shape) == (2, 2, 2, 4)


def test_rng_capture_without_cuda_is_unchanged() -> None:
    state = capture_rng()
    assert set(state) == {"python", "numpy", "torch"}  # CUDA's only once CUDA was used
    restore_rng({**state, "cuda": [torch.zeros(8, dtype=torch.uint8)] * 3})  # no GPU: ignored


# --------------------------------------------------------------------------- the CPU path


def _spec(device: str) -> PipelineSpec:
    return PipelineSpec.model_validate({
        "name": "t", "model": "qwen2-1m", "task": "arithmetic", "batch_size": 2,
        "group_size": 2, "steps": 1, "max_response_tokens": 12,
        "train": {"warmup_steps": 2, "threads": 1, "eval_size": 2, "kl_coef": 0.1,
                  "device": device}})


def test_a_step_on_the_explicit_cpu_device_matches_auto(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``device: cpu`` runs rollout + GRPO step through the device code, everything on the
    CPU, and gives what the default (``auto`` on this machine) gives."""
    _cuda(monkeypatch, False)
    results = []
    for device in ("cpu", "auto"):
        pipe = RealPipeline(_spec(device), seed=0, cache_dir=tmp_path / "cache")
        pipe.start()
        assert pipe.device == torch.device("cpu")
        data = pipe.rollout(0)
        for stage in (pipe.reward, pipe.old_logprob, pipe.ref_logprob, pipe.update):
            stage(data)
        pipe.weight_sync()
        b = data.batch
        assert b is not None and b.old_logprobs is not None and b.ref_logprobs is not None
        assert {t.device.type for t in (b.input_ids, b.loss_mask, b.old_logprobs,
                                        b.ref_logprobs)} == {"cpu"}
        assert {p.device.type for p in pipe.model.parameters()} == {"cpu"}
        weights = pipe.actor_weights()
        name, w = next(iter(weights.items()))
        assert w.data_ptr() != pipe.model.state_dict()[name].data_ptr()  # a host copy
        results.append(([t.response_ids for t in data.trajectories], data.metrics,
                        {k: v.clone() for k, v in weights.items()}))
        state = pipe.export_train_state()
        pipe.import_train_state(state)  # an offload and onload, on the CPU
        assert pipe.has_trainer
    (ids_a, m_a, w_a), (ids_b, m_b, w_b) = results
    assert ids_a == ids_b and m_a == m_b
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


# --------------------------------------------------------------------------- the check script


def test_gpu_check_runs_on_the_cpu_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    rc = gpucheck.main(["--device", "cpu", "--models", "qwen2-1m,llama-1m", "--batch-size", "2",
                        "--group-size", "2", "--max-new-tokens", "8", "--steps", "1",
                        "--threads", "1", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["device"] == "cpu" and not report["problems"]
    assert [r["pipeline"] for r in report["rows"]] == ["p0-qwen2-1m", "p1-llama-1m"]
    for row in report["rows"]:
        assert all(row[s.value] >= 0 for s in gpucheck.STAGES) and row["response_tokens"] > 0
    assert {"torch", "transformers", "pydantic"} <= set(report["third_party_modules"])
    assert "rollout" in gpucheck.format_table(report)


def test_gpu_check_without_cuda_exits_2(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _cuda(monkeypatch, False)
    assert gpucheck.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
