"""A task from the user's own data files, in verl's format: JSON lines or parquet rows.

What: :class:`DatasetTask` reads a pipeline's ``data:`` section (``config.DataSpec``) and serves
its rows as :class:`~jigsawrl.tasks.base.Example` s. A row is what verl's preprocessing scripts
write (``examples/data_preprocess/gsm8k.py``)::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "Natalia sold clips to 48 friends ..."}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "answer": "... #### 72"}}

- ``prompt`` (or ``data.prompt_key``): a non-empty string, used as the prompt text as it is, or
  a non-empty list of chat messages ``{"role": str, "content": str}``. Messages are kept on the
  example (``Example.messages``); the engine renders them with the tokenizer's chat template
  when it has one (``engine/prompts.py``). Without one they read as the *plain template*
  (:func:`plain_chat`): one ``"{role}: {content}\\n"`` line per message, then ``"assistant: "``.
- ``reward_model.ground_truth``: required, any JSON value but null; passed to the reward as is.
- ``data_source``: optional string (default: the task's name when the pipeline names a
  ``task``, else the file's stem); passed to the reward, and without a ``custom_reward_function``
  or ``task`` it picks the reward: it must then name a registered task (verl's
  ``default_compute_score`` dispatches the same way).
- ``extra_info``: optional mapping (default ``{}``), passed to the reward.
- the warm start's demonstration: the row field ``data.response_key`` (dotted, e.g.
  ``extra_info.answer``); when it is set every row must have it. Unset, ``extra_info.answer`` is
  used where a row has it; with no demonstration at all the warm start is skipped (the
  pipeline logs why).

Files: ``.jsonl`` / ``.ndjson`` (one JSON object per line, blank lines skipped), ``.json`` (JSON
lines, or one top-level list of rows) and ``.parquet`` (needs ``pyarrow``, or ``pandas`` with a
parquet engine; without either a parquet file is a clear error saying ``pip install pyarrow``).
Relative paths are read from the current folder. Every problem is an
:class:`~jigsawrl.errors.InputError` naming the file, the line (row for parquet) and the field.

Responses: a data task's response ends at the tokenizer's EOS or ``max_response_tokens``
(``response_end`` is None: several lines are allowed), unless the pipeline names a ``task``,
whose format, reward, tool and end of response are then used with the data's prompts.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jigsawrl.config import DataSpec
from jigsawrl.errors import ConfigError, InputError
from jigsawrl.tasks.base import (
    Example,
    Task,
    ToolResult,
    default_compute_score,
    list_tasks,
)

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
DEFAULT_RESPONSE_KEY = "extra_info.answer"
PLAIN_ASSISTANT = "assistant: "
DATA_TASK_NAME = "data"
_MISSING = object()


def plain_chat(messages: tuple[dict[str, str], ...] | list[dict[str, str]]) -> str:
    """The plain template of chat messages (for tokenizers without a chat template)::

        user: What is 2+3?
        assistant: ␣

    one ``"{role}: {content}\\n"`` line per message, then ``"assistant: "``.
    """
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + PLAIN_ASSISTANT


# --------------------------------------------------------------------------- reading files

def read_rows(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """``(location, row)`` for every row of a data file; ``location`` is ``file:line`` (JSON
    lines) or ``file: row N`` (parquet, a top-level JSON list; N from 1).

    Raises:
        InputError: missing file, unknown suffix, unreadable JSON or parquet (line named),
            no parquet reader installed.
    """
    if not path.is_file():
        raise InputError(f"data file not found ({what})", where=str(path),
                         fix="check the path (a relative one is read from the current folder)")
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet_rows(path)
    elif suffix in JSONL_SUFFIXES:
        yield from _json_rows(path)
    else:
        raise InputError(f"unknown data file type {suffix or '(no suffix)'!r} ({what})",
                         where=str(path), fix="use .jsonl (JSON lines), .json or .parquet")


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    raw = path.read_bytes()
    if raw.lstrip()[:1] == b"[":  # one JSON list of rows
        try:
            rows = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"not valid UTF-8 JSON: {exc}", where=str(path),
                             fix="write one JSON object per line (JSON lines), or one list"
                             ) from None
        for i, row in enumerate(rows, start=1):
            yield f"{path}: row {i}", row
        return
    for n, line in enumerate(raw.splitlines(), start=1):
        where = f"{path}:{n}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text: {exc}", where=where,
                             fix="save the file as UTF-8") from None
        if not text.strip():
            continue
        try:
            yield where, json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"not a JSON object: {exc.msg} (column {exc.colno})", where=where,
                             fix="write one JSON object per line") from None


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    rows = _read_parquet(path)
    for i, row in enumerate(rows, start=1):
        yield f"{path}: row {i}", _plain(row)


def _read_parquet(path: Path) -> list[Any]:
    """The rows of a parquet file, with pyarrow (preferred) or pandas."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    try:
        if pq is not None:
            return list(pq.read_table(str(path)).to_pylist())
        try:
            import pandas as pd
        except ImportError:
            raise InputError("reading parquet needs pyarrow (or pandas), which is not "
                             "installed", where=str(path),
                             fix="pip install pyarrow (it does not change torch), or convert "
                                 "the file to JSON lines (.jsonl)") from None
        return list(pd.read_parquet(str(path)).to_dict("records"))
    except InputError:
        raise
    except Exception as exc:  # pyarrow / pandas raise many types for a bad file
        raise InputError(f"cannot read parquet: {type(exc).__name__}: {exc}", where=str(path),
                         fix="check that the file is parquet (verl's preprocessing writes it)"
                         ) from exc


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (what pandas gives for list columns) as plain Python values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    return value


