"""``jigsawrl list``: the presets and policies a user can name in a config, as rich tables."""

from __future__ import annotations

from rich.table import Table

from jigsawrl.errors import ConfigError


def catalog_table(what: str) -> Table:
    """A table of ``accelerators``, ``models``, ``tasks`` or ``schedulers``.

    Raises:
        ConfigError: unknown category.
    """
    builders = {"accelerators": _accelerators, "models": _models, "tasks": _tasks,
                "schedulers": _schedulers}
    if what not in builders:
        raise ConfigError(f"cannot list {what!r}", where="jigsawrl list",
                          fix=f"use one of: {', '.join(builders)}")
    return builders[what]()


def _table(title: str, cols: list[str]) -> Table:
    t = Table(title=title)
    for c in cols:
        t.add_column(c)
    return t


def _accelerators() -> Table:
    from jigsawrl.workload.accelerators import ACCELERATORS

    t = _table("accelerators", ["name", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "host GB/s",
                                "SMs", "$/h", "source"])
    for a in ACCELERATORS.values():
        t.add_row(a.name, f"{a.peak_flops / 1e12:.0f}", f"{a.hbm_bytes / 1e9:.0f}",
                  f"{a.hbm_bytes_per_s / 1e12:.2f}", f"{a.host_link_bytes_per_s / 1e9:.0f}",
                  str(a.sm_count), f"{a.price_per_hour_usd:.2f}", a.source)
    return t


def _models() -> Table:
    from jigsawrl.workload.models import MODELS

    t = _table("simulator models", ["name", "params", "layers", "hidden", "heads", "kv heads",
                                    "KV KB/token", "source"])
    for m in MODELS.values():
        t.add_row(m.name, f"{m.num_params / 1e9:.2f}B", str(m.num_layers), str(m.hidden_size),
                  str(m.num_heads), str(m.num_kv_heads), f"{m.kv_bytes_per_token() / 1e3:.0f}",
                  m.source)
    try:
        from jigsawrl.engine.models import ENGINE_MODELS
    except ImportError:
        return t
    for name in ENGINE_MODELS:
        t.add_row(name, "(real engine)", "", "", "", "", "", "jigsawrl run: built in code")
    return t


def _tasks() -> Table:
    from jigsawrl.workload.task_presets import TASKS

    t = _table("simulator tasks", ["name", "prompt", "median response", "turns", "tool latency",
                                   "description"])
    for k in TASKS.values():
        tool = f"{k.tool_latency_median_s:.1f} s" if k.multi_turn else "-"
        t.add_row(k.name, f"{k.prompt_mean:.0f}", f"{k.response_median:.0f}",
                  f"≤{k.max_turns}", tool, k.description)
    try:
        from jigsawrl.tasks import list_tasks
    except ImportError:
        return t
    for name in list_tasks():
        t.add_row(name, "", "", "", "", "real task (jigsawrl run)")
    return t


SCHEDULER_SUMMARIES = {
    "jigsaw": "JigsawRL: sub-stage multiplexing, dynamic shares, tail migration, look-ahead",
    "greedy": "jigsaw without look-ahead (depth 0): the look-ahead ablation",
    "verl": "verl (HybridFlow): the best of verl-split, verl-serial, verl-sized, every "
            "verl-queue-k and, for async groups, its async recipes (the winner is named)",
    "verl-one-step-off": "verl's one-step-off async recipe: rollout on its own devices, one "
                         "version behind",
    "verl-fully-async": "verl's fully-async recipe: streaming rollout on its own devices within "
                        "the staleness bound",
    "verl-sized": "verl, each job on a slice sized to its predicted work (task priors)",
    "verl-queue": "verl, k jobs at a time on equal slices, the next taking a freed slice "
                  "(params.k; none: every k)",
    "verl-split": "verl, each pipeline a job on its own disjoint share of the devices",
    "verl-serial": "verl, the pipelines' jobs one after another on all devices",
    "rollmux": "RollMux: whole phases round-robin over a rollout pool and a training pool",
    "muxserve": "rollout-only multiplexing (MuxServe-style); training serialised",
    "streamrl": "StreamRL: disaggregated pools, one-step async, skew-aware dispatch",
    "areal": "AReaL: fully async, staleness-bounded admission, interruptible rollouts",
}


def _schedulers() -> Table:
    from jigsawrl.scheduler import list_policies

    t = _table("schedulers (scheduler.name)", ["name", "what it is"])
    for name in list_policies():
        t.add_row(name, SCHEDULER_SUMMARIES.get(name, "a user-registered policy"))
    return t
