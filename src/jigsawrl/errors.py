"""Errors a user can cause and fix. The CLI turns them into one clear message and exit code 2.

Every error names *where* the problem is (a config key, a file, an argument) and *how to fix it*,
so that nobody needs a traceback to act on it.
"""

from __future__ import annotations


class JigsawError(Exception):
    """Base class of user-facing errors (bad config, bad input file, bad argument)."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.where = where
        self.fix = fix
        parts = [f"{where}: {message}" if where else message]
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__("\n  ".join(parts))


class ConfigError(JigsawError):
    """The experiment config is wrong: unknown key, wrong type, unknown preset, impossible value."""


class InputError(JigsawError):
    """An input file (trace, checkpoint, run folder) is missing or malformed."""
