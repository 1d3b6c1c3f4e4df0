"""The engine on one device without Ray: two pipelines' rollout and GRPO step, timed.

What: builds the engines of two pipelines (two model presets, e.g. ``qwen2-1m`` and
``qwen2-10m``) on one device, then for each step and each pipeline runs the six sub-stages of
:class:`~jigsawrl.engine.pipeline.RealPipeline` (rollout, reward, old/ref log-probs, update,
weight sync), each timed between two ``torch.cuda.synchronize`` calls. It checks that every
model parameter and every batch tensor is on the device and that the update's numbers are finite,
prints a table, and writes the same as JSON (``--out``, default ``$OUT/gpu-check.json`` when
``OUT`` is set). Step 0 is the cold one (CUDA context, kernel selection); later steps are warm.

Why no Ray: the lent GPU machine's image has torch and transformers, not Ray; this runs with
what the engine imports (torch, transformers, tokenizers, safetensors, numpy, pyyaml and
pydantic: ``scripts/gpu-check.sh`` says how pydantic travels there). The modules it loaded are
listed in the JSON (``third_party_modules``), so a missing one is named before a session.

Run: ``scripts/gpu-check.sh`` (a CUDA device; exits 2 with a clear message when torch sees
none) or ``scripts/gpu-check.sh --device cpu`` (the same on the CPU: what the tests run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jigsawrl.stages import POST_ROLLOUT, Stage

STAGES: tuple[Stage, ...] = (Stage.ROLLOUT, *POST_ROLLOUT)  # the timed sub-stages, in order


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--models", default="qwen2-1m,qwen2-10m",
                    help="comma-separated presets, one pipeline each (default qwen2-1m,qwen2-10m)")
    ap.add_argument("--task", default="arithmetic", help="a registered task (default arithmetic)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per step (default 8)")
    ap.add_argument("--group-size", type=int, default=4, help="responses per prompt (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="response cap (default 32)")
    ap.add_argument("--steps", type=int, default=2, help="steps per pipeline (default 2)")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="supervised warm-start steps (default 0: off)")
    ap.add_argument("--kl-coef", type=float, default=0.1,
                    help="KL coefficient (default 0.1: the reference pass runs too)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None,
                    help="JSON file (default $OUT/gpu-check.json when OUT is set, else none)")
    return ap.parse_args(argv)


def _spec(name: str, model: str, args: argparse.Namespace) -> Any:
    from jigsawrl.config import PipelineSpec

    return PipelineSpec.model_validate({
        "name": name, "model": model, "task": args.task, "batch_size": args.batch_size,
        "group_size": args.group_size, "steps": args.steps,
        "max_response_tokens": args.max_new_tokens,
        "train": {"warmup_steps": args.warmup_steps, "threads": args.threads, "eval_size": 0,
                  "kl_coef": args.kl_coef, "device": args.device}})


def _timed(device: Any, fn: Callable[[], Any]) -> tuple[Any, float]:
    from jigsawrl.engine.device import synchronize

    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def _off_device(pipe: Any, batch: Any) -> list[str]:
    """Names of the tensors of ``pipe`` (models) and ``batch`` that are not on its device."""
    want = pipe.device
    bad = []
    models = {"actor": pipe.model, "engine": pipe.engine.model,
              "ref": getattr(pipe.trainer, "ref_model", None)}
    for label, model in models.items():
        if model is None:
            continue
        bad += [f"{label}.{n}" for n, p in model.named_parameters() if p.device != want]
    for field in ("input_ids", "attention_mask", "loss_mask", "advantages", "old_logprobs",
                  "ref_logprobs"):
        t = getattr(batch, field, None)
        if t is not None and t.device != want:
            bad.append(f"batch.{field}")
    return bad


def _third_party() -> list[str]:
    """Top-level non-stdlib packages loaded in this process (jigsawrl left out)."""
    names = {m.split(".")[0] for m in list(sys.modules)}
    std = set(getattr(sys, "stdlib_module_names", ()))
    return sorted(n for n in names if n not in std and not n.startswith("_") and n != "jigsawrl")


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """Build the pipelines, run their steps; the report (see the module docstring)."""
    import torch
    import transformers

    from jigsawrl.engine.device import resolve_device
    from jigsawrl.engine.models import count_params
    from jigsawrl.engine.pipeline import RealPipeline, StepData

    device = resolve_device(args.device, where="--device")
    torch.manual_seed(args.seed)
    report: dict[str, Any] = {
        "device": str(device), "device_name": _device_name(device),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "python": sys.version.split()[0],
        "args": vars(args), "pipelines": [], "rows": []}
    pipes = []
    for i, model in enumerate(m.strip() for m in args.models.split(",") if m.strip()):
        spec = _spec(f"p{i}-{model}", model, args)
        pipe = RealPipeline(spec, seed=args.seed + i, device=device)
        _, build_s = _timed(device, pipe.start)
        pipes.append(pipe)
        report["pipelines"].append({"name": spec.name, "model": model,
                                    "params_m": count_params(pipe.model) / 1e6,
                                    "build_s": build_s})
    problems: list[str] = []
    for step in range(args.steps):
        for pipe in pipes:
            times: dict[str, float] = {}
            data, gen_s = _timed(device, lambda p=pipe, s=step: p.rollout(s))
            assert isinstance(data, StepData)
            times[Stage.ROLLOUT.value] = gen_s
            methods = {Stage.REWARD: pipe.reward, Stage.OLD_LOGPROB: pipe.old_logprob,
                       Stage.REF_LOGPROB: pipe.ref_logprob, Stage.ACTOR_UPDATE: pipe.update}
            for stage, method in methods.items():
                _, times[stage.value] = _timed(device, lambda m=method, d=data: m(d))
            _, times[Stage.WEIGHT_SYNC.value] = _timed(device, pipe.weight_sync)
            tokens = sum(len(t.response_ids) for t in data.trajectories)
            row = {"pipeline": pipe.spec.name, "step": step, **times,
                   "step_s": sum(times.values()), "response_tokens": tokens,
                   "gen_tok_per_s": tokens / gen_s if gen_s > 0 else 0.0,
                   "reward_mean": float(data.rewards.mean()),
                   **{k: v for k, v in data.metrics.items() if k.startswith("actor/")}}
            report["rows"].append(row)
            bad = _off_device(pipe, data.batch)
            if bad:
                problems.append(f"{pipe.spec.name} step {step}: not on {device}: {bad[:5]}")
            nonfinite = [k for k, v in data.metrics.items() if not math.isfinite(v)]
            if nonfinite:
                problems.append(f"{pipe.spec.name} step {step}: non-finite {nonfinite}")
    if device.type == "cuda":
        report["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    report["problems"] = problems
    report["ok"] = not problems
    report["third_party_modules"] = _third_party()
    return report


def _device_name(device: Any) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def format_table(report: dict[str, Any]) -> str:
    """The report's rows as a fixed-width table (seconds per stage)."""
    cols = ("pipeline", "step", *(s.value for s in STAGES), "step_s", "response_tokens",
            "gen_tok_per_s")
    heads = ("pipeline", "step", *(s.value for s in STAGES), "step_s", "tokens", "gen_tok/s")
    width = max([len(h) for h in heads[:1]] + [len(r["pipeline"]) for r in report["rows"]])
    lines = ["  ".join(f"{h:<{width}}" if i == 0 else f"{h:>12}" for i, h in enumerate(heads))]
    for r in report["rows"]:
        cells = []
        for i, c in enumerate(cols):
            v = r[c]
            if i == 0:
                cells.append(f"{v:<{width}}")
            elif isinstance(v, float):
                cells.append(f"{v:>12.0f}" if c == "gen_tok_per_s" else f"{v:>12.3f}")
            else:
                cells.append(f"{v:>12}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jigsawrl.engine.gpucheck``; returns the exit status."""
    args = _parse(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"gpu-check: no CUDA device: torch {torch.__version__} (CUDA build: "
                  f"{torch.version.cuda or 'no'}) sees none. Run it on a GPU machine, or "
                  "pass --device cpu to run the same check on the CPU.", file=sys.stderr)
            return 2
    out = args.out or (str(Path(os.environ["OUT"]) / "gpu-check.json")
                       if os.environ.get("OUT") else None)
    report = run_check(args)
    print(f"gpu-check on {report['device']} ({report['device_name']}), torch {report['torch']}, "
          f"transformers {report['transformers']}")
    for p in report["pipelines"]:
        print(f"  {p['name']}: {p['params_m']:.2f}M params, built in {p['build_s']:.2f} s")
    print(format_table(report))
    if "max_memory_allocated_gb" in report:
        print(f"peak GPU memory allocated: {report['max_memory_allocated_gb']:.3f} GB")
    print(f"third-party modules loaded: {', '.join(report['third_party_modules'])}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {out}")
    for p in report["problems"]:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("gpu-check: OK" if report["ok"] else "gpu-check: FAILED")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
