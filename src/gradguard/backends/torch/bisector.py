"""Bisect mode: pin a silent write that no boundary explained to one op, or to an interval of user lines.

Re-run the code with ``TorchGuardSession(bisect=True)`` or :func:`bisect` (bisect.py). Subscribed to the op stream
(outside the write log), around every op it re-checks the fingerprint of every tensor saved for backward:

* bytes changed *during* an op the write log did not see write there: the op wrote without declaring it (an
  extension op whose schema lacks ``Tensor(a!)``, a fused kernel): pinned to that op and its user line;
* bytes changed *between* two ops: no torch op did it (NumPy view, ctypes, DLPack, a C++/CUDA extension). A line
  tracer on the user's code re-checks at every line, pinning the write to its line, also inside the user's
  functions (``self.buf_obs[:] = ...`` in ``env.step``). Where another tracer (a debugger, coverage) owns
  ``sys.settrace``, gradguard leaves it alone and names the interval between two ops instead.

One full hash of every live saved tensor per op: a diagnosis re-run, not a training mode.
"""

from __future__ import annotations

import sys
import sysconfig
import weakref

from ...core.engine import SavedBaselines
from ...core.findings import WriteRecord
from ...core.frames import LIBRARY_PATHS, location_of, user_location

__all__ = ["Bisector"]

# Python's own modules run inside library calls (textwrap while gradguard renders, linecache): not user lines.
_NOT_USER = tuple({p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}
                  ) + ("<frozen ",)


def _user_file(filename: str) -> bool:
    return not filename.startswith(_NOT_USER) and not LIBRARY_PATHS.is_library(filename)


class Bisector:
    """Checks saved tensors' fingerprints before and after every op (see the module docstring): an op-stream
    subscriber, plus a line tracer on the user's code between ``start()`` and ``stop()``, and the engine's bisect
    hook at unpack (``check``, ``rebase``: the interval since the last op)."""

    def __init__(self, session):
        self._session = weakref.ref(session)
        self._baselines = SavedBaselines(session.engine)
        self._last = None  # user line of the previous op
        self._line = None  # the user line running now (line tracer)
        self._tracing = False
        self._in_op = 0  # inside a dispatched op (a Python kernel's lines): the op's own check attributes the write

    def start(self) -> None:
        # NOTE [Lines as bisect points]
        # A check at every line event of user code: when bytes changed since the previous check, the line that
        # ran in between wrote them. Library frames are not traced (their writes surface at the user's line that
        # called them). The tracer is only installed when none is (a debugger or coverage keeps theirs).
        if sys.gettrace() is None:
            sys.settrace(self._trace_call)
            self._tracing = True

    def stop(self) -> None:
        if self._tracing:
            self._tracing = False
            if sys.gettrace() == self._trace_call:
                sys.settrace(None)

    def _trace_call(self, frame, event, arg):
        if event != "call" or self._in_op or not _user_file(frame.f_code.co_filename):
            return None
        return self._trace_line

    def _trace_line(self, frame, event, arg):
        if self._in_op:  # inside an op or a check: gradguard's own work, or a Python kernel the op check covers
            return self._trace_line
        if event in ("line", "return"):
            if self._line is not None:
                self._checked(None, self._line, pinned=True)
            if event == "line":
                self._line = location_of(frame)
            else:  # back in the caller, still on the line that called
                caller = frame.f_back
                self._line = location_of(caller) if caller is not None and _user_file(caller.f_code.co_filename) else None
        return self._trace_line

    def check(self, location) -> None:
        self._checked(None, location or user_location(3))

    def rebase(self, records) -> None:
        return None  # the check compares write counts itself

    def _checked(self, op, location, pinned: bool = False) -> None:
        """Compare every live saved tensor with its baseline; attribute the changes; move the baselines."""
        self._in_op += 1
        try:
            self._check(op, location, pinned)
        finally:
            self._in_op -= 1

    def _check(self, op, location, pinned: bool) -> None:
        session = self._session()
        if session is None:
            return
        for record in self._baselines.unexplained_changes():
            if location is None:
                location = user_location(2)
            if op is not None:
                write = WriteRecord(op=op, location=location, via="an op that does not declare the write",
                                    category="kernel", bumps_version=False)
            elif pinned:
                write = WriteRecord(op="write outside torch", location=location, category="outside",
                                    bumps_version=False)
            else:
                here = location.short if location is not None else "an unknown line"
                if self._last is None:
                    interval = f"before {here}"
                elif location is not None and self._last.short == location.short:
                    interval = f"within {here}"
                else:
                    interval = f"between {self._last.short} and {here}"
                write = WriteRecord(op=f"write outside torch {interval}", location=location, category="outside",
                                    bumps_version=False)
            session.record_write([record], write)

    def op(self, func, args, kwargs, call):
        location = user_location(2)
        self._checked(None, location)
        self._in_op += 1
        try:
            out = call(func, args, kwargs)
        finally:
            self._in_op -= 1
        self._checked(func.name().replace("::", "."), location)
        self._last = location
        return out
