"""A data task's prompts as its model will read them: rendered, encodable and fitting.

What: :func:`render_examples` turns examples whose prompt came as chat messages
(``Example.messages``, from a data file: ``tasks/dataset.py``) into the text the model reads:
the tokenizer's chat template (``apply_chat_template(..., add_generation_prompt=True)``) when it
has one, else the plain template the task already wrote (``"user: ...\\nassistant: "``). A
string prompt is used as it is. :func:`check_data` runs before a model is built and refuses
what would fail or mislead later, naming the data file and line:

- chat messages for a user's own model (a local folder) whose tokenizer has no chat template
  (the built-in presets have none and read the plain template, by design);
- characters the tokenizer cannot encode: the character tokenizer of the presets knows printable
  ASCII and the newline only. ``data.unknown_chars: unk`` (the default) maps each to the
  tokenizer's unknown token with one warning naming the first row of each character;
  ``error`` refuses, naming file, line, field and character. A byte-level tokenizer (no unknown
  token) encodes everything;
- a prompt too long for the model's positions or the rollout's KV budget
  (``rollout.max_batch_tokens``), which the engine would refuse mid-run;
- a tokenizer without an EOS token (a data task's response ends at EOS).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from jigsawrl.engine.trajectory import encode_prompt
from jigsawrl.errors import ConfigError, InputError

log = logging.getLogger(__name__)

MAX_LISTED = 5  # unknown characters named in the warning


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, example: Any) -> str:
    """The prompt text of ``example`` for ``tokenizer`` (see the module docstring)."""
    messages = getattr(example, "messages", None)
    if not messages or not has_chat_template(tokenizer):
        return example.prompt
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                         add_generation_prompt=True)
    return str(text)


def render_examples(tokenizer: Any, examples: list[Any]) -> list[Any]:
    """``examples`` with each chat prompt rendered for ``tokenizer`` (others unchanged)."""
    if not has_chat_template(tokenizer):
        return list(examples)
    return [dataclasses.replace(ex, prompt=render_prompt(tokenizer, ex))
            if getattr(ex, "messages", None) else ex for ex in examples]


def _known_char(tokenizer: Any) -> Any:
    """``ch -> bool``: whether ``tokenizer`` encodes ``ch`` without its unknown token."""
    unk = getattr(tokenizer, "unk_token_id", None)
    cache: dict[str, bool] = {}

    def known(ch: str) -> bool:
        if ch not in cache:
            cache[ch] = unk is None or unk not in tokenizer.encode(ch, add_special_tokens=False)
        return cache[ch]
    return known


def check_characters(task: Any, tokenizer: Any, mode: str, where: str) -> None:
    """Warn about (``mode='unk'``) or refuse (``'error'``) characters the tokenizer lacks.

    Raises:
        InputError: ``mode='error'`` and a row holds such a character (file, line, field).
    """
    if getattr(tokenizer, "unk_token_id", None) is None or not hasattr(task, "locate_characters"):
        return
    found = task.locate_characters(_known_char(tokenizer))
    if not found:
        return
    if mode == "error":
        loc, field, ch = found[0]
        raise InputError(f"field {field!r}: character {ch!r} (U+{ord(ch):04X}) is not in the "
                         f"tokenizer's vocabulary ({len(found)} such character(s) in all)",
                         where=loc, fix=f"remove or replace it, or set {where}.data."
                                        "unknown_chars: unk to map it to the unknown token")
    listed = "; ".join(f"{ch!r} (U+{ord(ch):04X}) first at {loc} {field}"
                       for loc, field, ch in found[:MAX_LISTED])
    more = f" and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
    log.warning("%s: %d character(s) of the data are not in the tokenizer's vocabulary and "
                "read as its unknown token: %s%s (data.unknown_chars: error refuses them)",
                where, len(found), listed, more)


def check_data(task: Any, tokenizer: Any, *, own_model: bool, max_positions: int,
               max_batch_tokens: int, unknown_chars: str = "unk", where: str = "pipeline") -> None:
    """Check a data task's rows against the model's tokenizer (see the module docstring);
    a task without rows (a generated one) passes.

    Raises:
        ConfigError: chat messages for an own model whose tokenizer has no chat template.
        InputError: a tokenizer without EOS; an unknown character with ``unknown_chars:
            error``; a prompt that does not fit (file and line named).
    """
    if not hasattr(task, "rows"):
        return
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise InputError("the tokenizer has no EOS token, so a response could not end",
                         where=f"{where}.model", fix="set eos_token in tokenizer_config.json")
    rows = [*task.rows("train"), *task.rows("test")]
    chat = next((loc for loc, ex in rows if ex.messages), None)
    if chat is not None and own_model and not has_chat_template(tokenizer):
        raise ConfigError(f"the data gives prompts as chat messages (first at {chat}) but the "
                          f"model's tokenizer has no chat template", where=f"{where}.model",
                          fix="save the tokenizer with its chat_template (tokenizer.chat_template"
                              " = ...; save_pretrained), or give prompts as strings")
    check_characters(task, tokenizer, unknown_chars, where)
    limit = min(max_positions - 1, max_batch_tokens)
    texts = [render_prompt(tokenizer, ex) for _, ex in rows]
    for (loc, _), text in zip(rows, texts, strict=True):
        n = len(encode_prompt(tokenizer, text))
        if n > limit:
            raise InputError(f"prompt of {n} tokens does not fit: the model has "
                             f"{max_positions} positions and rollout.max_batch_tokens is "
                             f"{max_batch_tokens} (at most {limit} prompt tokens)", where=loc,
                             fix="shorten the prompt, raise rollout.max_batch_tokens, or use a "
                                 "model with more positions")

