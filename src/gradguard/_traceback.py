"""Tracebacks trimmed to the user's frames: gradguard's own frames and runpy's are plumbing."""

from __future__ import annotations

import os
import sys
import traceback
import types

_GRADGUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_plumbing(filename: str) -> bool:
    return filename.startswith(_GRADGUARD_DIR) or filename in ("<frozen runpy>",) or filename.endswith(
        os.sep + "runpy.py"
    )


def trim_traceback(tb: types.TracebackType | None, *, drop_library: bool = False) -> types.TracebackType | None:
    """The same traceback without gradguard/runpy frames (and, with ``drop_library``, without library frames)."""
    from .core.frames import LIBRARY_PATHS

    entries = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not _is_plumbing(filename) and not (drop_library and LIBRARY_PATHS.is_library(filename)):
            entries.append(tb)
        tb = tb.tb_next
    head = None
    for entry in reversed(entries):
        head = types.TracebackType(head, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return head


def _trim_chain(error: BaseException) -> None:
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = trim_traceback(current.__traceback__)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def format_user_exception(error: BaseException) -> str:
    """Format like Python's default hook, with plumbing frames removed from every exception in the chain."""
    _trim_chain(error)
    return "".join(traceback.format_exception(error))


def call_users_excepthook(error: BaseException) -> bool:
    """Hand an uncaught ``error`` to the ``sys.excepthook`` the script installed (rich's traceback, Sentry,
    loguru), as python does; False when the hook is Python's own (the caller prints the traceback itself).

    The hook gets the trimmed traceback. If the hook raises, the two errors are printed as Python prints them.
    """
    hook = sys.excepthook
    if hook is sys.__excepthook__:
        return False
    _trim_chain(error)
    try:
        hook(type(error), error, error.__traceback__)
    except BaseException as failure:  # Python's words when a hook fails (sys.excepthook's documentation)
        sys.stderr.write("Error in sys.excepthook:\n" + "".join(traceback.format_exception(failure))
                         + "\nOriginal exception was:\n" + "".join(traceback.format_exception(error)))
    return True
