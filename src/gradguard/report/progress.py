"""Progress for long work (``gradguard advise``, ``check_op``, the forensic re-run): rich's progress display
on stderr, only where stderr is a terminal.

# NOTE [progress manners]
# Progress is shown only when stderr is an interactive terminal (not ``TERM=dumb``); piped output, CI logs
# and notebooks get nothing, so captured output stays exactly what it was. The display is transient: it
# is erased when the work ends, so the terminal afterwards shows only the report. The user's own prints
# during the work go through rich's console (printed above the live line), so they are neither lost nor
# overwritten. ``GRADGUARD_PROGRESS=0`` turns it off everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import IO, Iterator

__all__ = ["progress", "ProgressTracker", "progress_enabled"]

_log = logging.getLogger("gradguard.report.progress")


class ProgressTracker:
    """Handle yielded by ``progress``; every method is a no-op where no display is shown."""

    def __init__(self, display=None, task=None):
        self._display = display
        self._task = task

    @property
    def shown(self) -> bool:
        """True where a progress display is on the terminal."""
        return self._display is not None

    def update(self, description: str | None = None, advance: float = 0) -> None:
        """Show ``description`` as the current step; ``advance`` completed units."""
        if self._display is None:
            return
        fields = {"description": description} if description is not None else {}
        # A new step is drawn at once (steps are few and may be shorter than the refresh period).
        self._display.update(self._task, advance=advance, refresh=description is not None, **fields)


def progress_enabled(file: IO[str] | None = None) -> bool:
    """Whether a progress display belongs on ``file`` (stderr by default): an interactive, non-dumb terminal."""
    if os.environ.get("GRADGUARD_PROGRESS", "").strip() == "0":
        return False
    stream = sys.stderr if file is None else file
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream: no terminal to draw on
        return False
    return interactive and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


@contextlib.contextmanager
def progress(title: str, total: float | None = None, *, file: IO[str] | None = None) -> Iterator[ProgressTracker]:
    """A transient progress display titled ``title`` on ``file`` (stderr), only on a terminal.

    ``total`` gives a bar (units completed via ``tracker.update(advance=...)``); without it a spinner and the
    elapsed time show that work goes on.
    """
    if not progress_enabled(file):
        yield ProgressTracker()
        return
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
            TimeElapsedColumn

        columns = [SpinnerColumn(), TextColumn(f"[bold]{title}[/bold]"), TextColumn("{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        display = Progress(*columns, console=Console(file=sys.stderr if file is None else file), transient=True)
        task = display.add_task("", total=total)
        display.start()
    except Exception as error:  # a broken terminal must not stop the work it would only have decorated
        _log.warning("gradguard: progress display unavailable (%s: %s); continuing without it",
                     type(error).__name__, error)
        yield ProgressTracker()
        return
    try:
        yield ProgressTracker(display, task)
    finally:
        display.stop()
