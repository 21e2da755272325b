"""One guard session for MindSpore (PyNative): saved-tensor hooks with version + fingerprint checks, a write log.

# NOTE [What MindSpore 2.10 allows]
#   * ``ms.saved_tensors_hooks`` works in PyNative only (inside ``ms.jit`` it is a TypeError); pack/unpack run
#     inside ``ms.grad`` / ``value_and_grad`` / ``vjp`` calls, including for Cells with a custom ``bprop``.
#     Installing them switches MindSpore's own version check off, so unpack redoes it. Unlike Paddle, an
#     exception raised in unpack propagates cleanly (type kept, autograd still usable), so we raise there.
#   * On CPU ``t[i] = v``, ``ops.assign`` and ``assign_value`` change values WITHOUT bumping ``_version``:
#     silent wrong gradients. The content fingerprint catches them.
#   * ``ms.MsDispatchMode`` sees ``Inplace*`` / ``Assign*`` ops but not ``__setitem__`` / ``assign_value``; the
#     session logs writes from both (dispatch mode + wrappers on the Python entry points).
"""

from __future__ import annotations

import re
import threading

import numpy as np
import mindspore as ms
import xxhash
from mindspore import ops

from ..._errors import InplaceModificationError, error_for
from ...core._diagnosis import diagnose, diagnose_or_fallback
from ...core._findings import Finding, SaveSite, TensorInfo, WriteRecord
from ...core._frames import LIBRARY_PATHS, caller_context, user_location
from ...core._ledger import SavedLedger
from ...core._source_ast import call_name
from ._adapter import current_mode, memory_range
from ._naming import name_tensor

__all__ = ["MindSporeGuardSession", "fingerprint", "enrich_mindspore_error"]

LIBRARY_PATHS.add(ms.__path__[0])


def fingerprint(t, mode: str = "full") -> int | None:
    try:
        a = np.ascontiguousarray(t.asnumpy())
    except Exception:
        return None
    raw = memoryview(a).cast("B")
    if mode == "sample" and raw.nbytes > 64 * 1024:
        step = raw.nbytes // 16
        raw = b"".join(bytes(raw[i * step: i * step + 4096]) for i in range(16))
    return xxhash.xxh3_64_intdigest(raw)


class _SavedRecord:
    __slots__ = ("tensor", "version", "fp", "site", "writes", "__weakref__")

    def __init__(self, tensor, version, fp, site):
        self.tensor = tensor  # kept directly: works in 2.10 (a weakref to the packed wrapper dies before unpack)
        self.version = version
        self.fp = fp
        self.site = site
        self.writes: list[WriteRecord] | None = None


class _WriteMode(ms.MsDispatchMode):
    def __init__(self, session):
        super().__init__()
        self._session = session

    def __ms_dispatch__(self, func, args, kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "name", "")
        if (name.startswith("Inplace") or name.startswith("Assign")) and len(self._session.ledger):
            target = next((a for a in args if isinstance(a, ms.Tensor)), None)
            if target is not None:
                return self._session._logged(func, args, kwargs, target, f"mindspore.ops.{name}", name)
        return func(*args, **kwargs)


