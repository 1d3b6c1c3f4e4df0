"""The task contract of the real CPU engine: examples, tool results, the Task protocol, a registry.

A *task* bundles what an RL pipeline needs besides the model: a deterministic dataset generator, a
prompt/response format, a rule-based reward with verl's signature
``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``, and for
multi-turn tasks a tool that the rollout engine calls whenever a turn ends with one of the task's
``stop`` strings. The rollout engine and GRPO trainer (``engine/``) depend only on this module.

Text conventions (the models are tiny character-level LMs, one token per character):

- prompts end with ``"\\n"``; a response is a single line, so a newline (or the tokenizer's EOS)
  ends it; scorers read only up to the first newline;
- only printable ASCII (32..126) and ``"\\n"``; short texts (see each task's docstring);
- ``Example.demo`` is a correct full response, tool results included exactly as the tool would
  insert them, used for the supervised warm start.

Robustness (the run must never crash on model output): :func:`safe_score` turns a reward that
raises or returns a non-number into ``0.0`` with the reason logged; ``call_tool`` never raises and
answers garbage with an error result (``ok=False``). The built-in tools meet that by caps on what
they read (call and query length, query terms, expression tokens, depth, digits and bits; see
each task), checked before the work they bound grows, never by timeouts; :func:`tool_guard`
wraps their ``call_tool`` as a last line of defence, and :func:`safe_call_tool` gives any task,
a user's included, the same guarantee.

Extending: write one module with a class that satisfies :class:`Task` (subclassing
:class:`BaseTask` gives the boilerplate) and decorate it with ``@register_task("name")``; configs
can then name it as ``"name"`` once the module is imported, or as ``"my.module:name"``, which
imports the module first.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import logging
import math
import numbers
import random
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from jigsawrl.errors import ConfigError

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
MAX_MISSES = 300  # draws in a row without a new prompt after which a split counts as exhausted
RESPONSE_END = "\n"


@dataclass(frozen=True)
class Example:
    """One prompt with what is needed to score a response to it and a correct demo response.

    ``ground_truth`` is a string for the built-in tasks and any JSON value from a data file
    (``tasks/dataset.py``); ``demo`` is ``""`` when there is none. ``messages`` holds the chat
    messages a data file's prompt was given as (None otherwise): ``prompt`` is then their plain
    rendering, and the engine re-renders them with the tokenizer's chat template if it has one.
    """

    prompt: str
    ground_truth: Any
    data_source: str
    extra_info: dict
    demo: str
    messages: tuple[dict[str, str], ...] | None = None


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns: ``text`` is inserted verbatim after the call."""

    text: str
    ok: bool
    latency_s: float = 0.0  # simulated latency; the caller sleeps/awaits it


