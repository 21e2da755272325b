"""The guard engine: one pipeline (saved -> ledger -> unpack check -> finding -> raise) for every framework.

A framework contributes a *probe*: hooks that emit :mod:`gradguard.core.events` and answer a few
questions about its tensors (:class:`Probe`). Everything else lives here, once: the saved records, the
ledger that matches writes to saved memory, version and fingerprint comparison at unpack, finding
assembly through :func:`gradguard.core.diagnosis.diagnose`, raising (with every other stale saved tensor),
tensors a custom function keeps on ctx, hazards found outside saved tensors, and bisect mode. Probes:
``backends/{torch,paddle,mindspore}/session.py``.

# NOTE [Raising: at unpack or after backward]
# PyTorch and MindSpore propagate an exception raised in an unpack hook cleanly, so the engine raises there. Paddle
# leaves autograd globally disabled after one, so its probe sets ``raise_at_unpack = False``: the engine
# only records the problem at unpack and raises at ``BackwardEnded`` (the user's backward line, where the
# framework itself would raise) or at the end of the guard.
#
# NOTE [One "sample" fingerprint]
# ``fingerprint="sample"`` hashes the same bytes on every backend: 16 chunks of 4 KiB, evenly spaced, the
# first starting at byte 0 and the last ending at the last byte (:func:`sample_spans`). The torch backend's
# device path copies the same 16 evenly spaced windows, each widened to whole elements and to end exactly at the
# last element (torch's ``fingerprint.device_sample``).
#
# NOTE [Bisect without a per-op hook]
# Paddle has no dispatch mode, and MindSpore's does not see NumPy aliases or ``asnumpy()`` writes. Bisect
# mode therefore traces the user's lines (``sys.settrace``, user files only) and re-checks every live saved
# tensor's fingerprint when a new user line starts: a change that no watched write explains is pinned to
# the line that just finished. Cost: one hash of every live saved tensor per user line, for diagnosis
# re-runs only. Only the thread that entered the guard is traced; the finding says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import sys
import sysconfig
import threading
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, NoReturn, Protocol, TypeVar

import xxhash

from .diagnosis import diagnose, diagnose_or_fallback
from .events import (BackwardEnded, BackwardStarted, FunctionBoundary, LineReached, TensorSaved, TensorUnpacked,
                     TensorWritten)
from .facts import Facts
from .findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from .frames import LIBRARY_PATHS, caller_context, notice
from .ledger import SavedLedger

if TYPE_CHECKING:
    # a function for sys.settrace (typeshed's _typeshed.TraceFunction; core imports only the standard library)
    TraceFunction = Callable[[FrameType, Literal["call", "line", "return", "exception", "opcode"], Any], Any]

    _V = TypeVar("_V")

    class _Field(Protocol[_V]):
        """How the type checker sees a ``_seldom`` field: a ``property`` whose value has type ``_V``."""

        def __get__(self, record: SavedRecord, owner: type | None = None, /) -> _V: ...

        def __set__(self, record: SavedRecord, value: _V, /) -> None: ...

_T = TypeVar("_T")

__all__ = ["GuardEngine", "Probe", "SavedRecord", "SAMPLE_BYTES", "sample_spans", "fingerprint_bytes", "phrase_fix"]

SAMPLE_BYTES = 64 * 1024
_SAMPLE_CHUNKS = 16


@functools.lru_cache(maxsize=512)  # a model saves a few sizes, each many times (1.5 us -> 0.1 us per hash)
def sample_spans(nbytes: int) -> tuple[tuple[int, int], ...]:
    """The byte ranges ``fingerprint="sample"`` hashes (see NOTE [One "sample" fingerprint])."""
    if nbytes <= SAMPLE_BYTES:
        return ((0, nbytes),)
    chunk = SAMPLE_BYTES // _SAMPLE_CHUNKS
    step = (nbytes - chunk) // (_SAMPLE_CHUNKS - 1)
    starts = [i * step for i in range(_SAMPLE_CHUNKS - 1)] + [nbytes - chunk]
    return tuple((s, s + chunk) for s in starts)


def _nbytes(raw: Any) -> int:
    nbytes = getattr(raw, "nbytes", None)  # numpy arrays and memoryviews say it without a new view
    return memoryview(raw).nbytes if nbytes is None else nbytes


def fingerprint_bytes(raw: Any, mode: str = "full") -> int:
    """xxh3-64 of a C-contiguous buffer's bytes (all of them, or the sample spans)."""
    if mode == "sample" and _nbytes(raw) > SAMPLE_BYTES:
        view = memoryview(raw).cast("B")  # byte offsets for the spans
        hasher = xxhash.xxh3_64()
        for start, end in sample_spans(view.nbytes):
            hasher.update(view[start:end])
        return hasher.intdigest()
    return xxhash.xxh3_64_intdigest(raw)  # the same bytes as its "B" cast, without building the view (~0.25 us)


