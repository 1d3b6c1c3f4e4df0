"""``build_task(pipeline_spec)``: the one way to build a pipeline's task, wherever it runs.

What: a pipeline's task is up to three pieces of its config, composed here:

- ``task: NAME`` (a registered task with ``rollout.task_params``): generated prompts, format,
  reward, tool;
- ``data: {train_files: [...], ...}``: the prompts come from the user's files instead
  (:class:`~jigsawrl.tasks.dataset.DatasetTask`; with a ``task`` its format, reward and tool
  are kept, without one rewards dispatch on each row's ``data_source``);
- ``custom_reward_function: {path: my_reward.py, name: compute_score}``: that function scores
  instead (:class:`~jigsawrl.tasks.custom_reward.RewardFunctionTask`).

Why one factory: the sequential runner, the real-run resolver (a check before Ray starts) and
every Ray worker (device workers through ``RealPipeline``, the reward worker directly) build
the task from the same ``PipelineSpec``, so a user's reward file is imported in the process
that scores, and a broken one fails the resolver before any worker starts.
"""

from __future__ import annotations

from pathlib import Path

from jigsawrl.config import PipelineSpec
from jigsawrl.errors import ConfigError
from jigsawrl.tasks.base import Task, get_task
from jigsawrl.tasks.custom_reward import with_reward_function
from jigsawrl.tasks.dataset import DatasetTask


def build_task(spec: PipelineSpec, where: str | None = None) -> Task:
    """The task of ``spec`` (see the module docstring).

    Args:
        spec: the pipeline's config section.
        where: the config key of the pipeline in messages, e.g. ``pipelines.0`` (default
            ``pipelines[NAME]``).

    Raises:
        ConfigError: unknown task or bad task params; a reward file that is missing, cannot be
            imported, lacks the function or has the wrong signature; data whose
            ``data_source`` names no task when neither ``task`` nor a reward function is set.
        InputError: a data file that is missing or unreadable, or a bad row (file, line, field).
    """
    where = where or f"pipelines[{spec.name}]"
    base: Task | None = None
    if spec.task is not None:
        try:
            base = get_task(spec.task, **spec.rollout.task_params)
        except ConfigError as exc:
            message = str(exc).split("\n  fix: ")[0].removeprefix(f"{exc.where}: ")
            raise ConfigError(message, where=f"{where}.task", fix=exc.fix) from None
    task: Task
    if spec.data is not None:
        task = DatasetTask(spec.data, base=base, max_response_chars=spec.max_response_tokens,
                           pipeline=spec.name)
    elif base is not None:
        task = base
    else:
        raise ConfigError("no task and no data", where=where,
                          fix="name a task (jigsawrl list tasks) or give data: "
                              "{train_files: [...]}")
    reward = spec.custom_reward_function
    if reward is not None and reward.path is not None:
        return with_reward_function(task, reward, f"{where}.custom_reward_function")
    if isinstance(task, DatasetTask) and base is None:
        task.check_dispatch(f"{where}.custom_reward_function")
    return task


def absolute_paths(spec: PipelineSpec) -> PipelineSpec:
    """``spec`` with its data files and reward file as absolute paths, read from the current
    folder (for processes that may run elsewhere: workers of a Ray cluster started in another
    folder read a relative path from theirs)."""
    update: dict[str, object] = {}
    if spec.data is not None:
        update["data"] = spec.data.model_copy(update={
            "train_files": [str(Path(f).expanduser().absolute()) for f in spec.data.train_files],
            "val_files": [str(Path(f).expanduser().absolute()) for f in spec.data.val_files]})
    reward = spec.custom_reward_function
    if reward is not None and reward.path is not None:
        update["custom_reward_function"] = reward.model_copy(
            update={"path": str(Path(reward.path).expanduser().absolute())})
    return spec.model_copy(update=update) if update else spec
