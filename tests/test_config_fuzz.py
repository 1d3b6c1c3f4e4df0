"""Every config key answers bad input clearly: exit code 2, one message naming the key, no traceback.

The keys are derived from the pydantic schema (:func:`jigsawrl.config.iter_fields`), so a new field
is covered without editing this file. Each key — sections (``cluster``, ``pipelines.0.rollout``,
...) included — gets NaN, ±inf, a huge number, -1, a value of the wrong type and an empty string,
and each section an unknown key, written into a YAML file and given as a ``--set`` override:

- exhaustively through :func:`~jigsawrl.config.load_config` (milliseconds each);
- through the CLI (typer's ``CliRunner``) for ``simulate``, ``compare``, ``run``, ``run --ray``,
  ``bench real`` and ``bench paper``: hypothesis picks (command, way, key, value) with a capped
  number of examples, and a fixed sweep covers every command with both ways.

Numeric keys also get a range property: any value outside the documented range fails naming the
key, any value inside it validates. The heavy entry points (simulation, real runs, the paper
matrix) are replaced by tripwires, so an input that slipped through validation fails the test at
once instead of running.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from jigsawrl.cli.main import app
from jigsawrl.config import ExperimentConfig, field_range, iter_fields, load_config
from jigsawrl.errors import ConfigError

SIM = Path("configs/two-gsm8k.yaml")
REAL = Path("configs/real/bench.yaml")
PAPER = Path("configs/paper/sync-gsm8k-math.yaml")
UNKNOWN = "bogus_key"

# name -> value; "wrong type" depends on the key (a mapping for scalars, a list for sections).
BAD: dict[str, Any] = {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf, "huge": 10**30,
                       "negative": -1, "wrong type": None, "empty": ""}
SCALAR_WRONG: dict[str, Any] = {"not": ["a", "value"]}
MAPPING_WRONG: list[Any] = [1, 2]

FIELDS = list(iter_fields())
# Where unknown keys go: the top level and every section (a list of sections: its first one).
SECTIONS = [""] + [f"{path}.0" if getattr(info.annotation, "__origin__", None) is list else path
                   for path, info, sub in FIELDS if sub is not None]


def _takes_mapping(path: str) -> bool:
    """A section (not a list of them) or a free-form mapping such as ``scheduler.params``."""
    _, info, sub = next(f for f in FIELDS if f[0] == path)
    origin = getattr(info.annotation, "__origin__", None)
    return (sub is not None and origin is not list) or origin is dict


def bad_value(path: str, kind: str) -> Any:
    if kind != "wrong type":
        return BAD[kind]
    return MAPPING_WRONG if _takes_mapping(path) else SCALAR_WRONG


# (key that must be named, dotted path to set, value)
CASES: list[tuple[str, str, Any]] = [
    (path, path, bad_value(path, kind)) for path, _, _ in FIELDS for kind in BAD
] + [(f"{s}.{UNKNOWN}" if s else UNKNOWN, f"{s}.{UNKNOWN}" if s else UNKNOWN, 1)
     for s in SECTIONS]


def case_id(case: tuple[str, str, Any]) -> str:
    return f"{case[1]}={case[2]!r}"


# ---------------------------------------------------------------------------- helpers

def yaml_text(value: Any) -> str:
    """``value`` as the text of a ``--set key=value`` override (parsed back as YAML)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def set_path(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``raw`` with ``path`` (dotted, list indices as numbers) set to ``value``, in place."""
    *parents, last = path.split(".")
    node: Any = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return raw


def mutated_file(base: Path, path: str, value: Any, folder: Path) -> Path:
    raw = yaml.safe_load(base.read_text())
    out = folder / base.name
    out.write_text(yaml.safe_dump(set_path(raw, path, value), sort_keys=False))
    return out


def assert_clear_error(output: str, exit_code: int, key: str) -> None:
    assert exit_code == 2, output
    assert "Traceback" not in output, output
    assert output.count("error:") == 1, output  # one message ...
    assert key in output, output  # ... naming the key


# ---------------------------------------------------------------------------- library level

@pytest.mark.parametrize("base", [SIM, REAL], ids=["sim", "real"])
def test_every_key_and_bad_value_is_one_error_naming_the_key(base: Path) -> None:
    raw = yaml.safe_load(base.read_text())
    for key, path, value in CASES:
        for how in ("file", "--set"):
            with pytest.raises(ConfigError) as exc:
                if how == "file":
                    load_config(data=set_path(yaml.safe_load(yaml.safe_dump(raw)), path, value))
                else:
                    load_config(base, [f"{path}={yaml_text(value)}"])
            text = str(exc.value)
            assert key in text, (how, path, value, text)
            # one problem, one line (a wrong value in one key is not reported as several)
            assert text.count("\n  ") == 1, (how, path, value, text)


def test_schema_walk_covers_every_section_and_key() -> None:
    paths = {p for p, _, _ in FIELDS}
    assert {"cluster.num_nodes", "pipelines.0.batch_size", "pipelines.0.rollout.top_p",
            "pipelines.0.train.lr", "scheduler.name", "scheduler.params", "seed",
            "name"} <= paths
    assert set(SECTIONS) == {"", "cluster", "pipelines.0", "pipelines.0.rollout",
                             "pipelines.0.train", "pipelines.0.data",
                             "pipelines.0.custom_reward_function", "scheduler", "trainer"}
    assert len(CASES) == len(FIELDS) * len(BAD) + len(SECTIONS)


def _numeric() -> list[tuple[str, Any]]:
    return [(p, i) for p, i, _ in FIELDS if field_range(i)]


def test_every_numeric_key_documents_its_range() -> None:
    numeric = {p for p, i, _ in FIELDS
               if any(t in (int, float) for t in (i.annotation, *getattr(i.annotation,
                                                                        "__args__", ())))}
    assert numeric == {p for p, _ in _numeric()}
    for path, info in _numeric():
        assert info.description, f"{path} has no description"
        assert any(getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None
                   for m in info.metadata), f"{path} has no upper bound"


def _bounds(info: Any) -> tuple[float, bool, float]:
    lo = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
    gt = next((m.gt for m in info.metadata if getattr(m, "gt", None) is not None), None)
    hi = next(m.le for m in info.metadata if getattr(m, "le", None) is not None)
    return (gt if lo is None else lo), lo is None, hi


@st.composite
def range_case(draw: st.DrawFn) -> tuple[str, float, bool]:
    path, info = draw(st.sampled_from(_numeric()))
    lo, open_low, hi = _bounds(info)
    is_int = info.annotation in (int, int | None)
    inside = draw(st.booleans())
    if inside:
        low = lo + (1 if is_int else 1e-9) if open_low else lo
        v = (draw(st.integers(int(math.ceil(low)), int(hi))) if is_int else
             draw(st.floats(low, hi, allow_nan=False)))
    else:
        step = 1 if is_int else abs(hi) * 1e-6 + 1e-6
        above = draw(st.floats(hi + step, hi * 1e6 + 10, allow_nan=False))
        below = lo if open_low else lo - step
        below = draw(st.floats(below - 1e6, below, allow_nan=False))
        v = draw(st.sampled_from([above, below]))
        v = int(v) if is_int and float(v).is_integer() else v
    return path, v, inside


@settings(max_examples=150, deadline=None)
@given(range_case())
def test_numeric_ranges_are_the_documented_ones(case: tuple[str, float, bool]) -> None:
    path, value, inside = case
    raw = yaml.safe_load(SIM.read_text())
    if path.endswith("max_staleness"):
        set_path(raw, path.replace("max_staleness", "mode"), "async")
    set_path(raw, path, value)
    if inside:
        load_config(data=raw)
        return
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        load_config(data=raw)


# ---------------------------------------------------------------------------- the CLI

class Tripwire(AssertionError):
    pass


def _tripwire(*_a: Any, **_k: Any) -> Any:
    raise Tripwire("validation let a bad input through to the run")


@pytest.fixture(scope="module", autouse=True)
def no_heavy_runs() -> Iterator[None]:
    """An invalid input must fail before any of these runs; reaching one fails the test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("jigsawrl.experiments.simulated.simulate", _tripwire)
        mp.setattr("jigsawrl.experiments.compare.simulate", _tripwire)
        mp.setattr("jigsawrl.experiments.compare.solo_latencies", _tripwire)
        mp.setattr("jigsawrl.bench.paper.run_group", _tripwire)
        try:
            import jigsawrl.experiments.real  # noqa: F401
            import jigsawrl.experiments.sequential  # noqa: F401
        except ImportError:  # no engine extra: `run` is the stub that says how to install it
            pass
        else:
            mp.setattr("jigsawrl.experiments.real.run_real", _tripwire)
            mp.setattr("jigsawrl.experiments.sequential.run_experiment", _tripwire)
        yield


COMMANDS = ("simulate", "compare", "run", "run --ray", "bench real", "bench paper")
runner = CliRunner()


def _has_engine() -> bool:
    return any(c.name == "run" and c.callback.__module__ != "jigsawrl.cli.main"
               for c in app.registered_commands)


def invoke(command: str, how: str, path: str, value: Any, folder: Path) -> tuple[str, int]:
    """Run ``command`` with ``path`` set to ``value`` by a file (``how='file'``) or ``--set``."""
    folder.mkdir(parents=True, exist_ok=True)
    real = command.startswith("run") or command == "bench real"
    base = REAL if real else (PAPER if command == "bench paper" else SIM)
    if command == "bench paper" or how == "file":
        config, sets = mutated_file(base, path, value, folder), []
    else:
        config, sets = base, ["--set", f"{path}={yaml_text(value)}"]
    args = {
        "simulate": ["simulate", str(config), "--no-solo", "--no-timeline",
                     "--out", str(folder / "out")],
        "compare": ["compare", str(config), "--policies", "verl-split,jigsaw"],
        "run": ["run", str(config)],
        "run --ray": ["run", str(config), "--ray"],
        "bench real": ["bench", "real", "--config", str(config)],
        "bench paper": ["bench", "paper", "--matrix", str(folder), "--out", str(folder / "out")],
    }[command]
    res = runner.invoke(app, [*args, *sets])
    return res.output, res.exit_code


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=st.sampled_from(COMMANDS), how=st.sampled_from(("file", "--set")),
       case=st.sampled_from(CASES))