class MindSporeGuardSession:
    backend = "mindspore"

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True):
        self.fingerprint_mode = fingerprint
        self.track_writes = track_writes
        self.ledger = SavedLedger()
        self.findings: list[Finding] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._hooks = None
        self._mode = None
        self._patches: list = []

    def enter(self) -> None:
        self._hooks = ms.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        if self.track_writes:
            for owner, name, label in ((ms.Tensor, "__setitem__", "Tensor.__setitem__"),
                                       (ms.Tensor, "assign_value", "Tensor.assign_value"),
                                       (ops, "assign", "ops.assign"), (ops, "assign_add", "ops.assign_add"),
                                       (ops, "assign_sub", "ops.assign_sub")):
                original = getattr(owner, name, None)
                if original is not None:
                    self._patches.append((owner, name, original))
                    setattr(owner, name, self._wrap(original, f"mindspore.{label}", name))
            self._mode = _WriteMode(self)
            self._mode.__enter__()

    def exit(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches = []
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    # -- hooks ---------------------------------------------------------------------------------
    def _pack(self, t):
        version = int(t._version)
        fp = fingerprint(t, self.fingerprint_mode) if self.fingerprint_mode != "off" else None
        record = _SavedRecord(t, version, fp, user_location(2))
        if self.track_writes:
            rng = memory_range(t)
            if rng is not None:
                self.ledger.add(record, *rng)
        return record

    def _unpack(self, record):
        t = record.tensor
        if int(t._version) != record.version:
            self._raise(record, "inplace_modification")
        if record.fp is not None and fingerprint(t, self.fingerprint_mode) != record.fp:
            self._raise(record, "silent_write")
        if record.fp is None and record.writes and self.fingerprint_mode == "off":
            self._raise(record, "silent_write")
        return t

    # -- writes --------------------------------------------------------------------------------
    def _wrap(self, original, op, short):
        session = self

        def write(*args, **kwargs):
            target = args[0] if args else None
            if not isinstance(target, ms.Tensor) or not len(session.ledger):
                return original(*args, **kwargs)
            return session._logged(original, args, kwargs, target, op, short)

        write.__wrapped__ = original
        return write

    def _logged(self, func, args, kwargs, target, op, short):
        local = self._local
        if getattr(local, "busy", False):
            return func(*args, **kwargs)
        rng = memory_range(target)
        records = self.ledger.overlapping(*rng) if rng is not None else []
        if not records:
            return func(*args, **kwargs)
        local.busy = True
        try:
            before = int(target._version)
            out = func(*args, **kwargs)
            after = int(target._version)
        finally:
            local.busy = False
        context = caller_context(skip=3)
        category = "index_assign" if short == "__setitem__" else (
            "copy" if short in ("copy_", "InplaceCopy", "assign", "Assign", "assign_value") else "other")
        write = WriteRecord(op=op, location=context.location, library_frame=context.library_frame,
                            version_before=before, version_after=after, bumps_version=after > before,
                            category=category)
        with self._lock:
            for record in records:
                if record.writes is None:
                    record.writes = []
                record.writes.append(write)
        return out

    # -- findings ------------------------------------------------------------------------------
    def _raise(self, record, kind):
        t = record.tensor
        finding = diagnose_or_fallback(lambda: self._build_finding(record, kind), kind=kind, shape=t.shape,
                                       dtype=t.dtype, backend="mindspore")
        with self._lock:
            self.findings.append(finding)
        raise error_for(kind)(finding)

    def _build_finding(self, record, kind) -> Finding:
        t = record.tensor
        name, role = name_tensor(t)
        # A parameter is an operand on the saving line: name the op that takes it (`multiply` in
        # `ops.sin(net.w * x)`), not the line's outermost call.
        saver = call_name(record.site.code, operand=name) if record.site is not None else None
        finding = Finding(
            kind=kind,
            tensor=TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=str(t.dtype).lower(), name=name,
                              role=role or "activation"),
            saved_at=SaveSite(node=saver, location=record.site),
            modified_at=list(record.writes or []),
            versions={"saved": record.version, "now": int(t._version)},
            backend="mindspore",
            context={"mode": current_mode(), "device": ms.get_context("device_target"),
                     "mindspore_version": ms.__version__},
        )
        if kind == "silent_write":
            finding.notes.append("MindSpore's version counter did not move (on CPU `t[i] = v`, ops.assign and "
                                 "assign_value do not bump it): without gradguard this gradient would be silently "
                                 "wrong.")
        diagnose(finding)
        return _mindspore_fix(finding)


_FIXES = {
    "index_assignment": "Assign into a copy (`y = x.copy(); y[idx] = v`), or build the result out of place "
    "(`ops.where(mask, v, x)` / `ops.tensor_scatter_elements`).",
    "generic_inplace": "Clone before writing (`y = x.copy()` and write into y), or use the out-of-place op "
    "(`ops.add(x, v)` instead of `ops.assign(x, ...)`).",
}


def _mindspore_fix(finding: Finding) -> Finding:
    fix = _FIXES.get(finding.rule)
    if fix is not None:
        finding.suggestion = fix
    return finding


_VERSION = re.compile(r"One of the Tensor needed for gradient computation has been modified by an inplace operation, "
                      r"which is the (\d+) 's (input|output|custom saved tensor) of (\w+); and its version is (\d+) , "
                      r"expected version (\d+)")


def enrich_mindspore_error(error, session=None):
    """MindSpore's own version-check error (raised when hooks did not see the save) with a diagnosis."""
    match = _VERSION.search(str(error))
    if match is None or not isinstance(error, RuntimeError):
        return None
    index, what, op, now, expected = match.groups()
    finding = Finding(
        kind="inplace_modification", tensor=TensorInfo(shape=(), dtype="?", role="tensor"),
        saved_at=SaveSite(node=op, argument=f"{what}[{index}]"), versions={"saved": int(expected), "now": int(now)},
        backend="mindspore", context={"mode": current_mode(), "mindspore_message": str(error).split("\n")[0]},
    )
    diagnose(finding)
    return InplaceModificationError(_mindspore_fix(finding))
