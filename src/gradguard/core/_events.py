"""The typed event stream between the framework probes and the guard engine.

A probe (``backends/<framework>/_session.py``) turns its framework's hooks into these events and hands
them to :class:`gradguard.core._engine.GuardEngine`; the engine owns what follows (records, ledger,
checks, findings, raising). Events carry facts only: the framework's tensor object travels as an opaque
``tensor`` field and is never inspected here.

# NOTE [Why frozen, slotted dataclasses]
# One event is built per saved tensor and per watched write: slots keep them small, frozen keeps a
# subscriber from editing what the next subscriber sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._findings import SourceLocation

__all__ = [
    "Event",
    "TensorSaved",
    "TensorWritten",
    "TensorUnpacked",
    "BackwardStarted",
    "BackwardEnded",
    "FunctionBoundary",
    "LineReached",
]


@dataclass(frozen=True, slots=True)
class TensorSaved:
    """The framework saved ``tensor`` for backward (a pack hook ran)."""

    tensor: Any
    location: SourceLocation | None  # the user's line that made the saving op run
    saver: str | None = None  # the op that saved it, as the user wrote it ("sin", "MySin.forward (...)")
    producer: str | None = None  # the autograd node that produced it, when the framework says
    custom_function: str | None = None  # the custom autograd function whose ctx saved it (PyLayer, bprop Cell)


@dataclass(frozen=True, slots=True)
class TensorWritten:
    """A watched write into ``target`` finished. ``version_before == version_after``: a silent write."""

    target: Any
    op: str  # "paddle.Tensor.add_", "mindspore.ops.assign"
    category: str  # WriteRecord.category: activation | index_assign | copy | other ...
    location: SourceLocation | None
    library_frame: str | None = None
    version_before: int | None = None
    version_after: int | None = None
    via: str | None = None
    span: tuple[int, int, int] | None = None  # (storage key, start, end) taken BEFORE the write: some writes
    # (MindSpore's ``t[i] = v``) move the target's data pointer


@dataclass(frozen=True, slots=True)
class TensorUnpacked:
    """Backward asked for a saved tensor back (an unpack hook ran) with the record the pack hook returned."""

    record: Any


@dataclass(frozen=True, slots=True)
class BackwardStarted:
    location: SourceLocation | None  # the user's backward line


@dataclass(frozen=True, slots=True)
class BackwardEnded:
    location: SourceLocation | None
    failed: bool = False  # backward raised: the engine must not replace the user's error


@dataclass(frozen=True, slots=True)
class FunctionBoundary:
    """A custom autograd function (PyLayer, Cell with bprop, autograd.Function) entered or left a phase."""

    name: str
    phase: str  # "forward" | "backward"
    entering: bool


@dataclass(frozen=True, slots=True)
class LineReached:
    """Bisect mode: the user's program is about to run ``location`` (the previous line has finished)."""

    location: SourceLocation


Event = TensorSaved | TensorWritten | TensorUnpacked | BackwardStarted | BackwardEnded | FunctionBoundary | LineReached