def test_cli_bad_input_is_exit_2_one_message_no_traceback(
        tmp_path_factory: pytest.TempPathFactory, command: str, how: str,
        case: tuple[str, str, Any]) -> None:
    if command in ("run", "run --ray", "bench real") and not _has_engine():
        command = "simulate"
    key, path, value = case
    folder = tmp_path_factory.mktemp("fuzz")
    output, code = invoke(command, how, path, value, folder)
    assert_clear_error(output, code, key)


# A fixed sweep: every command, both ways, a NaN in a pipeline field, a wrong type in a nested
# section, a huge seed and an unknown key of the cluster.
SWEEP = [("pipelines.0.length_drift_per_step", "pipelines.0.length_drift_per_step", math.nan),
         ("pipelines.0.rollout.max_num_seqs", "pipelines.0.rollout.max_num_seqs", -math.inf),
         ("seed", "seed", 10**30), ("cluster.bogus_key", "cluster.bogus_key", 1)]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("how", ["file", "--set"])
def test_cli_sweep_every_command(tmp_path: Path, command: str, how: str) -> None:
    if command in ("run", "run --ray", "bench real") and not _has_engine():
        pytest.skip("needs the engine extra")
    for i, (key, path, value) in enumerate(SWEEP):
        output, code = invoke(command, how, path, value, tmp_path / str(i))
        assert_clear_error(output, code, key)


def test_bench_paper_bad_matrix_file_names_it(tmp_path: Path) -> None:
    output, code = invoke("bench paper", "file", "pipelines.0.batch_size", math.nan, tmp_path)
    assert_clear_error(output, code, "pipelines.0.batch_size")
    assert "sync-gsm8k-math.yaml" in output.replace("\n", "")


def test_valid_configs_still_validate() -> None:
    for path in (SIM, REAL):
        assert isinstance(load_config(path), ExperimentConfig)
