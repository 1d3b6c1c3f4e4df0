"""Tasks of the real CPU engine: datasets, prompt formats, rule-based rewards and tools.

Importing this package registers the built-in tasks: ``countdown`` and ``arithmetic`` (single
turn), ``calculator`` and ``search`` (multi-turn, with a tool). See :mod:`jigsawrl.tasks.base` for
the contract and how to register a task of your own. A pipeline's task is built by
:func:`build_task` from its config: a registered task, the user's data files
(:mod:`jigsawrl.tasks.dataset`, verl's rows) and a reward function from a file
(:mod:`jigsawrl.tasks.custom_reward`, verl's ``custom_reward_function``). Pure Python (no torch).
"""

from jigsawrl.tasks import arithmetic, calculator, countdown, search  # noqa: F401 - registers
from jigsawrl.tasks.base import (
    BaseTask,
    Example,
    Task,
    ToolResult,
    default_compute_score,
    get_task,
    list_tasks,
    register_task,
    reward_error_kind,
    reward_error_metrics,
    safe_call_tool,
    safe_score,
    segments,
    tool_guard,
)
from jigsawrl.tasks.custom_reward import RewardFunctionTask, load_reward_function
from jigsawrl.tasks.dataset import DatasetTask, plain_chat
from jigsawrl.tasks.factory import absolute_paths, build_task

__all__ = [
    "BaseTask",
    "DatasetTask",
    "Example",
    "RewardFunctionTask",
    "Task",
    "ToolResult",
    "absolute_paths",
    "build_task",
    "default_compute_score",
    "get_task",
    "list_tasks",
    "load_reward_function",
    "plain_chat",
    "register_task",
    "reward_error_kind",
    "reward_error_metrics",
    "safe_call_tool",
    "safe_score",
    "segments",
    "tool_guard",
]