# --------------------------------------------------------------------------- one row

def lookup(row: dict[str, Any], dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``, or ``_MISSING``."""
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _bad(where: str, field: str, problem: str, fix: str) -> InputError:
    return InputError(f"field {field!r}: {problem}", where=where, fix=fix)


def _prompt(row: dict[str, Any], key: str,
            where: str) -> tuple[str, tuple[dict[str, str], ...] | None]:
    """The prompt text and its chat messages (None for a string prompt)."""
    value = lookup(row, key)
    fix = 'give a string or chat messages [{"role": "user", "content": "..."}]'
    if value is _MISSING or value is None:
        raise _bad(where, key, "missing", fix)
    if isinstance(value, str):
        if not value.strip():
            raise _bad(where, key, "empty prompt", fix)
        return value, None
    if not isinstance(value, list) or not value:
        raise _bad(where, key, f"{'empty list' if value == [] else type(value).__name__} is "
                               "not a prompt", fix)
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise _bad(where, f"{key}.{i}", f"a message must be an object, got "
                                            f"{type(m).__name__}", fix)
        for part in ("role", "content"):
            if not isinstance(m.get(part), str):
                got = "missing" if part not in m else f"{type(m[part]).__name__}, not a string"
                raise _bad(where, f"{key}.{i}.{part}", got, fix)
        if not m["role"].strip():
            raise _bad(where, f"{key}.{i}.role", "empty role", fix)
        messages.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in messages):
        raise _bad(where, key, "empty prompt (every message's content is empty)", fix)
    msgs = tuple(messages)
    return plain_chat(msgs), msgs


def _demo(row: dict[str, Any], key: str | None, where: str) -> str:
    """The demonstration response of a row ('' when the default key is absent)."""
    value = lookup(row, key or DEFAULT_RESPONSE_KEY)
    fix = f"give a string response in every row, or drop data.response_key (default " \
          f"{DEFAULT_RESPONSE_KEY}, used where present)"
    if value is _MISSING or value is None:
        if key is not None:
            raise _bad(where, key, "missing (data.response_key names it)", fix)
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _bad(where, key or DEFAULT_RESPONSE_KEY, f"{type(value).__name__} is not a "
                                                       "response string", fix)
    return str(value)


def parse_row(row: Any, where: str, data: DataSpec, default_source: str) -> Example:
    """One verl row as an :class:`Example` (see the module docstring).

    Raises:
        InputError: naming ``where`` (file and line) and the bad field.
    """
    if not isinstance(row, dict):
        raise InputError(f"a row must be a JSON object, got {type(row).__name__}", where=where,
                         fix="write one object per line with prompt and reward_model")
    prompt, messages = _prompt(row, data.prompt_key, where)
    rm = row.get("reward_model", _MISSING)
    if not isinstance(rm, dict):
        got = "missing" if rm is _MISSING else f"{type(rm).__name__}, not an object"
        raise _bad(where, "reward_model", got, 'give "reward_model": {"ground_truth": ...}')
    if rm.get("ground_truth") is None:
        raise _bad(where, "reward_model.ground_truth", "missing" if "ground_truth" not in rm
                   else "null", "give the value the reward compares the response with")
    source = row.get("data_source", default_source)
    if not isinstance(source, str) or not source:
        raise _bad(where, "data_source", f"{type(source).__name__} is not a non-empty string",
                   "give a name (a string), or leave the field out")
    info = row.get("extra_info")
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise _bad(where, "extra_info", f"{type(info).__name__}, not an object",
                   "give an object, or leave the field out")
    return Example(prompt, rm["ground_truth"], source, dict(info),
                   _demo(row, data.response_key, where), messages)


# --------------------------------------------------------------------------- the task

class DatasetTask:
    """The rows of a pipeline's data files as a task (see the module docstring).

    Args:
        data: the pipeline's ``data:`` section.
        base: the pipeline's ``task`` (its format, reward and tool), or None: then rewards
            dispatch on ``data_source`` (:func:`~jigsawrl.tasks.base.default_compute_score`)
            unless a ``custom_reward_function`` replaces them.
        max_response_chars: the pipeline's ``max_response_tokens``.
        pipeline: the pipeline's name (for messages).

    Raises:
        InputError: a missing or unreadable file, a bad row (file, line, field), no rows.
    """

    def __init__(self, data: DataSpec, *, base: Task | None = None,
                 max_response_chars: int = 8192, pipeline: str = "") -> None:
        self.data = data
        self.base = base
        self.name = base.name if base is not None else DATA_TASK_NAME
        self.multi_turn = bool(base.multi_turn) if base is not None else False
        self.max_turns = int(base.max_turns) if base is not None else 1
        self.stop: tuple[str, ...] = tuple(base.stop) if base is not None else ()
        self.max_response_chars = int(max_response_chars)
        # a built-in task's format ends a response at a newline; raw data at EOS only
        self.response_end: str | None = (getattr(base, "response_end", "\n")
                                         if base is not None else None)
        self.error_text = getattr(base, "error_text", "<r>error</r>")
        self.pipeline = pipeline
        self._rows = {"train": self._load(data.train_files, "data.train_files"),
                      "test": self._load(data.val_files, "data.val_files")}

    def _load(self, files: list[str], what: str) -> list[tuple[str, Example]]:
        out: list[tuple[str, Example]] = []
        label = f"pipeline {self.pipeline!r}: {what}" if self.pipeline else what
        for name in files:
            path = Path(name).expanduser()
            default = self.name if self.base is not None else path.stem
            before = len(out)
            for where, row in read_rows(path, label):
                out.append((where, parse_row(row, where, self.data, default)))
            if len(out) == before:
                raise InputError(f"no rows ({label})", where=str(path),
                                 fix="write at least one row, or remove the file from the list")
        return out

    # ------------------------------------------------------------------ the Task protocol

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        """The first ``n`` rows of the split's files, in file order (``train``: train_files,
        ``test``: val_files, empty without them); ``seed`` is unused (the pipeline samples)."""
        if split not in self._rows:
            raise ConfigError(f"unknown split {split!r}", where="make_dataset",
                              fix="use 'train' or 'test'")
        return [ex for _, ex in self._rows[split][: max(0, n)]]

    def compute_score(self, data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: dict | None = None) -> float | dict:
        if self.base is not None:
            return self.base.compute_score(data_source, solution_str, ground_truth, extra_info)
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)

    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        if self.base is not None:
            return self.base.call_tool(call_text, state)
        return ToolResult(self.error_text, ok=False)

    # ------------------------------------------------------------------ what the engine reads

    def size(self, split: str) -> int:
        """Rows of ``split``."""
        return len(self._rows.get(split, []))

    def rows(self, split: str) -> list[tuple[str, Example]]:
        """``(file:line, example)`` of every row of ``split`` (for checks that name the row)."""
        return list(self._rows.get(split, []))

    @property
    def has_demos(self) -> bool:
        """Whether any training row carries a response for the warm start."""
        return any(ex.demo for _, ex in self._rows["train"])

    @property
    def cache_key(self) -> str:
        """A key of what the warm start learns from: the files' contents and the data keys."""
        h = hashlib.sha256(repr((self.name, self.data.prompt_key, self.data.response_key))
                           .encode())
        for name in self.data.train_files:
            h.update(Path(name).expanduser().read_bytes())
        return f"data-{h.hexdigest()[:16]}"

    def check_dispatch(self, where: str) -> None:
        """Without a task or a reward function, each row's ``data_source`` picks the reward.

        Raises:
            ConfigError: a ``data_source`` that names no registered task (the first row named).
        """
        known = set(list_tasks())
        for split in ("train", "test"):
            for loc, ex in self._rows[split]:
                if ex.data_source not in known:
                    raise ConfigError(
                        f"no reward for data_source {ex.data_source!r} (first at {loc}): rows "
                        f"are scored by the task their data_source names, and no task has "
                        f"this name", where=where,
                        fix="add custom_reward_function: {path: my_reward.py, name: "
                            "compute_score}, or task: NAME (jigsawrl list tasks)")

    def locate_characters(self, is_known: Callable[[str], bool]) -> list[tuple[str, str, str]]:
        """``(file:line, field, character)`` of the first row holding each character that
        ``is_known`` refuses, over the prompts (message contents) and demonstrations."""
        seen: dict[str, tuple[str, str, str]] = {}
        for split in ("train", "test"):
            for loc, ex in self._rows[split]:
                texts = ([(f"{self.data.prompt_key}.{i}.content", m["content"])
                          for i, m in enumerate(ex.messages)] if ex.messages else
                         [(self.data.prompt_key, ex.prompt)])
                texts.append((self.data.response_key or DEFAULT_RESPONSE_KEY, ex.demo))
                for field, text in texts:
                    for ch in set(text) - set(seen):
                        if not is_known(ch):
                            seen[ch] = (loc, field, ch)
        return sorted(seen.values())
