"""Map a point inside library code back to the user's line.

# NOTE [Why a frame walk and not traceback.extract_stack]
# The pack hook runs once per saved tensor, so the walk is on the hot path. ``sys._getframe`` plus
# ``f_back`` costs ~0.5 us + ~0.2 us per skipped frame; ``traceback.extract_stack`` costs ~25-100 us.
# The "is this a library file?" answer is cached by ``co_filename`` (a str, hash cached), not by the
# code object, whose hash is recomputed on every call.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import Callable, Iterator

from .findings import SourceLocation

__all__ = ["LibraryPaths", "user_location", "user_location_and_caller", "location_of", "caller_context",
           "CallerContext", "LIBRARY_PATHS", "user_variable_names", "user_frames", "innermost_user_entry", "is_plumbing",
           "is_gradguard_file", "notice"]

_GRADGUARD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LibraryPaths:
    """The set of directories whose frames are "library", not "user" code.

    Backends register their framework's package directories (torch, triton, liger_kernel ...).
    """

    def __init__(self) -> None:
        self._prefixes: tuple[str, ...] = (_GRADGUARD_DIR + os.sep,)
        self._cache: dict[str, bool] = {}
        self._lock = threading.Lock()

    def add(self, directory: str) -> None:
        directory = os.path.abspath(directory).rstrip(os.sep) + os.sep
        with self._lock:
            if directory not in self._prefixes:
                self._prefixes = self._prefixes + (directory,)
                self._cache = {}

    def is_library(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            hit = (
                filename.startswith(self._prefixes)
                or filename.startswith("<frozen ")
                or os.path.basename(filename) in ("runpy.py", "contextlib.py", "threading.py")
            )
            if not hit and not os.path.isabs(filename) and not filename.startswith("<"):
                hit = os.path.abspath(filename).startswith(self._prefixes)
            self._cache[filename] = hit
        return hit


LIBRARY_PATHS = LibraryPaths()


_LOCATIONS: dict[tuple[int, int], tuple[CodeType, SourceLocation]] = {}
_MAX_LOCATIONS = 8192


def location_of(frame: FrameType) -> SourceLocation:
    """The line ``frame`` is running, as a :class:`SourceLocation` (source text read on first use)."""
    # NOTE [One SourceLocation per line]: a training loop saves tensors at the same few lines every step; one
    # shared object per (code object, line) costs a dict lookup instead of an allocation, and ~130 bytes less per
    # saved tensor (site and caller). Keyed by the code object's identity: code objects compare equal by content,
    # without their file name, so two identical test functions in two files would share one location.
    code = frame.f_code
    line = frame.f_lineno
    entry = _LOCATIONS.get((id(code), line))
    if entry is None or entry[0] is not code:
        if len(_LOCATIONS) >= _MAX_LOCATIONS:
            _LOCATIONS.clear()
        entry = _LOCATIONS[(id(code), line)] = (code, SourceLocation(code.co_filename, line, code.co_name))
    return entry[1]  # the code object is kept in the entry, so its id is not reused while cached


def user_location(skip: int = 1, paths: LibraryPaths = LIBRARY_PATHS) -> SourceLocation | None:
    """The innermost frame outside every library directory, or None (e.g. on an autograd worker thread)."""
    try:
        frame: FrameType | None = sys._getframe(skip)
    except ValueError:
        return None
    cache = paths._cache  # inlined lookups: this loop runs for every saved tensor
    while frame is not None:
        filename = frame.f_code.co_filename
        library = cache.get(filename)
        if library is None:
            library = paths.is_library(filename)
        if not library:
            return location_of(frame)
        frame = frame.f_back
    return None


def user_location_and_caller(
    skip: int = 1, paths: LibraryPaths = LIBRARY_PATHS
) -> tuple[SourceLocation | None, SourceLocation | None]:
    """``(user_location, caller)``: the innermost user frame and, when that frame is inside a function (a
    module's ``forward``, a helper), the next user frame outward: the user's call of the model. Runs per saved
    tensor, so :func:`user_location`'s walk and :func:`location_of` are inlined (NOTE [One frame walk per saved
    tensor]), and only frames up to the caller are walked."""
    # NOTE [One frame walk per saved tensor]
    # The pack hook asks this once per saved tensor (~700 times per step in an LSTMCell loop). Four helper calls
    # (two frame walks, two location lookups) were a quarter of its cost; the same walks and the same cached
    # SourceLocation per (code object, line) are written out here, with the dictionaries bound once.
    try:
        frame: FrameType | None = sys._getframe(skip)
    except ValueError:
        return None, None
    cache = paths._cache
    locations = _LOCATIONS
    inner = None
    while frame is not None:  # one walk: the first user frame, then (unless it is a module's top level) the next
        code = frame.f_code
        library = cache.get(code.co_filename)
        if library is None:
            library = paths.is_library(code.co_filename)
        if not library:
            entry = locations.get((id(code), frame.f_lineno))
            here = entry[1] if entry is not None and entry[0] is code else location_of(frame)
            if inner is not None:
                return inner, here
            if code.co_name == "<module>":
                return here, None
            inner = here
        frame = frame.f_back
    return inner, None


@dataclass
class CallerContext:
    """The user's line and the library call chain between it and the hook."""

    location: SourceLocation | None
    library_frame: str | None  # innermost library frame outside gradguard: "torch/optim/adadelta.py:302 in _single_tensor_adadelta"
    owner: object | None  # the outermost library ``self`` the user called into (an optimizer, a module)


