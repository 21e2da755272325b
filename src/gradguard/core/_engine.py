"""The guard engine: one pipeline (saved -> ledger -> unpack check -> finding -> raise) for every framework.

A framework contributes a *probe*: hooks that emit :mod:`gradguard.core._events` and answer a few
questions about its tensors (:class:`Probe`). Everything else lives here, once: the saved records, the
ledger that matches writes to saved memory, version and fingerprint comparison at unpack, finding
assembly through :func:`gradguard.core._diagnosis.diagnose`, raising, and bisect mode.

# NOTE [Raising: at unpack or after backward]
# MindSpore propagates an exception raised in an unpack hook cleanly, so the engine raises there. Paddle
# leaves autograd globally disabled after one, so its probe sets ``raise_at_unpack = False``: the engine
# only records the problem at unpack and raises at ``BackwardEnded`` (the user's backward line, where the
# framework itself would raise) or at the end of the guard.
#
# NOTE [One "sample" fingerprint]
# ``fingerprint="sample"`` hashes the same bytes on every backend: 16 chunks of 4 KiB, evenly spaced, the
# first starting at byte 0 and the last ending at the last byte (:func:`sample_spans`). The torch backend's
# device digest samples with the same spans.
#
# NOTE [Bisect without a per-op hook]
# Paddle has no dispatch mode, and MindSpore's does not see NumPy aliases or ``asnumpy()`` writes. Bisect
# mode therefore traces the user's lines (``sys.settrace``, user files only) and re-checks every live saved
# tensor's fingerprint when a new user line starts: a change that no watched write explains is pinned to
# the line that just finished. Cost: one hash of every live saved tensor per user line, for diagnosis
# re-runs only. Only the thread that entered the guard is traced; the finding says so.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable, Protocol

from ._diagnosis import diagnose, diagnose_or_fallback
from ._events import (
    BackwardEnded,
    BackwardStarted,
    FunctionBoundary,
    LineReached,
    TensorSaved,
    TensorUnpacked,
    TensorWritten,
)
from ._findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ._frames import LIBRARY_PATHS
from ._ledger import SavedLedger

__all__ = ["GuardEngine", "Probe", "SavedRecord", "SAMPLE_BYTES", "sample_spans", "fingerprint_bytes", "phrase_fix"]

SAMPLE_BYTES = 64 * 1024
_SAMPLE_CHUNKS = 16


def sample_spans(nbytes: int) -> list[tuple[int, int]]:
    """The byte ranges ``fingerprint="sample"`` hashes (see NOTE [One "sample" fingerprint])."""
    if nbytes <= SAMPLE_BYTES:
        return [(0, nbytes)]
    chunk = SAMPLE_BYTES // _SAMPLE_CHUNKS
    step = (nbytes - chunk) // (_SAMPLE_CHUNKS - 1)
    starts = [i * step for i in range(_SAMPLE_CHUNKS - 1)] + [nbytes - chunk]
    return [(s, s + chunk) for s in starts]


def fingerprint_bytes(raw, mode: str = "full") -> int:
    """xxh3-64 of a C-contiguous buffer's bytes (all of them, or the sample spans)."""
    import xxhash

    view = memoryview(raw).cast("B")
    if mode == "sample" and view.nbytes > SAMPLE_BYTES:
        hasher = xxhash.xxh3_64()
        for start, end in sample_spans(view.nbytes):
            hasher.update(view[start:end])
        return hasher.intdigest()
    return xxhash.xxh3_64_intdigest(view)


def phrase_fix(finding: Finding, phrasebook: dict[str, str]) -> Finding:
    """A framework's phrasebook: its spelling of the fix for a rule whose core wording names torch APIs."""
    fix = phrasebook.get(finding.rule)
    if fix is not None:
        finding.suggestion = fix
    return finding


class Probe(Protocol):
    """What the engine asks a framework. Implementations: ``backends/{paddle,mindspore}/_session.py``.

    Optional: ``fingerprint(t, mode)`` and ``same_fingerprint(a, b)`` replace the host-bytes hash (torch's
    on-device digest needs no host copy at pack)."""

    backend: str
    framework: str  # how the user spells it: "Paddle", "MindSpore"
    raise_at_unpack: bool
    direct_writers: str  # who writes memory without the framework's ops (a phrase, for explanations)
    direct_write_fix: str  # the fix for such a write
    optimizer_fix: str  # the fix for an optimizer update between a forward and its backward

    def version(self, t: Any) -> int | None: ...

    def span(self, t: Any) -> tuple[int, int, int] | None: ...  # (storage key, start byte, end byte)

    def host_bytes(self, t: Any): ...  # a C-contiguous buffer of the tensor's values (numpy), or None

    def describe(self, t: Any) -> TensorInfo: ...  # shape, dtype, device, qualified name and role

    def context(self) -> dict: ...  # Finding.context: mode, framework version, device

    def saver_name(self, record: "SavedRecord", tensor: TensorInfo) -> str | None: ...  # the op that saved it

    def phrase(self, finding: Finding, record: "SavedRecord") -> None: ...  # framework wording, notes

    def restore_after_error(self) -> None: ...  # undo what a failed unpack may have left (Paddle's grad mode)


