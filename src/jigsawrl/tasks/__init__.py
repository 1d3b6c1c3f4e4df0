"""Tasks of the real CPU engine: datasets, prompt formats, rule-based rewards and tools.

Importing this package registers the built-in tasks: ``countdown`` and ``arithmetic`` (single
turn), ``calculator`` and ``search`` (multi-turn, with a tool). See :mod:`jigsawrl.tasks.base` for
the contract and how to register a task of your own. Pure Python (no torch).
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
    safe_call_tool,
    safe_score,
    segments,
    tool_guard,
)

__all__ = [
    "BaseTask",
    "Example",
    "Task",
    "ToolResult",
    "default_compute_score",
    "get_task",
    "list_tasks",
    "register_task",
    "safe_call_tool",
    "safe_score",
    "segments",
    "tool_guard",
]
