"""One guard session for Paddle (dygraph): saved-tensor hooks with version + fingerprint checks, and a write log.

# NOTE [Paddle's hooks: what they switch off and what they must never do]
# Measured on paddlepaddle 3.3.1:
#   * installing ``paddle.autograd.saved_tensors_hooks`` switches Paddle's own version check off, so the
#     unpack hook redoes it (saved ``inplace_version`` vs current), plus a content fingerprint because
#     ``set_value`` and ``copy_`` write without bumping the version;
#   * an exception raised inside ``unpack`` leaves autograd globally disabled (``paddle.is_grad_enabled()``
#     stays False and later backwards give ``grad=None``). So unpack only *records* the problem; the
#     error is raised by our wrapper around ``Tensor.backward`` / ``paddle.grad`` once backward returns,
#     at the user's backward line (where Paddle itself would raise);
#   * for a ``PyLayer``, a tuple or list returned by ``pack`` is iterated and unpack is called on each
#     element: pack returns a non-sequence record object;
#   * hooks cannot nest ("only one pair of hooks is allowed at a time"): a guard entered inside another
#     Paddle guard joins the outer session.
#   * ``PyLayer`` saved tensors (``ctx.save_for_backward``) are never version-checked by Paddle; ours are.
#
# NOTE [Seeing writes without a dispatch mode]
# Paddle has no dispatch/function mode. The session wraps the public in-place entry points while it is
# active (``Tensor.*_``, ``__setitem__``, ``set_value``, the ``paddle.*_`` and ``paddle.nn.functional.*_``
# functions, ``paddle.assign(x, output)``) and compares the target's version before and after each call:
# a write that does not bump it is marked silent. ``paddle._C_ops.*_`` and C++-internal writes are not seen
# by the log, but the version/fingerprint check still catches their effect on saved tensors.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import paddle
import xxhash

from ..._errors import error_for
from ...core._diagnosis import diagnose, diagnose_or_fallback
from ...core._findings import Finding, SaveSite, TensorInfo, WriteRecord
from ...core._frames import LIBRARY_PATHS, caller_context, user_location
from ...core._ledger import SavedLedger
from ...core._source_ast import call_name
from ._naming import memory_range, name_tensor

__all__ = ["PaddleGuardSession", "fingerprint"]

LIBRARY_PATHS.add(paddle.__path__[0])

SAMPLE_BYTES = 64 * 1024
_ACTIVATIONS = {"relu_", "tanh_", "sigmoid_", "elu_", "leaky_relu_", "hardtanh_", "softmax_", "thresholded_relu_",
                "celu_", "selu_", "silu_", "gelu_", "hardsigmoid_", "hardswish_", "mish_", "clip_", "exp_"}
_NOT_WRITES = {"requires_grad_", "grad_", "stop_gradient_", "retain_grads", "register_hook"}
_active: list["PaddleGuardSession"] = []  # sessions whose hooks are installed (Paddle allows one pair)


def fingerprint(t, mode: str = "full") -> int | None:
    try:
        a = np.ascontiguousarray(t.numpy())
    except Exception:
        return None
    raw = memoryview(a).cast("B")
    if mode == "sample" and raw.nbytes > SAMPLE_BYTES:
        step = raw.nbytes // 16
        raw = b"".join(bytes(raw[i * step: i * step + SAMPLE_BYTES // 16]) for i in range(16))
    return xxhash.xxh3_64_intdigest(raw)


class _SavedRecord:
    """What pack returns (deliberately not a sequence: PyLayer would iterate it)."""

    __slots__ = ("tensor", "version", "fp", "site", "saver", "producer", "pylayer", "writes", "__weakref__")

    def __init__(self, tensor, version, fp, site, saver, producer, pylayer):
        self.tensor = tensor
        self.version = version
        self.fp = fp
        self.site = site
        self.saver = saver
        self.producer = producer
        self.pylayer = pylayer
        self.writes: list[WriteRecord] | None = None


def _pylayer_saver(skip: int) -> str | None:
    """``MySin`` when the pack hook runs inside a PyLayer's ``forward`` (``ctx.save_for_backward``)."""
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and "ctx" in frame.f_locals:
            ctx = frame.f_locals["ctx"]
            if type(ctx).__name__.endswith("PyLayerContext") or hasattr(ctx, "save_for_backward"):
                return getattr(code, "co_qualname", "PyLayer.forward").rsplit(".", 1)[0]
        frame = frame.f_back
    return None