class SavedRecord:
    """What a pack hook returns. Deliberately not a sequence: Paddle's PyLayer would iterate one."""

    __slots__ = ("tensor", "version", "fp", "site", "saver", "producer", "custom_function", "writes", "reported",
                 "__weakref__")

    def __init__(self, tensor, version, fp, site, saver, producer, custom_function):
        self.tensor = tensor
        self.version = version
        self.fp = fp
        self.site = site
        self.saver = saver
        self.producer = producer
        self.custom_function = custom_function
        self.writes: list[WriteRecord] | None = None
        self.reported = False


class GuardEngine:
    """Consumes a probe's events; owns records, the ledger, checks, findings and raising."""

    def __init__(self, probe: Probe, *, fingerprint: str = "full", track_writes: bool = True, bisect: bool = False):
        if bisect:  # bisect needs the write log (to tell explained changes apart) and full fingerprints, as torch's
            fingerprint, track_writes = "full", True
        self.probe = probe
        self.fingerprint_mode = fingerprint
        self.track_writes = track_writes
        self.bisect = bisect
        self.ledger = SavedLedger()
        self.findings: list[Finding] = []
        self.backward_sites: list[SourceLocation] = []
        self.subscribers: list[Callable[[Any], None]] = []
        self._pending: list[tuple[Finding, type]] = []
        self._lock = threading.Lock()
        self._bisect: _LineBisector | None = None
        self._handlers = {
            TensorSaved: self._saved,
            TensorWritten: self._written,
            TensorUnpacked: self._unpacked,
            BackwardStarted: self._backward_started,
            BackwardEnded: self._backward_ended,
            FunctionBoundary: lambda event: None,  # for subscribers only (no probe emits it yet)
            LineReached: self._line_reached,
        }

    # -- the event entry point --------------------------------------------------------------------
    def emit(self, event) -> Any:
        """Handle one event; returns the pack record for TensorSaved and the tensor for TensorUnpacked."""
        try:
            return self._handlers[type(event)](event)
        finally:  # subscribers (reports, advisors) see the event even when its handler raised the finding
            for subscriber in self.subscribers:
                subscriber(event)

    def watches(self, target) -> list[SavedRecord]:
        """The live records whose memory ``target`` overlaps (probes skip logging writes elsewhere)."""
        if not len(self.ledger):
            return []
        span = self.probe.span(target)
        return self.ledger.overlapping(*span) if span is not None else []

    def watch_update(self, targets, run: Callable[[], Any], *, op: str, category: str, via: str | None = None):
        """Run ``run()`` (an optimizer step, a compiled call) that may write ``targets`` without the write log
        seeing it; emit a TensorWritten for each saved target whose version or bytes it changed.
        Only targets saved for backward are compared (one hash each, before and after)."""
        probe = self.probe
        watched = [(t, probe.span(t), probe.version(t), self._full_fingerprint(t)) for t in targets if self.watches(t)]
        out = run()
        if watched:
            from ._frames import caller_context

            context = caller_context(skip=3)
            for t, span, before, fp in watched:
                after = probe.version(t)
                if after != before or self._full_fingerprint(t) != fp:
                    self.emit(TensorWritten(t, op, category, context.location, context.library_frame, before, after,
                                            via=via, span=span))
        return out

    def _full_fingerprint(self, t) -> int | None:
        raw = self.probe.host_bytes(t)
        return None if raw is None else fingerprint_bytes(raw, "full")

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, skip: int = 2) -> None:
        if self.bisect:
            self._bisect = _LineBisector(self)
            self._bisect.start(sys._getframe(skip))

    def stop(self) -> None:
        if self._bisect is not None:
            self._bisect.stop()
            self._bisect = None
        self.raise_pending()

    # -- handlers ---------------------------------------------------------------------------------
    def fingerprint(self, t):
        """The saved-time/unpack-time fingerprint: the probe's own when it has one (a device digest that needs
        no host copy), else the core hash of its host bytes."""
        if self.fingerprint_mode == "off":
            return None
        own = getattr(self.probe, "fingerprint", None)
        if own is not None:
            return own(t, self.fingerprint_mode)
        raw = self.probe.host_bytes(t)
        return None if raw is None else fingerprint_bytes(raw, self.fingerprint_mode)

    def same(self, a, b) -> bool:
        own = getattr(self.probe, "same_fingerprint", None)
        return own(a, b) if own is not None else a == b

    def _saved(self, event: TensorSaved) -> SavedRecord:
        t = event.tensor
        record = SavedRecord(t, self.probe.version(t), self.fingerprint(t), event.location, event.saver,
                             event.producer, event.custom_function)
        if self.track_writes or self.bisect:
            span = self.probe.span(t)
            if span is not None:
                self.ledger.add(record, *span)
        return record

    def _written(self, event: TensorWritten) -> None:
        records = self.ledger.overlapping(*event.span) if event.span is not None else self.watches(event.target)
        if not records:
            return
        before, after = event.version_before, event.version_after
        write = WriteRecord(op=event.op, location=event.location, via=event.via, library_frame=event.library_frame,
                            version_before=before, version_after=after,
                            bumps_version=before is None or after is None or after > before, category=event.category)
        with self._lock:
            for record in records:
                if record.writes is None:
                    record.writes = []
                record.writes.append(write)
        if self._bisect is not None:
            self._bisect.rebase(records)

    def _unpacked(self, event: TensorUnpacked):
        record = event.record
        if not isinstance(record, SavedRecord):
            return record
        t = record.tensor
        kind = None
        try:
            if self._bisect is not None:
                self._bisect.check(None)
            now = self.probe.version(t) if record.version is not None else None
            if record.version is not None and now != record.version:
                kind = "inplace_modification"
            elif record.fp is not None and not self.same(self.fingerprint(t), record.fp):
                kind = "silent_write"
            elif record.fp is None and record.writes and self.fingerprint_mode == "off":
                kind = "silent_write"
        except Exception as internal:  # our failure must never break the user's backward: say so, go on
            import warnings

            warnings.warn(f"gradguard ({self.probe.backend} guard engine): the saved-tensor check failed "
                          f"({internal!r}); this tensor was not checked", RuntimeWarning, stacklevel=2)
        if kind is not None and not record.reported:
            record.reported = True
            finding = diagnose_or_fallback(lambda: self._finding(record, kind), kind=kind, shape=t.shape,
                                           dtype=t.dtype, backend=self.probe.backend)
            from .._errors import error_for

            if self.probe.raise_at_unpack:
                with self._lock:
                    self.findings.append(finding)
                raise error_for(kind)(finding)
            with self._lock:
                self._pending.append((finding, error_for(kind)))
        return t

    def _backward_started(self, event: BackwardStarted) -> None:
        if event.location is not None:
            self.backward_sites = (self.backward_sites + [event.location])[-8:]

    def _backward_ended(self, event: BackwardEnded) -> None:
        if self._pending and not event.failed:
            self.raise_pending()

    def _line_reached(self, event: LineReached) -> None:
        if self._bisect is not None:
            self._bisect.check(event.location)

    # -- findings ---------------------------------------------------------------------------------
    def raise_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        self.probe.restore_after_error()
        with self._lock:
            self.findings.extend(f for f, _e in pending)
        finding, error = pending[0]
        if len(pending) > 1:
            finding.notes.append(f"{len(pending) - 1} more saved tensor(s) of this backward were also modified")
        raise error(finding)

    def _finding(self, record: SavedRecord, kind: str) -> Finding:
        t = record.tensor
        tensor = self.probe.describe(t)
        if record.producer not in (None, "leaf") and tensor.producer is None:
            tensor.producer = record.producer
        if tensor.role == "tensor":
            tensor.role = "leaf" if record.producer == "leaf" else "activation"
        finding = Finding(
            kind=kind,
            tensor=tensor,
            saved_at=SaveSite(node=self.probe.saver_name(record, tensor), location=record.site),
            modified_at=list(record.writes or []),
            versions={"saved": record.version, "now": self.probe.version(t)},
            backend=self.probe.backend,
            context=self.probe.context(),
        )
        if self.backward_sites:
            finding.context.setdefault("backward_at", self.backward_sites[-1].to_dict())
        if not self.track_writes:
            finding.notes.append("write tracking was off: re-run with track_writes=True to see which line wrote "
                                 "the tensor")
        if self.bisect:
            finding.notes.append("bisect mode traced the user's lines on the thread that entered the guard; writes "
                                 "from other threads are not pinned")
        diagnose(finding)
        if finding.rule == "silent_kernel_write":
            self._direct_write_phrase(finding)
        elif finding.rule == "fused_optimizer":
            self._optimizer_phrase(finding)
        self.probe.phrase(finding, record)
        return finding

    def _optimizer_phrase(self, finding: Finding) -> None:
        """An optimizer update no version counter saw. The core rule names torch's fused kernels; in Paddle and
        MindSpore every optimizer updates without a version bump, so the cause is the order of the calls."""
        framework = self.probe.framework
        step = next(w for w in finding.modified_at if w.category == "optimizer")
        where = step.location.short if step.location else "an unknown line"
        finding.rule = "optimizer_step_before_backward"
        finding.explanation = (
            f"{step.via} at {where} updated {finding.tensor.name or 'a parameter'} in place after "
            f"{finding.saved_at.op or 'an op'} saved it for a backward pass that had not run yet. {framework}'s "
            f"optimizers do not bump the version counter, so {framework} computes that backward with the updated "
            "values and no error."
        )
        finding.suggestion = self.probe.optimizer_fix

    def _direct_write_phrase(self, finding: Finding) -> None:
        """Framework wording for a silent write no framework op made (the core rule's text speaks torch)."""
        probe = self.probe
        saver = finding.saved_at.op or "the op that saved it"
        outside = next((w for w in finding.modified_at if w.category == "outside"), None)
        if outside is not None:
            where = outside.location.short if outside.location else "before the first traced line"
            finding.explanation = (f"No {probe.framework} op wrote it: bisect mode saw its bytes change at {where}, "
                                   f"in {probe.direct_writers}. {saver} still needed the old values.")
        else:
            finding.explanation = (f"No {probe.framework} op that gradguard watches wrote it, so the writer is "
                                   f"{probe.direct_writers}. Re-run with `gradguard.guard(bisect=True)` to pin it to "
                                   f"a line. {saver} still needed the old values.")
        finding.suggestion = probe.direct_write_fix


