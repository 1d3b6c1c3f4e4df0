"""What every ``jigsawrl`` command shares: the consoles, user-error handling, the progress bar.

Only the CLI prints (DESIGN.md §5). Every user error — bad config, unknown preset, missing file — is
a :class:`~jigsawrl.errors.JigsawError`; :func:`user_errors` turns it into one message on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jigsawrl.errors import JigsawError

out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override: key.path=value")]


def fail(message: str) -> typer.Exit:
    """Print ``message`` as a user error; the caller raises the returned exit (code 2)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def user_errors(fn: F) -> F:
    """Turn user-facing errors into one message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JigsawError as exc:
            raise fail(str(exc)) from None

    return wrapper  # type: ignore[return-value]


def progress_bar() -> Progress:
    """A transient progress bar on stderr (hidden when stderr is not a terminal)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True,
                    disable=not err.is_terminal)