def phrase_fix(finding: Finding, phrasebook: dict[str, str]) -> Finding:
    """A framework's phrasebook: its spelling of the fix for a rule whose core wording names torch APIs."""
    fix = phrasebook.get(finding.rule)
    if fix is not None:
        finding.suggestion = fix
    return finding


class Probe(Protocol):
    """What the engine asks a framework. Implementations: ``backends/{torch,paddle,mindspore}/session.py``.

    Optional: ``fingerprint(t, mode)`` and ``same_fingerprint(a, b)`` replace the host-bytes hash (torch's
    on-device digest needs no host copy at pack); ``annotate(finding, record, current)`` adds framework facts the
    diagnosis rules read (graph node, where the loss was made) before they run; ``allowed_change(record)`` names a
    content change the framework makes on purpose (BatchNorm's running stats); ``name_at_write(t)`` names a saved
    tensor in the frame that first writes it; ``finding_scope()`` is a context manager entered while one finding is
    built (the framework may share heap scans across the questions it answers meanwhile)."""

    backend: str
    framework: str  # how the user spells it: "PyTorch", "Paddle", "MindSpore"
    raise_at_unpack: bool
    direct_writers: str | None  # who writes memory without the framework's ops (a phrase); None: core wording
    direct_write_fix: str  # the fix for such a write
    optimizer_fix: str  # the fix for an optimizer update between a forward and its backward

    def version(self, t: Any) -> int | None: ...

    def span(self, t: Any) -> tuple[int, int, int] | None: ...  # (storage key, start byte, end byte)

    def host_bytes(self, t: Any) -> Any: ...  # a C-contiguous buffer of the tensor's values (numpy), or None

    def describe(self, t: Any) -> TensorInfo: ...  # shape, dtype, device, qualified name and role

    def context(self) -> Facts: ...  # a new Facts for each finding: mode, framework version, device

    def saver(self, record: "SavedRecord", tensor: TensorInfo) -> tuple[str | None, str | None]: ...  # (op, argument)

    def phrase(self, finding: Finding, record: "SavedRecord") -> None: ...  # framework wording, notes

    def restore_after_error(self) -> None: ...  # undo what a failed unpack may have left (Paddle's grad mode)


class Bisector(Protocol):
    """What the engine's bisector slot holds: its own line tracer (``_LineBisector``) or a probe's own (torch: a
    dispatch mode), see ``GuardEngine.attach_bisector``."""

    def check(self, location: SourceLocation | None) -> None: ...

    def rebase(self, records: Iterable[SavedRecord]) -> None: ...

    def stop(self) -> None: ...


# NOTE [A small record per saved tensor]
# A record lives as long as the graph that saved its tensor, one per saved tensor (issue 17's target: Python
# records within 0.2 KiB per saved tensor, measured by benchmarks/bench_records.py). Its Python memory is the
# record itself, the ``detach()`` alias it keeps (80 bytes, NOTE [What pack keeps] in the torch probe) and the
# fingerprint (a 64-bit int, 36 bytes). So the record keeps only what every saved tensor has in its own slots:
# where it was saved (the user's line, the call around it, the producing node, and how many backward passes
# had run) is one ``SavePlace`` shared by every record saved there in the same pass, and the fields most records
# never set (a custom function's names, a ctx attribute, logged writes) live in one dict made on first use. Only
# the ledger's records (write tracking on) take a weak-reference slot. 14 slots took 144 bytes; the five here
# take 72 (80 with the weak reference). On torch 2.4 the alias is 88 bytes.


