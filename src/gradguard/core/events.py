"""The typed event stream between the framework probes and the guard engine.

A probe (``backends/<framework>/session.py``) turns its framework's hooks into these events and hands
them to :class:`gradguard.core.engine.GuardEngine`; the engine owns what follows (records, ledger,
checks, findings, raising). Events carry facts only: the framework's tensor object travels as an opaque
``tensor`` field and is never inspected here.

# NOTE [Why slotted, not frozen, dataclasses]
# One event is built per saved tensor and per unpack, on the training loop's hot path: slots keep them small
# and a plain ``__init__`` costs ~0.15 us, where a frozen dataclass's ``object.__setattr__`` per field costs
# ~0.6 us (measured on torch's pack hook). Subscribers treat events as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .findings import SourceLocation

if TYPE_CHECKING:
    from .engine import SavedRecord

__all__ = ["Event", "TensorSaved", "TensorWritten", "TensorUnpacked", "BackwardStarted", "BackwardEnded",
           "FunctionBoundary", "LineReached"]


@dataclass(slots=True, eq=False)
class TensorSaved:
    """The framework saved ``tensor`` for backward (a pack hook ran)."""

    tensor: Any
    location: SourceLocation | None  # the user's line that made the saving op run
    saver: str | None = None  # the op that saved it, as the user wrote it ("sin", "MySin.forward (...)")
    producer: str | None = None  # the autograd node that produced it, when the framework says
    custom_function: str | None = None  # the custom autograd function whose ctx saved it (PyLayer, bprop Cell)
    caller: SourceLocation | None = None  # the user's call around ``location`` (the call of the model)
    kept_on: tuple[str, str] | None = None  # (node, "ctx.x"): kept on a custom function's ctx, not saved


@dataclass(slots=True, eq=False)
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
    records: list[SavedRecord] | None = None  # the saved records it hits, when the probe matched them itself (element-wise
    # overlap of strided views); versions None: logged before the write ran, each record's own version is read


@dataclass(slots=True, eq=False)
class TensorUnpacked:
    """Backward asked for a saved tensor back (an unpack hook ran) with the record the pack hook returned."""

    record: Any


@dataclass(slots=True, eq=False)
class BackwardStarted:
    location: SourceLocation | None  # the user's backward line


@dataclass(slots=True, eq=False)
class BackwardEnded:
    location: SourceLocation | None
    failed: bool = False  # backward raised: the engine must not replace the user's error


@dataclass(slots=True, eq=False)
class FunctionBoundary:
    """A custom autograd function (PyLayer, Cell with bprop, autograd.Function) entered or left a phase."""

    name: str
    phase: str  # "forward" | "backward"
    entering: bool


@dataclass(slots=True, eq=False)
class LineReached:
    """Bisect mode: the user's program is about to run ``location`` (the previous line has finished)."""

    location: SourceLocation


Event = TensorSaved | TensorWritten | TensorUnpacked | BackwardStarted | BackwardEnded | FunctionBoundary | LineReached