class PaddleGuardSession:
    """Installs hooks and the write log between ``enter()`` and ``exit()``."""

    backend = "paddle"

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True):
        self.fingerprint_mode = fingerprint
        self.track_writes = track_writes
        self.ledger = SavedLedger()
        self.findings: list[Finding] = []
        self.backward_sites: list = []
        self._pending: list[tuple[Finding, type]] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._hooks = None
        self._patches: list[tuple[object, str, object]] = []
        self._outer: PaddleGuardSession | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def enter(self) -> None:
        if _active:  # Paddle cannot nest hooks: join the outer session
            self._outer = _active[-1]
            self.findings = self._outer.findings
            return
        self._hooks = paddle.autograd.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        _active.append(self)
        try:
            self._patch_backward()
            if self.track_writes:
                self._patch_writes()
        except BaseException:
            self.exit()
            raise

    def exit(self) -> None:
        if self._outer is not None:
            return
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches = []
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        if self in _active:
            _active.remove(self)
        self._raise_pending()

    # -- hooks (never raise: see NOTE) --------------------------------------------------------
    def _pack(self, t):
        try:
            version = int(t.inplace_version)
        except Exception:
            version = None
        fp = fingerprint(t, self.fingerprint_mode) if self.fingerprint_mode != "off" else None
        try:
            pylayer = _pylayer_saver(2)
            site = user_location(2)
            grad_fn = t.grad_fn
            producer = grad_fn.name() if grad_fn is not None else ("leaf" if not t.stop_gradient else None)
        except Exception:
            pylayer, site, producer = None, None, None
        if pylayer is not None:
            saver = f"{pylayer}.forward (PyLayer ctx.save_for_backward)"
        else:
            saver = call_name(site.code) if site is not None and site.code else None
        record = _SavedRecord(t, version, fp, site, saver, producer, pylayer)
        if self.track_writes:
            rng = memory_range(t)
            if rng is not None:
                self.ledger.add(record, *rng)
        return record

    def _unpack(self, record):
        if not isinstance(record, _SavedRecord):
            return record
        t = record.tensor
        try:
            kind = None
            now = int(t.inplace_version) if record.version is not None else None
            if record.version is not None and now != record.version:
                kind = "inplace_modification"
            elif record.fp is not None and fingerprint(t, self.fingerprint_mode) != record.fp:
                kind = "silent_write"
            elif record.fp is None and record.writes and self.fingerprint_mode == "off":
                kind = "silent_write"
            if kind is not None and not getattr(record, "_reported", False):
                self._record_problem(record, kind)
        except Exception:  # a failure of ours must never break the user's backward
            pass
        return t

    def _record_problem(self, record, kind):
        t = record.tensor
        finding = diagnose_or_fallback(lambda: self._build_finding(record, kind), kind=kind, shape=t.shape,
                                       dtype=t.dtype, backend="paddle")
        with self._lock:
            self._pending.append((finding, error_for(kind)))

    def _raise_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        if not paddle.is_grad_enabled():  # defensive: an unpack failure elsewhere can leave it off
            paddle.set_grad_enabled(True)
        with self._lock:
            self.findings.extend(f for f, _e in pending)
        finding, error = pending[0]
        if len(pending) > 1:
            finding.notes.append(f"{len(pending) - 1} more saved tensor(s) of this backward were also modified")
        raise error(finding)

    # -- backward wrappers ---------------------------------------------------------------------
    def _patch(self, owner, name, wrapper):
        self._patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def _patch_backward(self) -> None:
        session = self

        def wrap(original):
            def after_backward(*args, **kwargs):
                site = user_location(2)
                if site is not None:
                    session.backward_sites = (session.backward_sites + [site])[-8:]
                try:
                    return original(*args, **kwargs)
                finally:
                    if session._pending and sys.exc_info()[0] is None:
                        session._raise_pending()

            after_backward.__wrapped__ = original
            return after_backward

        self._patch(paddle.Tensor, "backward", wrap(paddle.Tensor.backward))
        grad = wrap(paddle.grad)
        self._patch(paddle, "grad", grad)
        self._patch(paddle.autograd, "grad", grad)
        self._patch(paddle.autograd, "backward", wrap(paddle.autograd.backward))

    # -- write log -----------------------------------------------------------------------------
    def _patch_writes(self) -> None:
        names = [n for n in dir(paddle.Tensor) if n.endswith("_") and not n.startswith("_") and n not in _NOT_WRITES]
        for name in names + ["__setitem__", "set_value"]:
            original = getattr(paddle.Tensor, name, None)
            if callable(original):
                self._patch(paddle.Tensor, name, self._writer(original, f"paddle.Tensor.{name}", name, _self_target))
        for module, prefix in ((paddle, "paddle"), (paddle.nn.functional, "paddle.nn.functional")):
            for name in dir(module):
                if name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
                    original = getattr(module, name)
                    if callable(original) and not isinstance(original, type):
                        self._patch(module, name, self._writer(original, f"{prefix}.{name}", name, _first_target))
        self._patch(paddle, "assign", self._writer(paddle.assign, "paddle.assign(..., output)", "assign",
                                                   _output_target))

    def _writer(self, original, op: str, short: str, target_of):
        session = self
        local = self._local

        def write(*args, **kwargs):
            if getattr(local, "busy", False) or not len(session.ledger):
                return original(*args, **kwargs)
            target = target_of(args, kwargs)
            rng = memory_range(target) if isinstance(target, paddle.Tensor) else None
            records = session.ledger.overlapping(*rng) if rng is not None else []
            if not records:
                return original(*args, **kwargs)
            local.busy = True
            try:
                before = int(target.inplace_version)
                out = original(*args, **kwargs)
                after = int(target.inplace_version)
            finally:
                local.busy = False
            session._log_write(op, short, before, after, records)
            return out

        write.__wrapped__ = original
        write.__name__ = getattr(original, "__name__", short)
        return write

    def _log_write(self, op, short, before, after, records) -> None:
        context = caller_context(skip=3)
        code = context.location.code if context.location else ""
        if short == "__setitem__":
            category = "index_assign"
        elif short in ("set_value", "copy_", "assign"):
            category = "copy"
        elif short in _ACTIVATIONS and not op.startswith("paddle.Tensor."):
            category = "activation"
        else:
            category = "other"
        write = WriteRecord(op=op, location=context.location, via=op if category == "activation" else None,
                            library_frame=context.library_frame, version_before=before, version_after=after,
                            bumps_version=after > before, category=category)
        del code
        with self._lock:
            for record in records:
                if record.writes is None:
                    record.writes = []
                record.writes.append(write)

    # -- findings ------------------------------------------------------------------------------
    def _build_finding(self, record: _SavedRecord, kind: str) -> Finding:
        t = record.tensor
        name, role = name_tensor(t)
        if role is None:
            role = "leaf" if record.producer == "leaf" else "activation"
        tensor = TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=str(t.dtype).replace("paddle.", ""),
                            device=_device(t), name=name, role=role,
                            producer=None if record.producer in (None, "leaf") else record.producer)
        backward = user_location(3)
        finding = Finding(
            kind=kind,
            tensor=tensor,
            saved_at=SaveSite(node=record.saver, location=record.site),
            modified_at=list(record.writes or []),
            versions={"saved": record.version, "now": int(t.inplace_version)},
            backend="paddle",
            context={"mode": "eager (dygraph)", "paddle_version": paddle.__version__,
                     "backward_at": backward.to_dict() if backward else None},
        )
        if record.pylayer is not None:
            finding.notes.append(f"Paddle itself does not version-check tensors saved by PyLayer "
                                 f"ctx.save_for_backward: without gradguard {record.pylayer}'s gradient would be "
                                 f"silently wrong here.")
        elif kind == "silent_write":
            finding.notes.append("Paddle's version counter did not move (set_value and copy_ do not bump it): "
                                 "without gradguard this gradient would be silently wrong.")
        if not self.track_writes:
            finding.notes.append("write tracking was off: re-run with track_writes=True to see which line wrote "
                                 "the tensor")
        diagnose(finding)
        paddle_fix(finding)
        return finding