@dataclasses.dataclass(slots=True, eq=False)
class SavePlace:
    """Where tensors were saved: the user's line, the user's call around it, the node that produced them, and
    how many backward passes had run by then."""

    site: SourceLocation | None
    caller: SourceLocation | None
    producer: str | None
    passes_at_save: int


# The shared ``SavePlace`` per place and pass, keyed by the locations' identities: a ``SavePlace`` in the table
# holds its locations, so their ids cannot be reused while it is there.
_SAVE_PLACES: dict[tuple[int, int, str | None, int], SavePlace] = {}
_SAVE_PLACES_MAX = 4096  # distinct places kept before the table starts over (records keep their own)


def _seldom(name: str, default: object = None) -> _Field[Any]:
    """A record field most records never set, kept in the record's ``_seldom`` dict (a ``property``; the class
    body declares each field's type: ``saver: _Field[str | None] = _seldom("saver")``)."""

    def get(record: SavedRecord) -> Any:
        seldom = record._seldom
        return default if seldom is None else seldom.get(name, default)

    def set_(record: SavedRecord, value: object) -> None:
        if record._seldom is None:
            record._seldom = {}
        record._seldom[name] = value

    return property(get, set_)


def _placed(name: str) -> _Field[Any]:
    """A record field its shared ``SavePlace`` holds (read only)."""
    return property(operator.attrgetter("where." + name))


class SavedRecord:
    """What a pack hook returns; the framework keeps it exactly as long as the graph needs the tensor.
    Deliberately not a sequence: Paddle's PyLayer would iterate one. NOTE [A small record per saved tensor]."""

    __slots__ = ("tensor", "version", "fp", "where", "_seldom")
    tensor: Any  # the framework's tensor (an alias that shares its memory)
    version: int | None
    fp: object  # the fingerprint: an int (the host-bytes hash), a probe's own device digest, or None (off)
    where: SavePlace

    def __init__(self, tensor: Any, version: int | None, fp: object, site: SourceLocation | None,
                 saver: str | None = None, producer: str | None = None, custom_function: str | None = None,
                 caller: SourceLocation | None = None, kept_on: tuple[str, str] | None = None,
                 passes_at_save: int = 0) -> None:
        self.tensor = tensor
        self.version = version
        self.fp = fp
        key = (id(site), id(caller), producer, passes_at_save)
        where = _SAVE_PLACES.get(key)
        if where is None:
            if len(_SAVE_PLACES) >= _SAVE_PLACES_MAX:
                _SAVE_PLACES.clear()
            where = _SAVE_PLACES[key] = SavePlace(site, caller, producer, passes_at_save)
        self.where = where
        self._seldom: dict[str, Any] | None = None
        if saver is not None:
            self.saver = saver
        if custom_function is not None:
            self.custom_function = custom_function
        if kept_on is not None:
            self.kept_on = kept_on  # (node, "ctx.x"): kept on a custom function's ctx, checked when its backward starts

    site: _Field[SourceLocation | None] = _placed("site")
    caller: _Field[SourceLocation | None] = _placed("caller")  # the user's call around ``site`` (the call of the model)
    producer: _Field[str | None] = _placed("producer")
    passes_at_save: _Field[int] = _placed("passes_at_save")  # backward passes seen when it was saved
    saver: _Field[str | None] = _seldom("saver")
    custom_function: _Field[str | None] = _seldom("custom_function")
    kept_on: _Field[tuple[str, str] | None] = _seldom("kept_on")
    writes: _Field[list[WriteRecord] | None] = _seldom("writes")
    name_at_write: _Field[str | None] = _seldom("name_at_write")  # NOTE [Naming a tensor where it is written]
    reported: _Field[bool] = _seldom("reported", False)


class LedgerRecord(SavedRecord):
    """A record the ledger holds weakly (write tracking on)."""

    __slots__ = ("__weakref__",)


_WRITE_LOG_OFF = ("write tracking was off: re-run with track_writes=True (or `gradguard run`) to see which line "
                  "wrote the tensor")
_MORE_STALE = 8  # other stale saved tensors named in one error