class _LineBisector:
    """Re-checks live saved tensors at every new user line (see NOTE [Bisect without a per-op hook])."""

    def __init__(self, engine: GuardEngine):
        self.engine = engine
        # id(record) -> (weak ref to the record, fp, version, number of logged writes): weak, never keeps a tensor
        self.baseline: dict[int, tuple[weakref.ref, int | None, int | None, int]] = {}
        self.last: SourceLocation | None = None
        self._previous_trace = None
        self._frames: list = []
        self._thread = threading.get_ident()
        import sysconfig

        paths = sysconfig.get_paths()
        # installed packages and the standard library are not the user's program (numpy's own Python code runs
        # inside `t.asnumpy()[0] = v`: its lines must not become "the last user line")
        self._installed = tuple({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)})
        self._user: dict[str, bool] = {}

    def _is_user(self, filename: str) -> bool:
        user = self._user.get(filename)
        if user is None:
            user = self._user[filename] = not (LIBRARY_PATHS.is_library(filename) or filename.startswith(self._installed)
                                               or filename.startswith("<"))  # generated code: dataclass __init__
        return user

    def start(self, frame) -> None:
        self._previous_trace = sys.gettrace()
        sys.settrace(self._global)
        while frame is not None:  # the frames already running (the `with` block) trace too
            if self._is_user(frame.f_code.co_filename):
                self._frames.append((frame, frame.f_trace))
                frame.f_trace = self._local
            frame = frame.f_back

    def stop(self) -> None:
        sys.settrace(self._previous_trace)
        for frame, previous in self._frames:
            frame.f_trace = previous
        self._frames = []

    def _global(self, frame, event, arg):
        if event == "call" and self._is_user(frame.f_code.co_filename):
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line" and threading.get_ident() == self._thread:
            code = frame.f_code
            self.engine.emit(LineReached(SourceLocation(code.co_filename, frame.f_lineno, code.co_name)))
        return self._local

    def rebase(self, records) -> None:
        for record in records:
            self.baseline[id(record)] = (weakref.ref(record), self.engine.fingerprint(record.tensor),
                                         self.engine.probe.version(record.tensor), len(record.writes or ()))

    def check(self, location: SourceLocation | None) -> None:
        """Compare every live saved tensor with its baseline; pin an unexplained change to the last line."""
        engine = self.engine
        self.baseline = {k: v for k, v in self.baseline.items() if v[0]() is not None}
        for record in list(engine.ledger.live_records()):
            if record.fp is None:
                continue
            entry = self.baseline.get(id(record))
            fp, version, nwrites = (entry[1], entry[2], entry[3]) if entry and entry[0]() is record else (
                record.fp, record.version, 0)
            t = record.tensor
            now, version_now, writes = engine.fingerprint(t), engine.probe.version(t), len(record.writes or ())
            if not engine.same(now, fp) and version_now == version and writes == nwrites:
                # The line that just finished made the change (None: before the first traced line).
                write = WriteRecord(op=f"write outside {engine.probe.backend} ops", location=self.last,
                                    version_before=version, version_after=version_now, bumps_version=False,
                                    category="outside")
                with engine._lock:
                    if record.writes is None:
                        record.writes = []
                    record.writes.append(write)
                writes += 1
            self.baseline[id(record)] = (weakref.ref(record), now, version_now, writes)
        if location is not None:
            self.last = location
