"""A reward function from a Python file the user names: verl's ``custom_reward_function``.

What: :func:`load_reward_function` imports ``custom_reward_function.path`` (a ``.py`` file) and
takes its function ``custom_reward_function.name`` (default ``compute_score``), which must accept
verl's call::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return 1.0 if solution_str.strip() == str(ground_truth) else 0.0   # or {"score": ...}

called by keyword, as verl's reward managers call it, with ``reward_kwargs`` added.
:class:`RewardFunctionTask` wraps a task so that this function scores it (prompts, format and
tools stay the task's). A file that cannot be imported (syntax error, import error, any
exception at import), a missing or non-callable name, a coroutine function, or a signature that
cannot take that call is a :class:`~jigsawrl.errors.ConfigError` naming the file, raised when
the task is built: before a run starts. A call that raises or returns a non-number scores 0
with the reason logged and counted (:func:`~jigsawrl.tasks.base.safe_score`, the
``reward/errors`` metrics).

Safety: user code runs only where the user named it; nothing is imported implicitly (no
search path, no default file). Each file is imported under a private module name derived from
its absolute path, once per process (a Ray reward worker imports it in its own process).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from jigsawrl.config import RewardFunctionSpec
from jigsawrl.errors import ConfigError
from jigsawrl.tasks.base import Example, Task, ToolResult

CALL = "compute_score(data_source, solution_str, ground_truth, extra_info)"
_SAMPLE = {"data_source": "", "solution_str": "", "ground_truth": "", "extra_info": {}}


def _import_file(path: Path, where: str) -> ModuleType:
    name = "jigsawrl_user_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} is not a Python file that can be imported", where=where,
                          fix="give the path of a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # a user's file may raise anything at import, even SystemExit
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError(f"importing {path} failed: {type(exc).__name__}: {exc}", where=where,
                          fix="fix the file (run `python " + str(path) + "` to see the error)"
                          ) from None
    return module


def load_reward_function(spec: RewardFunctionSpec,
                         where: str = "custom_reward_function") -> Callable[..., Any]:
    """The checked reward function of ``spec`` (``spec.path`` must be set).

    Raises:
        ConfigError: missing file, import failure, missing / non-callable / async function, or
            a signature that cannot take verl's keyword call plus ``reward_kwargs``; the message
            names the file.
    """
    if spec.path is None:
        raise ConfigError("no reward file", where=f"{where}.path", fix="set path: my_reward.py")
    path = Path(spec.path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"reward file {spec.path!r} not found", where=f"{where}.path",
                          fix="give the path of a .py file (a relative one is read from the "
                              "current folder)")
    module = _import_file(path, f"{where}.path")
    fn = getattr(module, spec.name, None)
    if fn is None:
        found = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"{path} has no function {spec.name!r} (it defines: "
                          f"{', '.join(found) or 'no functions'})", where=f"{where}.name",
                          fix="set name: to the reward function's name")
    if not callable(fn):
        raise ConfigError(f"{path}: {spec.name!r} is a {type(fn).__name__}, not a function",
                          where=f"{where}.name", fix="name a function")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{path}: {spec.name} is async; the reward must be a plain function",
                          where=f"{where}.name", fix="drop `async` (call your async code inside)")
    try:
        sig = inspect.signature(fn)
        sig.bind(**_SAMPLE, **spec.reward_kwargs)
    except (TypeError, ValueError) as exc:
        kwargs = f" + reward_kwargs {sorted(spec.reward_kwargs)}" if spec.reward_kwargs else ""
        raise ConfigError(f"{path}: {spec.name}{_sig(fn)} cannot be called as {CALL}{kwargs} "
                          f"(by keyword, as verl does): {exc}", where=f"{where}.name",
                          fix="def compute_score(data_source, solution_str, ground_truth, "
                              "extra_info=None): ...") from None
    return fn


def _sig(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


class RewardFunctionTask:
    """``inner`` with its reward replaced by a user's function (everything else delegated).

    Args:
        inner: the task whose prompts, format and tool are kept.
        fn: a function checked by :func:`load_reward_function`.
        reward_kwargs: extra keyword arguments of every call.
        source: ``"file.py:name"``, for messages.
    """

    def __init__(self, inner: Task, fn: Callable[..., Any],
                 reward_kwargs: dict[str, Any] | None = None, source: str = "") -> None:
        self.inner = inner
        self.fn = fn
        self.reward_kwargs = dict(reward_kwargs or {})
        self.source = source
        self.name = inner.name
        self.multi_turn = inner.multi_turn
        self.max_turns = inner.max_turns
        self.stop = inner.stop
        self.max_response_chars = inner.max_response_chars

    def __getattr__(self, item: str) -> Any:  # response_end, rows, size, cache_key, ...
        if item == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(item)
        return getattr(self.inner, item)

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        return self.inner.make_dataset(n, seed, split)

    def compute_score(self, data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: dict | None = None) -> float | dict:
        return self.fn(data_source=data_source, solution_str=solution_str,
                       ground_truth=ground_truth, extra_info=extra_info, **self.reward_kwargs)

    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        return self.inner.call_tool(call_text, state)


def with_reward_function(task: Task, spec: RewardFunctionSpec,
                         where: str = "custom_reward_function") -> RewardFunctionTask:
    """``task`` scored by the function ``spec`` names (loaded and checked now).

    Raises:
        ConfigError: see :func:`load_reward_function`.
    """
    fn = load_reward_function(spec, where)
    return RewardFunctionTask(task, fn, spec.reward_kwargs, f"{spec.path}:{spec.name}")