class GuardEngine:
    """Consumes a probe's events; owns records, the ledger, checks, findings and raising."""

    def __init__(self, probe: Probe, *, error_for: Callable[[str], type], fingerprint: str = "full",
                 track_writes: bool = True, bisect: bool = False, keep_extras: Callable[[], bool] = lambda: False):
        # NOTE [The engine raises what it is given]
        # Which exception class a finding kind becomes (``error_for``), and whether a hazard outside saved tensors
        # is raised or only recorded (``keep_extras``: true in ``gradguard run``'s diagnosing re-run), are policies
        # injected by the caller: core imports no error class, renderer or CLI.
        self._error_for = error_for
        self._keep_extras = keep_extras
        if bisect:  # bisect needs the write log (to tell explained changes apart) and full fingerprints
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
        # the bisector: the engine's line tracer, or a probe's own (torch: a dispatch mode)
        self._bisect: Bisector | None = None
        self._line_bisect = False
        # the probe's answers, bound once: these run per saved tensor (the optional ones: see Probe)
        self._version = probe.version
        self._own_fingerprint: Callable[[Any, str], object] | None = getattr(probe, "fingerprint", None)
        self._own_same: Callable[[object, object], bool] | None = getattr(probe, "same_fingerprint", None)
        # defer_fingerprint_check(record, now) -> bool: compare later, without a host sync (torch on a GPU)
        self._defer: Callable[[SavedRecord, object], bool] | None = getattr(probe, "defer_fingerprint_check", None)
        self._allowed_change: Callable[[SavedRecord], bool] | None = getattr(probe, "allowed_change", None)
        self._annotate: Callable[[Finding, SavedRecord, bool], None] | None = getattr(probe, "annotate", None)
        self._name_at_write: Callable[[Any], str | None] | None = getattr(probe, "name_at_write", None)
        self._handlers: dict[type, Callable[[Any], Any]] = {
            TensorSaved: lambda e: self.save(e.tensor, e.location, e.producer, e.caller, e.saver, e.custom_function,
                                             e.kept_on),
            TensorWritten: self._written,
            TensorUnpacked: lambda e: self.unpacked(e.record),
            BackwardStarted: self._backward_started,
            BackwardEnded: lambda e: self.raise_pending() if self._pending and not e.failed else None,
            FunctionBoundary: lambda event: None,  # for subscribers only (no probe emits it yet)
            LineReached: lambda e: self._bisect.check(e.location) if self._bisect is not None else None,
        }

    # -- the event entry point --------------------------------------------------------------------
    def emit(self, event: object) -> Any:
        """Handle one event; returns the pack record for TensorSaved and the tensor for TensorUnpacked."""
        if not self.subscribers:
            return self._handlers[type(event)](event)
        try:
            return self._handlers[type(event)](event)
        finally:  # subscribers (reports, advisors) see the event even when its handler raised the finding
            for subscriber in self.subscribers:
                subscriber(event)

    def watches(self, target: Any) -> list[SavedRecord]:
        """The live records whose memory ``target`` overlaps (probes skip logging writes elsewhere)."""
        if not len(self.ledger):
            return []
        span = self.probe.span(target)
        return self.ledger.overlapping(*span) if span is not None else []

    def watch_update(self, targets: Iterable[Any], run: Callable[[], _T], *, op: str, category: str,
                     via: str | None = None) -> _T:
        """Run ``run()`` (an optimizer step, a compiled call) that may write ``targets`` without the write log
        seeing it; emit a TensorWritten for each saved target whose version or bytes it changed.
        Only targets saved for backward are compared (one hash each, before and after)."""
        probe = self.probe
        watched = [(t, probe.span(t), probe.version(t), self._full_fingerprint(t)) for t in targets if self.watches(t)]
        out = run()
        if watched:
            context = caller_context(skip=3)
            for t, span, before, fp in watched:
                after = probe.version(t)
                if after != before or self._full_fingerprint(t) != fp:
                    self.emit(TensorWritten(t, op, category, context.location, context.library_frame, before, after,
                                            via=via, span=span))
        return out

    def _full_fingerprint(self, t: Any) -> int | None:
        raw = self.probe.host_bytes(t)
        return None if raw is None else fingerprint_bytes(raw, "full")

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, skip: int = 2) -> None:
        """Start the line bisector when bisecting (probes without a per-op hook)."""
        if self.bisect and self._bisect is None:
            self._bisect = _LineBisector(self)
            self._line_bisect = True
            self._bisect.start(sys._getframe(skip))

    def attach_bisector(self, bisector: Bisector) -> None:
        """A probe's own bisector (``check(location)``, ``rebase(records)``, ``stop()``) instead of lines."""
        self._bisect = bisector

    def stop(self) -> None:
        if self._bisect is not None:
            self._bisect.stop()
            self._bisect = None
        self.raise_pending()

    # -- handlers ---------------------------------------------------------------------------------
    def fingerprint(self, t: Any) -> object:
        """The saved-time/unpack-time fingerprint: the probe's own when it has one (a device digest that needs
        no host copy), else the core hash of its host bytes."""
        if self.fingerprint_mode == "off":
            return None
        if self._own_fingerprint is not None:
            return self._own_fingerprint(t, self.fingerprint_mode)
        raw = self.probe.host_bytes(t)
        return None if raw is None else fingerprint_bytes(raw, self.fingerprint_mode)

    def same(self, a: object, b: object) -> bool:
        return self._own_same(a, b) if self._own_same is not None else a == b

    def save(self, t: Any, location: SourceLocation | None, producer: str | None, caller: SourceLocation | None,
             saver: str | None = None, custom_function: str | None = None,
             kept_on: tuple[str, str] | None = None) -> SavedRecord:
        """What a :class:`TensorSaved` does, without the event: a probe's pack calls it directly while no
        subscriber listens (NOTE [The per-tensor path]); the record it returns is the pack hook's."""
        # NOTE [The per-tensor path]
        # ``save`` and ``unpacked`` run once per saved tensor (~700 times per step in an LSTMCell loop), so they call
        # the probe's answers directly (bound in __init__) instead of through fingerprint()/same() (~0.3-0.4 us
        # per saved tensor, timeit of torch's hooks, 32x32 float32), and a probe calls them without building an
        # event and without ``emit``'s dispatch when ``subscribers`` is empty (events exist for subscribers).
        mode, own = self.fingerprint_mode, self._own_fingerprint
        fp = None if mode == "off" else own(t, mode) if own is not None else self.fingerprint(t)
        record = (LedgerRecord if self.track_writes else SavedRecord)(
            t, self._version(t), fp, location, saver, producer, custom_function, caller, kept_on,
            self.ledger.backward_passes)
        span = self.probe.span(t) if self.track_writes else None
        if span is not None:
            self.ledger.add(record, *span)
        return record

    def _written(self, event: TensorWritten) -> None:
        records = event.records
        if records is None:
            records = self.ledger.overlapping(*event.span) if event.span is not None else self.watches(event.target)
        if not records:
            return
        before, after = event.version_before, event.version_after
        write = WriteRecord(op=event.op, location=event.location, via=event.via, library_frame=event.library_frame,
                            version_before=before, version_after=after,
                            bumps_version=before is None or after is None or after > before, category=event.category)
        self.record_write(records, write)
        if self._bisect is not None:
            self._bisect.rebase(records)

    def record_write(self, records: Iterable[SavedRecord], write: WriteRecord) -> None:
        """Attach ``write`` to saved records. A write logged before it ran (no versions) is stored with each
        record's own version at that moment; the version after it is read when a finding is built."""
        per_record = write.version_before is None and write.version_after is None
        with self._lock:
            for record in records:
                if record.writes is None:
                    record.writes = []
                    if self._name_at_write is not None:
                        record.name_at_write = self._name_at_write(record.tensor)
                record.writes.append(dataclasses.replace(write, version_before=self._version(record.tensor))
                                     if per_record else write)

    def _bytes_changed(self, record: SavedRecord) -> str | None:
        """``silent_write`` when the record's bytes changed (or, fingerprints off, a write was logged into it);
        None when they did not, or when the probe compares later (a device fingerprint)."""
        if record.fp is not None:
            own, same = self._own_fingerprint, self._own_same
            t = record.tensor
            now = own(t, self.fingerprint_mode) if own is not None else self.fingerprint(t)
            if self._defer is not None and type(now) is not int and self._defer(record, now):
                return None  # a device fingerprint: compared when backward ends (the probe raises then)
            if not (same(now, record.fp) if same is not None else now == record.fp):
                if self._allowed_change is not None and self._allowed_change(record):
                    record.fp = now
                    return None
                return "silent_write"
        elif self.fingerprint_mode == "off" and record.writes:
            return "silent_write"
        return None

    def unpacked(self, record: Any) -> Any:
        """What a :class:`TensorUnpacked` does, without the event (NOTE [The per-tensor path]): check ``record``
        (raise, or record the problem for later) and return the tensor to hand back."""
        if not isinstance(record, SavedRecord):
            return record
        kind = None
        try:
            if self._bisect is not None:
                self._bisect.check(None)
            version = record.version  # version moved: inplace_modification; else did the bytes change?
            if version is not None and self._version(record.tensor) != version:
                kind = "inplace_modification"
            else:
                kind = self._bytes_changed(record)
        except Exception as internal:  # our failure must never break the user's backward: say so, go on
            # NOTE [A notice never raises inside torch]
            notice(f"gradguard ({self.probe.backend} guard engine): the saved-tensor check failed "
                   f"({internal!r}); this tensor was not checked", RuntimeWarning)
        if kind is not None:
            if self.probe.raise_at_unpack:
                self.raise_record(record, kind)
            elif not record.reported:  # raised once backward returns (NOTE [Raising: at unpack or after backward])
                record.reported = True
                finding = self._diagnosed(record, kind)
                with self._lock:
                    self._pending.append((finding, self._error_for(kind)))
        return record.tensor

    def _backward_started(self, event: BackwardStarted) -> None:
        if event.location is not None:
            self.backward_sites = (self.backward_sites + [event.location])[-8:]

    # -- ctx tensors ------------------------------------------------------------------------------
    def check_kept(self, record: SavedRecord) -> None:
        """Raise if a tensor a custom function kept on ctx changed since forward returned. A version bump that
        left the bytes as they were (a write into another slot of the same buffer) cannot change the gradient."""
        t = record.tensor
        now = self._version(t)
        moved = record.version is not None and now != record.version
        if record.fp is not None:
            if self.same(self.fingerprint(t), record.fp):
                if moved:
                    record.version = now
                return
            self.raise_record(record, "unchecked_write" if moved else "silent_write")
        elif moved:
            self.raise_record(record, "unchecked_write")

    # -- findings ---------------------------------------------------------------------------------
    def _diagnosed(self, record: SavedRecord, kind: str, note: str | None = None,
                   facts: Facts | None = None, saver: tuple[str | None, str | None] | None = None
                   ) -> Finding:
        t = record.tensor

        def build() -> Finding:
            finding = self.build_finding(record, kind, current=saver is None, facts=facts, saver=saver)
            if note:
                finding.notes.append(note)
            return finding

        return diagnose_or_fallback(build, kind=kind, shape=t.shape, dtype=t.dtype, backend=self.probe.backend)

    def raise_record(self, record: SavedRecord, kind: str, note: str | None = None,
                     facts: Facts | None = None, saver: tuple[str | None, str | None] | None = None
                     ) -> NoReturn:
        """Build the finding of a stale record and raise it, with every other stale saved tensor whose write was
        seen (``inplace_modification``). ``saver``: (node, argument) when no node is unpacking the record now
        (a comparison made when backward ended)."""
        finding = self._diagnosed(record, kind, note, facts, saver)
        others = self._other_stale_findings(record, finding) if kind == "inplace_modification" else []
        with self._lock:
            self.findings.append(finding)
            self.findings.extend(others)
        error = self._error_for(kind)(finding)
        error.findings = [finding, *others]
        raise error

    def keep(self, finding: Finding) -> Finding:
        """Diagnose a finding a probe built itself (a boundary check) and add it to the findings."""
        finding = diagnose_or_fallback(lambda: diagnose(finding), kind=finding.kind, shape=finding.tensor.shape,
                                       dtype=finding.tensor.dtype, backend=self.probe.backend)
        with self._lock:
            self.findings.append(finding)
        return finding

    def raise_finding(self, finding: Finding) -> NoReturn:
        """Diagnose and raise a finding a probe built itself."""
        raise self._error_for(finding.kind)(self.keep(finding))  # the error's findings: [finding]

    def report_extra(self, finding: Finding) -> None:
        """A hazard outside saved tensors (a module writing its caller's input, a dropped inner update): raised,
        except in ``gradguard run``'s diagnosing re-run, which looks for the first run's finding; there it is
        recorded and the program goes on to reach that finding (NOTE [The re-run looks for one finding])."""
        if self._keep_extras():
            self.keep(finding)
            return
        self.raise_finding(finding)

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

    def _other_stale_findings(self, failing: SavedRecord, first: Finding) -> list[Finding]:
        """Every other saved tensor that is already stale and whose write was seen, one finding per distinct
        write (the framework stops at the first; fixing only that one would fail on the next). Never breaks the
        error path: a failure here is reported as a note on the first finding."""
        # NOTE [All hazards in one error]
        # The exception carries them all: ``error.finding`` is the one backward met first, ``error.findings``
        # lists it first and then the others; the first finding's notes say how many more there are.
        try:
            seen = {tuple((w.location.file, w.location.line) for w in first.modified_at if w.location)}
            out: list[Finding] = []
            for record in self.ledger.live_records():
                if record is failing or record.version is None or not record.writes or record.kept_on:
                    continue
                if self._version(record.tensor) == record.version:
                    continue
                writes = tuple((w.location.file, w.location.line) for w in record.writes if w.location)
                if not writes or writes in seen:
                    continue
                seen.add(writes)
                out.append(self.build_finding(record, "inplace_modification", current=False))
                if len(out) >= _MORE_STALE:
                    break
        except Exception as internal:  # noqa: BLE001 - reported, never hides the user's error
            first.notes.append(f"gradguard could not look for other stale saved tensors: {internal!r}")
            return []
        if out:
            lines = "; ".join(f"{w.location.short} (`{w.location.code}`)" for f in out for w in f.modified_at[:1]
                              if w.location)
            first.notes.append(f"{len(out)} more saved tensor(s) of this graph were already overwritten in place: "
                               f"{lines}. Fix them too; each is a finding of its own (error.findings).")
        return out

    def _resolved_writes(self, record: SavedRecord) -> list[WriteRecord]:
        """The record's writes with every version known: a write logged before it ran ends where the next one
        began, or at the tensor's current version."""
        entries = record.writes or []
        out: list[WriteRecord] = []
        for i, write in enumerate(entries):
            if write.version_after is None and write.version_before is not None:
                after = entries[i + 1].version_before if i + 1 < len(entries) else self._version(record.tensor)
                if after is not None:
                    write = dataclasses.replace(write, version_after=after, bumps_version=after > write.version_before)
            out.append(write)
        return out

    def build_finding(self, record: SavedRecord, kind: str, current: bool = True,
                      facts: Facts | None = None,
                      saver: tuple[str | None, str | None] | None = None) -> Finding:
        """The finding of a stale record. ``current``: the framework is unpacking this record now (its graph
        node is the one running); False for the other stale records named in the same error. ``saver``: the
        (node, argument) that unpacked it, when known without the node running."""
        scope = getattr(self.probe, "finding_scope", None)
        with scope() if scope is not None else contextlib.nullcontext():
            probe = self.probe
            t = record.tensor
            tensor = probe.describe(t)
            if record.producer not in (None, "leaf") and tensor.producer is None:
                tensor.producer = record.producer
            if tensor.role == "tensor":
                tensor.role = "leaf" if record.producer == "leaf" else "activation"
                if tensor.name is None:
                    tensor.name = record.name_at_write
            node, argument = record.kept_on or saver or (probe.saver(record, tensor) if current else (None, None))
            finding = Finding(
                kind=kind,
                tensor=tensor,
                saved_at=SaveSite(node=node, argument=argument, location=record.site,
                                  chain=[record.caller] if record.caller is not None else []),
                modified_at=self._resolved_writes(record),
                versions={"saved": record.version, "now": self._version(t)},
                backend=probe.backend,
                facts=probe.context(),
            )
            if self.backward_sites and finding.facts.backward_at is None:
                finding.facts.backward_at = self.backward_sites[-1].to_dict()
            if facts is not None:
                finding.facts.update(facts)
            if self._annotate is not None:
                self._annotate(finding, record, current)
            if not self.track_writes and not finding.facts.writer_unknowable:
                finding.notes.append(_WRITE_LOG_OFF)
            if self._line_bisect:
                finding.notes.append("bisect mode traced the user's lines on the thread that entered the guard; writes "
                                     "from other threads are not pinned")
            if probe.direct_writers is not None:  # rows whose core text speaks torch word it for this framework
                facts = finding.facts
                facts.framework, facts.direct_writers = probe.framework, probe.direct_writers
                facts.direct_write_fix, facts.optimizer_fix = probe.direct_write_fix, probe.optimizer_fix
            diagnose(finding)
            probe.phrase(finding, record)
            return finding