def _device(t) -> str:
    place = str(t.place)
    return "cpu" if place.lower().startswith("place(cpu") else place


_FIXES = {
    "inplace_activation": "Use the out-of-place form: `paddle.nn.functional.relu(x)` instead of `F.relu_(x)`, "
    "`paddle.tanh(x)` instead of `paddle.tanh_(x)`.",
    "index_assignment": "Assign into a copy (`y = x.clone(); y[idx] = value`) so the saved tensor stays intact, or "
    "build the result out of place (`paddle.where(mask, value, x)`).",
    "generic_inplace": "Clone before the in-place write (`y = x.clone()` and write into y), or use the out-of-place "
    "op (`x.add(v)` instead of `x.add_(v)`, `paddle.assign(v)` instead of `paddle.assign(v, x)`).",
    "unseen_write": "Enter `gradguard.guard()` before the forward pass that saved the tensor, so the hooks see "
    "the save and the write log sees the write.",
}


def paddle_fix(finding: Finding) -> Finding:
    """Replace torch-specific fixes of the generic rules by Paddle spellings."""
    fix = _FIXES.get(finding.rule)
    if fix is not None:
        finding.suggestion = fix
    if finding.rule in ("generic_inplace", "buffer_refill") and any(
        w.op.endswith(("set_value", "copy_")) and not w.bumps_version for w in finding.modified_at
    ):
        finding.rule = "silent_set_value"
        write = next(w for w in finding.modified_at if not w.bumps_version)
        where = write.location.short if write.location else "an unknown line"
        finding.explanation = (
            f"{write.op} at {where} overwrote a tensor that {finding.saved_at.op or 'an op'} saved for backward. "
            "Paddle's set_value and copy_ do not bump the version counter, so Paddle computes the gradient from the "
            "new values without any error."
        )
        finding.suggestion = ("Write the new values into a fresh tensor (`y = paddle.full_like(y, v)` / "
                              "`y = v.clone()`) instead of set_value/copy_ on a tensor the graph still needs, or "
                              "do it after backward.")
    return finding


def _self_target(args, kwargs):
    return args[0] if args else kwargs.get("self")


def _first_target(args, kwargs):
    return args[0] if args else kwargs.get("x")


def _output_target(args, kwargs):
    return args[1] if len(args) > 1 else kwargs.get("output")