@runtime_checkable
class Task(Protocol):
    """What the rollout engine and trainer need from a task.

    ``max_response_chars`` bounds the whole response of one prompt, tool results included (for the
    character tokenizer this is ``max_new_tokens``). ``max_turns`` counts assistant turns; a turn
    that ends with a string of ``stop`` is a tool call, any other end finishes the response.
    """

    name: str
    multi_turn: bool
    max_turns: int
    stop: tuple[str, ...]
    max_response_chars: int

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]: ...

    def compute_score(self, data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> float | dict: ...

    def call_tool(self, call_text: str, state: dict) -> ToolResult: ...


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_task(name: str) -> Callable[[T], T]:
    """Class decorator: register a task class under ``name`` (and set its ``name`` attribute).

    Raises:
        ConfigError: ``name`` is already taken by a different class.
    """
    def deco(cls: T) -> T:
        old = _REGISTRY.get(name)
        if old is not None and _qualname(old) != _qualname(cls):
            raise ConfigError(f"task name {name!r} is already registered by {_qualname(old)}",
                              where=f"register_task({name!r})", fix="choose another name")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls
    return deco


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def list_tasks() -> list[str]:
    """Names of the registered tasks, sorted."""
    return sorted(_REGISTRY)


def get_task(name: str, **params: Any) -> Task:
    """Build the task registered as ``name`` with constructor ``params``.

    ``name`` may be ``"module.path:task"``: the module is imported first (it registers its tasks).

    Raises:
        ConfigError: unknown task (names the known ones), unimportable module, or bad params.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"no task named (got {name!r})", where="task",
                          fix=f"name one of: {', '.join(list_tasks())}")
    if ":" in name:
        module, _, name = name.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"cannot import task module {module!r}: {exc}",
                              where="task", fix="check the module path") from exc
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}",
                          where="task", fix="use one of the known names or register yours")
    sig = inspect.signature(cls).parameters.values()
    accepted = [p.name for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    open_ended = any(p.kind == p.VAR_KEYWORD for p in sig)
    unknown = sorted(set(params) - set(accepted))
    if unknown and not open_ended:
        raise ConfigError(f"task {name!r} has no parameter(s) {unknown}; accepted: {accepted}",
                          where=f"task {name}", fix="remove or rename the parameter")
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad parameters for task {name!r}: {exc}", where=f"task {name}") from exc


# --------------------------------------------------------------------------- safe scoring

def safe_score(task: Task, solution_str: str, example: Example) -> tuple[float, dict]:
    """Score ``solution_str`` for ``example`` with ``task.compute_score``; never raises.

    Returns:
        ``(score, info)``. A dict result gives its ``"score"`` and the dict as info; a number gives
        ``(float(number), {})``. An exception, a non-number, NaN or infinity gives
        ``(0.0, {"error": reason})`` and logs a warning.
    """
    try:
        result = task.compute_score(example.data_source, solution_str, example.ground_truth,
                                    example.extra_info)
        return _as_score(result)
    except _BadReward as bad:
        return _reward_error(task, str(bad))
    except Exception as exc:  # any bug in a reward function must not crash the run
        return _reward_error(task, f"compute_score raised {type(exc).__name__}: {exc}")


class _BadReward(Exception):
    """A reward value that is not a finite number (caught by :func:`safe_score`)."""


def _as_score(result: Any) -> tuple[float, dict]:
    info: dict = {}
    value: Any = result
    if isinstance(result, dict):
        if "score" not in result:
            raise _BadReward("compute_score returned a dict without 'score'")
        info, value = dict(result), result["score"]
    if not isinstance(value, numbers.Real):
        raise _BadReward(f"compute_score returned {type(value).__name__}, not a number")
    score = float(value)
    if not math.isfinite(score):
        raise _BadReward(f"compute_score returned {score}")
    return score, info


_REWARD_ERRORS: Counter[str] = Counter()


def _reward_error(task: Task, reason: str) -> tuple[float, dict]:
    """Log (throttled: the first 10 per task, then every 1000th) and return the zero reward."""
    reason = reason if len(reason) <= 200 else reason[:200] + "..."
    name = str(getattr(task, "name", "?"))
    _REWARD_ERRORS[name] += 1
    count = _REWARD_ERRORS[name]
    if count <= 10 or count % 1000 == 0:
        log.warning("reward of task %s -> 0.0 (error #%d): %s", name, count, reason)
    else:
        log.debug("reward of task %s -> 0.0: %s", name, reason)
    return 0.0, {"error": reason}


def reward_error_kind(reason: str) -> str:
    """A short, metric-key-safe kind of a :func:`safe_score` error reason: the exception's type
    (``ZeroDivisionError``), ``not_a_number``, ``no_score`` (a dict without ``"score"``) or
    ``not_finite`` (NaN, ±inf)."""
    if reason.startswith("compute_score raised "):
        return reason.removeprefix("compute_score raised ").split(":", 1)[0].strip() or "raised"
    if "without 'score'" in reason:
        return "no_score"
    if reason.endswith("not a number"):
        return "not_a_number"
    if reason.startswith("compute_score returned "):
        return "not_finite"
    return "other"


def reward_error_metrics(infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The step metrics of :func:`safe_score`'s ``infos``: ``reward/errors`` (samples scored 0
    for an error) and ``reward/errors/<kind>`` per :func:`reward_error_kind`."""
    kinds = Counter(reward_error_kind(str(i["error"])) for i in infos if "error" in i)
    return {"reward/errors": float(sum(kinds.values())),
            **{f"reward/errors/{k}": float(n) for k, n in sorted(kinds.items())}}


@functools.cache
def _default_task(data_source: str) -> Task:
    return get_task(data_source)


def default_compute_score(data_source: str, solution_str: str, ground_truth: str,
                          extra_info: dict | None = None) -> float | dict:
    """verl-style dispatcher: score with the default-parameter task named ``data_source``.

    Raises:
        ConfigError: no task is registered under ``data_source``.
    """
    return _default_task(data_source).compute_score(data_source, solution_str, ground_truth,
                                                    extra_info)


def segments(task: Task, response: str) -> list[tuple[str, bool]]:
    """Split a response into ``(text, generated_by_model)`` pieces by replaying its tool calls.

    Each turn that ends with a stop string is a tool call; the text that follows it is a tool
    result if it starts with what ``task.call_tool`` answers (the trainer masks those characters
    out of the loss, e.g. for the warm start on ``Example.demo``). Never raises.
    """
    out: list[tuple[str, bool]] = []
    pos, state = 0, {}
    while True:
        ends = [(i, s) for s in task.stop if (i := response.find(s, pos)) >= 0]
        if not ends:
            break
        idx, stop = min(ends)
        cut = idx + len(stop)
        out.append((response[pos:cut], True))
        try:
            tool_text = task.call_tool(response[pos:cut], state).text
        except Exception:  # a user's tool may raise; the rest is then the model's text
            tool_text = ""
        if not tool_text or not response.startswith(tool_text, cut):
            pos = cut
            continue
        out.append((tool_text, False))
        pos = cut + len(tool_text)
    if pos < len(response):
        out.append((response[pos:], True))
    return out


# --------------------------------------------------------------------------- safe tool calls

_TOOL_ERRORS: Counter[str] = Counter()


def _tool_exception(task: Any, call_text: Any, state: Any, what: str) -> ToolResult:
    """Log (throttled like rewards) a tool that raised or answered a non-result; an error result."""
    name = str(getattr(task, "name", "?"))
    _TOOL_ERRORS[name] += 1
    count = _TOOL_ERRORS[name]
    if count <= 10 or count % 1000 == 0:
        log.warning("tool of task %s -> error result (#%d): %s", name, count, what[:200])
    with contextlib.suppress(Exception):  # a state that is no dict must not break the answer
        state["errors"] = state.get("errors", 0) + 1
    text = getattr(task, "error_text", BaseTask.error_text)
    latency = 0.0
    with contextlib.suppress(Exception):  # a BaseTask's latency; a user's task may lack one
        latency = float(task.latency_for(call_text) if hasattr(task, "latency_for")
                        else getattr(task, "tool_latency_s", 0.0))
    if not (isinstance(text, str) and math.isfinite(latency) and latency >= 0):
        text, latency = BaseTask.error_text, 0.0
    return ToolResult(text, ok=False, latency_s=latency)


def safe_call_tool(task: Task, call_text: str, state: dict) -> ToolResult:
    """``task.call_tool(call_text, state)``, but never raises and always returns a ToolResult.

    A tool that raises, or answers something other than a :class:`ToolResult` with ``str`` text
    and a finite latency >= 0, gets its task's ``error_text`` (``ok=False``) with the reason
    logged. The rollout engine should call tools through this, so that a user's tool cannot
    crash a run.
    """
    try:
        result = task.call_tool(call_text, state)
    except Exception as exc:  # any bug in a tool must not crash the run
        return _tool_exception(task, call_text, state, f"call_tool raised "
                                                       f"{type(exc).__name__}: {exc}")
    # duck-typed: any object with ToolResult's fields (a user's own result class) is accepted
    text = getattr(result, "text", None)
    latency = getattr(result, "latency_s", None)
    ok = (isinstance(text, str) and isinstance(latency, numbers.Real)
          and math.isfinite(latency) and latency >= 0)
    if not ok:
        return _tool_exception(task, call_text, state, f"call_tool returned {result!r:.80}")
    return result


M = TypeVar("M", bound=Callable[..., ToolResult])


def tool_guard(method: M) -> M:
    """Decorate a ``call_tool`` method so that it never raises (see :func:`safe_call_tool`).

    The caps of a built-in tool already turn every bad input into an error result; this is the
    last line of defence against a bug, logged as a warning so that it gets fixed. The
    undecorated method stays reachable as ``__wrapped__`` (the fuzz tests call it, so that the
    guard cannot hide a bug from them).
    """
    @functools.wraps(method)
    def guarded(self: Any, call_text: str, state: dict) -> ToolResult:
        try:
            return method(self, call_text, state)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            return _tool_exception(self, call_text, state,
                                   f"call_tool raised {type(exc).__name__}: {exc}")
    return guarded  # type: ignore[return-value]


# --------------------------------------------------------------------------- helpers for tasks

def split_of(key: str, test_fraction: float) -> str:
    """The split a prompt belongs to, from a stable hash of its text (so splits never overlap)."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64
    return "test" if h < test_fraction else "train"


def sample_examples(name: str, make_one: Callable[[random.Random], Example], n: int, seed: int,
                    split: str, test_fraction: float = 0.2) -> list[Example]:
    """Draw ``n`` examples of ``split``, deterministic per ``(name, seed, split)``.

    Candidates whose prompt hashes to the other split are rejected, so train and test never share
    a prompt. Prompts are unique while the generator keeps finding new ones; once the space of a
    split looks exhausted (``MAX_MISSES`` draws in a row without a new prompt; by then nearly all
    of it has been drawn), the rest repeats drawn examples. Each example's
    ``extra_info`` gets ``index`` and ``split``.

    Raises:
        ConfigError: unknown split, negative ``n``, or no example of this split could be drawn.
    """
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}", where="make_dataset", fix=f"use {SPLITS}")
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}", where="make_dataset")
    rng = random.Random(f"{name}|{seed}|{split}")
    seen: dict[str, Example] = {}
    # a draw of the other split counts as a fraction of a miss, so that a small split is not
    # mistaken for an exhausted one
    share = test_fraction if split == "test" else 1.0 - test_fraction
    misses = 0.0
    while len(seen) < n and misses < MAX_MISSES:
        ex = make_one(rng)
        if split_of(ex.prompt, test_fraction) != split:
            misses += share
        elif ex.prompt in seen:
            misses += 1
        else:
            misses = 0.0
            seen[ex.prompt] = ex
    pool = list(seen.values())
    if n and not pool:
        raise ConfigError(f"task {name!r} produced no {split} examples",
                          where="make_dataset", fix="make the task harder/larger")
    while len(pool) < n:
        pool.append(pool[rng.randrange(len(seen))])
    return [_with_index(ex, i, split) for i, ex in enumerate(pool[:n])]


def _with_index(ex: Example, index: int, split: str) -> Example:
    info = {**ex.extra_info, "index": index, "split": split}
    return Example(ex.prompt, ex.ground_truth, ex.data_source, info, ex.demo)


def first_line(text: str) -> str:
    """The response up to the first newline (a newline ends a response)."""
    return text.split(RESPONSE_END, 1)[0]


def last_tagged(text: str, open_tag: str, close_tag: str, max_chars: int) -> str | None:
    """Content of the last ``open_tag ... close_tag`` in ``text`` (linear time), or None.

    Returns None when there is no complete pair or the content is longer than ``max_chars``.
    """
    end = text.rfind(close_tag)
    if end < 0:
        return None
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None
    content = text[start + len(open_tag):end]
    return content if len(content) <= max_chars else None


def parse_int(text: str, max_digits: int = 18) -> int | None:
    """``text`` (stripped) as an int with an optional sign, or None; never slow on long input."""
    text = text.strip()
    body = text[1:] if text[:1] in "+-" else text
    if not body or len(body) > max_digits or not body.isascii() or not body.isdigit():
        return None
    return int(text)


class BaseTask:
    """Boilerplate shared by the built-in tasks: validation, latency, a no-tool ``call_tool``.

    Args:
        tool_latency_s: simulated latency of each tool call (seconds, >= 0).
        tool_latency_jitter: relative spread of that latency (0..1); each call's latency is
            ``tool_latency_s * (1 + jitter * u)`` with ``u`` in [-1, 1] derived from a hash of
            the call text, so it varies between calls yet is reproducible.
        format_score: reward of a well-formed but wrong response (partial credit).
    """

    name: str = "base"
    multi_turn: bool = False
    max_turns: int = 1
    # What a response is expected to do with the tool, for the schedulers' priors (a real run
    # copies them into the pipeline's ``prior_tool_calls`` / ``prior_tool_result_tokens``):
    # estimates from the task's own format, not measured
    expected_tool_calls: float = 0.0
    expected_tool_result_tokens: int = 0
    stop: tuple[str, ...] = ()
    max_response_chars: int = 32
    error_text: str = "<r>error</r>"

    def __init__(self, tool_latency_s: float = 0.0, tool_latency_jitter: float = 0.0,
                 format_score: float = 0.1) -> None:
        if not tool_latency_s >= 0:
            raise ValueError(f"tool_latency_s must be >= 0, got {tool_latency_s}")
        if not 0 <= tool_latency_jitter <= 1:
            raise ValueError(f"tool_latency_jitter must be in [0, 1], got {tool_latency_jitter}")
        if not 0 <= format_score < 1:
            raise ValueError(f"format_score must be in [0, 1), got {format_score}")
        self.tool_latency_s = float(tool_latency_s)
        self.tool_latency_jitter = float(tool_latency_jitter)
        self.format_score = float(format_score)

    def latency_for(self, call_text: str) -> float:
        """The simulated latency of one call (see the class docstring)."""
        if not self.tool_latency_jitter:
            return self.tool_latency_s
        u = zlib.crc32(call_text[-256:].encode("utf-8", "replace")) / 2.0**31 - 1.0
        return self.tool_latency_s * (1.0 + self.tool_latency_jitter * u)

    def error(self, call_text: str, reason: str) -> ToolResult:
        """The defined outcome of a bad tool call: the error text, ``ok=False``, reason logged."""
        log.debug("tool call of task %s failed: %s", self.name, reason)
        return ToolResult(self.error_text, ok=False, latency_s=self.latency_for(call_text))

    @tool_guard
    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        """Single-turn tasks have no tool: every call is an error."""
        return self.error(call_text, f"task {self.name} has no tool")


def resolve_preset(presets: dict[str, dict[str, Any]], difficulty: str,
                   **overrides: Any) -> dict[str, Any]:
    """A difficulty preset's parameters with the explicitly given (non-None) ``overrides`` applied.

    Raises:
        ValueError: unknown difficulty (``get_task`` turns it into a ConfigError).
    """
    if difficulty not in presets:
        raise ValueError(f"unknown difficulty {difficulty!r}; known: {sorted(presets)}")
    return {**presets[difficulty], **{k: v for k, v in overrides.items() if v is not None}}