class SavedBaselines:
    """Bisect's memory: per live saved record, its fingerprint, version and number of logged writes at the last
    check (weak: never keeps a tensor). Shared by the line bisector here and torch's per-op bisector."""

    def __init__(self, engine: GuardEngine):
        self.engine = engine
        # id(record) -> (the record, weakly; fingerprint, version, number of logged writes)
        self._entries: dict[int, tuple[weakref.ref[SavedRecord], object, int | None, int]] = {}

    def unexplained_changes(self) -> Iterator[SavedRecord]:
        """Yield every live record whose bytes changed since its baseline while neither its version nor its
        logged writes moved (the caller attributes the write); every baseline then moves to now."""
        engine = self.engine
        entries = self._entries
        for record in list(engine.ledger.live_records()):
            if record.fp is None:
                continue
            entry = entries.get(id(record))
            if entry is not None and entry[0]() is record:
                fp, version, nwrites = entry[1], entry[2], entry[3]
            else:
                fp, version, nwrites = record.fp, record.version, len(record.writes or ())
            t = record.tensor
            now, version_now = engine.fingerprint(t), engine.probe.version(t)
            if not engine.same(now, fp) and version_now == version and len(record.writes or ()) == nwrites:
                yield record
            entries[id(record)] = (weakref.ref(record), now, version_now, len(record.writes or ()))
        if len(entries) > 4 * (len(engine.ledger) + 16):
            self._entries = {k: v for k, v in entries.items() if v[0]() is not None}

    def rebase(self, records: Iterable[SavedRecord]) -> None:
        """Logged writes explain these records' changes: their baselines move to now."""
        engine = self.engine
        for record in records:
            self._entries[id(record)] = (weakref.ref(record), engine.fingerprint(record.tensor),
                                         engine.probe.version(record.tensor), len(record.writes or ()))