# Dispatch and compile wrappers that sit between every op and its caller: never the interesting frame.
_PLUMBING = ("/_dynamo/", "/utils/_python_dispatch.py", "/_ops.py", "/overrides.py", "/_compile.py",
             "/utils/_contextlib.py", "/optim/optimizer.py", "/nn/modules/module.py")


def is_gradguard_file(filename: str) -> bool:
    """A file of gradguard itself (its frames are never the user's, nor the library call the user made)."""
    return filename.startswith(_GRADGUARD_DIR)


def is_plumbing(filename: str) -> bool:
    """A dispatch or compile wrapper's file (never the frame that matters to the user)."""
    filename = filename.replace(os.sep, "/")
    return any(p in filename for p in _PLUMBING)


def caller_context(
    skip: int = 1,
    paths: LibraryPaths = LIBRARY_PATHS,
    owner_filter: Callable[[object], bool] | None = None,
) -> CallerContext:
    """Like :func:`user_location`, and also says which library call the user made (for writes).

    ``owner_filter`` picks, among the ``self`` objects of the library frames, the one to name
    (e.g. "is an optimizer or a module"); the outermost match wins because that is what the user called.
    """
    frame: FrameType | None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return CallerContext(None, None, None)
    innermost_lib = None
    owner = None
    is_library = paths.is_library
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename):
            return CallerContext(location_of(frame), innermost_lib, owner)
        if not is_gradguard_file(filename) and not is_plumbing(filename):
            if innermost_lib is None:
                parts = filename.replace(os.sep, "/").split("/site-packages/")
                short = parts[-1] if len(parts) > 1 else filename
                innermost_lib = f"{short}:{frame.f_lineno} in {frame.f_code.co_name}"
            if owner_filter is not None:
                candidate = frame.f_locals.get("self")
                if candidate is not None and owner_filter(candidate):
                    owner = candidate
        frame = frame.f_back
    return CallerContext(None, innermost_lib, owner)


def user_variable_names(ids: set[int], paths: LibraryPaths = LIBRARY_PATHS,
                        start: FrameType | None = None) -> dict[int, str]:
    """Variable names bound to the objects with these ids in the user's frames, innermost frame first
    (``rnn`` for ``rnn = nn.RNN(...)``), from ``start`` (a traceback's frame) or the caller's. Error paths only: it
    reads every user frame's locals and globals."""
    names: dict[int, str] = {}
    for frame in user_frames(start or sys._getframe(1), paths):
        for scope in (frame.f_locals, frame.f_globals):
            for var, value in list(scope.items()):
                if id(value) in ids and id(value) not in names and not var.startswith("_"):
                    names[id(value)] = var
    return names


def user_frames(frame: FrameType | None, paths: LibraryPaths = LIBRARY_PATHS) -> Iterator[FrameType]:
    """The frames of the user's code from ``frame`` outwards (library frames skipped)."""
    while frame is not None:
        if not paths.is_library(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def innermost_user_entry(tb: TracebackType | None, paths: LibraryPaths = LIBRARY_PATHS) -> TracebackType | None:
    """The innermost traceback entry in user code (where a framework error surfaced in the user's program)."""
    found = None
    while tb is not None:
        if not paths.is_library(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    return found


def notice(message: str, category: type[Warning], stacklevel: int | None = None) -> None:
    """``warnings.warn`` that never raises, attributed to the user's line (``stacklevel``: None for the innermost
    frame outside gradguard, torch and the standard library's context managers).

    # NOTE [A notice never raises inside torch]
    # Notices are emitted from saved-tensor hooks and from torch.func's hook switch. Under ``-W error`` or
    # ``PYTHONWARNINGS=error`` the user's filters turn a warning into an exception, which then unwinds through
    # PyTorch's hook stack (an INTERNAL ASSERT in SavedTensorHooks.cpp) and fails a legal program. The user's
    # filters still decide ("ignore" hides the notice); an "error" filter is shown as the warning it is, on
    # stderr, instead of raising.
    """
    frame: FrameType | None
    if stacklevel is None:
        stacklevel, frame = 2, sys._getframe(1)  # stacklevel 1 is this function
        while frame is not None and LIBRARY_PATHS.is_library(frame.f_code.co_filename):
            stacklevel, frame = stacklevel + 1, frame.f_back
        if frame is None:
            stacklevel = 2
    try:
        warnings.warn(message, category, stacklevel=stacklevel)
    except Warning as raised:
        frame, depth = sys._getframe(), 1  # the frame ``stacklevel`` names, or the outermost one
        while frame.f_back is not None and depth < stacklevel:
            frame, depth = frame.f_back, depth + 1
        warnings.showwarning(raised, category, frame.f_code.co_filename, frame.f_lineno)