class _LineBisector:
    """Re-checks live saved tensors at every new user line (see NOTE [Bisect without a per-op hook])."""

    def __init__(self, engine: GuardEngine):
        self.engine = engine
        self.baselines = SavedBaselines(engine)
        self.rebase = self.baselines.rebase
        self.last: SourceLocation | None = None
        self._previous_trace: TraceFunction | None = None
        self._frames: list[tuple[FrameType, Callable[[FrameType, str, Any], Any] | None]] = []  # (frame, its f_trace)
        self._thread = threading.get_ident()
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

    def start(self, frame: FrameType | None) -> None:
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

    def _global(self, frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        return self._local if event == "call" and self._is_user(frame.f_code.co_filename) else None

    def _local(self, frame: FrameType, event: str, arg: object) -> TraceFunction:
        if event == "line" and threading.get_ident() == self._thread:
            code = frame.f_code
            self.engine.emit(LineReached(SourceLocation(code.co_filename, frame.f_lineno, code.co_name)))
        return self._local

    def check(self, location: SourceLocation | None) -> None:
        """Compare every live saved tensor with its baseline; pin an unexplained change to the last line."""
        engine = self.engine
        for record in self.baselines.unexplained_changes():
            # The line that just finished made the change (None: before the first traced line).
            version = engine.probe.version(record.tensor)
            engine.record_write([record], WriteRecord(op=f"write outside {engine.probe.backend} ops", location=self.last,
                                                      version_before=version, version_after=version,
                                                      bumps_version=False, category="outside"))
        if location is not None:
            self.last = location
