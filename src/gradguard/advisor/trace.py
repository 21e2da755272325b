"""Recording one training step: every aten op, which storages it reads, writes and allocates, which
storages autograd saves, and the live-storage byte count over time.

# NOTE [Memory accounting on CPU]
# A storage is "allocated" when it first appears as the output of an op during the step, and "freed"
# when its ``weakref.finalize`` fires. Storage Python objects are preserved for as long as the C++
# StorageImpl lives, so the finalizer fires exactly when the memory is released (checked on torch 2.13).
# Storages that exist before the step (parameters, the batch, optimizer state) are "pre-existing" and
# never counted: the figure is the peak of bytes allocated *by the step* that are alive at once. Internal
# kernel scratch buffers never surface as op outputs, so they are not counted.
#
# NOTE [Ops run by our own hooks]
# The pack hook calls ``detach()`` and the runner clones snapshots; those ops go through the mode too.
# ``StepMode.quiet()`` passes them straight through so they are neither "reads" nor allocations.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import weakref
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import saved_tensors_hooks

from ..backends.torch.writes import OpStream, dynamo_safe, written_arguments
from ..core.findings import SourceLocation
from ..core.frames import LIBRARY_PATHS, user_location

# NOTE [advisor fallbacks]
# The probes below run once per op or per saved tensor and ask torch's private APIs about tensors that may
# have no storage (sparse, meta, functional wrappers) or about nodes whose attributes raise. Each failure
# has one safe answer (no in-place form / no storage / "may overlap") and is logged at DEBUG on the
# "gradguard.advisor" logger with its cause, never dropped silently; per-op volume rules out warnings.
_log = logging.getLogger("gradguard.advisor")

__all__ = ["StepMode", "OpRecord", "SaveRecord", "WriteEvent", "op_key"]

LIBRARY_PATHS.add(torch.__path__[0])

_NN_DIR = torch.nn.__path__[0]


def _tensors(value, out: list) -> list:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _module_context() -> str | None:
    """The innermost torch.nn module whose forward runs this op ("ReLU", "Dropout"), if any."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not LIBRARY_PATHS.is_library(filename):
            return None
        if filename.startswith(_NN_DIR) and frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                return type(owner).__name__
        frame = frame.f_back
    return None


@dataclass
class WriteEvent:
    index: int
    op: str
    location: SourceLocation | None
    start: int
    end: int


@dataclass
class SaveRecord:
    sid: int | None
    node: str | None
    after_op: int  # index of the last op dispatched before the save (the op that saved it)
    location: SourceLocation | None
    version: int | None
    start: int
    end: int
    unpacked_version_mismatch: bool = False
    silent_writes: list = field(default_factory=list)
    raising_writes: list = field(default_factory=list)


@dataclass
class OpRecord:
    index: int
    name: str  # "aten::add.Tensor"
    func: object
    phase: str  # forward | backward | optimizer
    location: SourceLocation | None
    module: str | None
    grad_enabled: bool
    in_sids: tuple  # per tensor input, storage id (None when untracked)
    out_sids: tuple
    in_shapes: tuple
    out_shapes: tuple
    in_dtypes: tuple
    out_dtypes: tuple
    in_refs: tuple  # weakrefs to the input tensor objects (for liveness and autograd facts)
    in_leaf_rg: tuple  # input is a leaf that requires grad
    in_view_meta: tuple  # CreationMeta name of a view input that requires grad, else None
    in_overlap: tuple  # input has internal memory overlap (expanded, stride 0)
    key: tuple = ()
    swappable: bool = False  # add/mul of two tensors (alpha 1): the other operand may be overwritten instead
    in_alive_end: tuple = ()  # filled by StepMode.finish()
    view_alive_end: tuple = ()  # another view/alias of the input's memory is alive at the end


@functools.cache
def inplace_overload(func):
    """The in-place overload of an out-of-place aten op (aten.relu.default -> aten.relu_.default), or None."""
    try:
        packet = func.overloadpacket.__name__
        overload = func._overloadname
        schema = func._schema
        if not packet.endswith("_") and not written_arguments(func) and len(schema.returns) == 1:
            target_packet = getattr(torch.ops.aten, packet + "_", None) if func.namespace == "aten" else None
            if target_packet is not None and overload in target_packet.overloads():
                target = getattr(target_packet, overload)
                a = [(x.name, str(x.type)) for x in schema.arguments]
                b = [(x.name, str(x.type)) for x in target._schema.arguments]
                spec = written_arguments(target)
                if a == b and len(spec) == 1 and spec[0][0] == 0:
                    return target
    except Exception as error:  # an op schema torch's Python API cannot describe: no in-place form
        _log.debug("advisor: no in-place overload for %s (%s: %s)", func, type(error).__name__, error)
    return None


def op_key(name, phase, location, in_shapes, counter: dict) -> tuple:
    """Identify an op instance across two runs of the same step: where, what, on which shapes, which time."""
    loc = (location.file, location.line) if location is not None else None
    base = (phase, loc, name, in_shapes)
    n = counter.get(base, 0)
    counter[base] = n + 1
    return base + (n,)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    itemsize = t.element_size()
    if t.numel() == 0:
        return 0, 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    start = t.storage_offset() * itemsize
    return start, start + span * itemsize


class StepMode:
    """Accounting (always), recording (``record=True``) and rewriting (``plan``) for one step: a subscriber of
    the torch op stream (NOTE [One op stream, subscribers in a chain]), entered with ``with mode:``.

    ``plan`` maps an op key to the operand position to overwrite in place (0 = self, 1 = other).
    """

    def __init__(self, *, record: bool, plan: dict | None = None):
        self._stream = None
        self.record = record
        self.plan = plan or {}
        self.snapshot_writes = True
        self.ops: list[OpRecord] = []
        self.saves: list[SaveRecord] = []
        self.writes: dict[int, list[WriteEvent]] = {}
        self.applied: set = set()
        self.events: list[tuple] = []  # ("a", sid, nbytes, op_index) | ("f", sid, op_index)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.sizes: dict[int, int] = {}
        self.preexisting: set[int] = set()
        self.leaves: list[torch.Tensor] = []  # leaves that require grad, in order of first use
        self._leaf_ids: set[int] = set()
        self.leaf_grads_before: list = []
        self.snapshots: dict[int, tuple] = {}  # sid -> (storage, copy)
        self._by_ptr: dict[tuple, int] = {}
        self._next_sid = 0
        self._index = -1
        self._quiet = 0
        self._counter: dict = {}
        self._pending_saves: list[SaveRecord] = []
        self._last_out_sids: tuple = ()
        self._aliases: dict[int, list] = {}  # sid -> weakrefs to forward views/aliases created in the step
        self.in_optimizer = 0
        self.stop_after_optimizer_steps: int | None = None
        self.optimizer_steps = 0
        self.alive_sids_at_end: set[int] | None = None

    def _sid(self, t: torch.Tensor, *, allocate: bool) -> int | None:
        try:
            storage = t.untyped_storage()
        except Exception as error:  # sparse, meta, functional wrappers
            _log.debug("advisor: tensor without storage not tracked (%s: %s)", type(error).__name__, error)
            return None
        nbytes = storage.nbytes()
        ptr = storage.data_ptr()
        if nbytes == 0 or ptr == 0:
            return None
        key = (t.device.type, t.device.index, ptr)
        sid = self._by_ptr.get(key)
        if sid is not None:
            return sid
        sid = self._next_sid
        self._next_sid += 1
        self._by_ptr[key] = sid
        self.sizes[sid] = nbytes
        if allocate:
            self.live_bytes += nbytes
            self.events.append(("a", sid, nbytes, self._index))
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
        else:
            self.preexisting.add(sid)
        weakref.finalize(storage, self._freed, key, sid, allocate)
        return sid

    def _freed(self, key, sid, counted) -> None:
        if self._by_ptr.get(key) == sid:
            del self._by_ptr[key]
        if counted:
            self.live_bytes -= self.sizes[sid]
            self.events.append(("f", sid, self._index))

    def sid_of(self, t: torch.Tensor) -> int | None:
        return self._sid(t, allocate=False)

    @contextlib.contextmanager
    def quiet(self):
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def hooks(self):
        return saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        with self.quiet():
            detached = t.detach()
        if not self.record:
            return detached
        try:
            version = t._version
        except RuntimeError:
            version = None
        grad_fn = t.grad_fn
        start, end = _byte_range(t)
        if 0 <= self._index < len(self.ops):
            node = self.ops[self._index].name
        else:
            node = _current_node_name() or (grad_fn.name() if grad_fn is not None else None)
        record = SaveRecord(
            sid=self.sid_of(t),
            node=node,
            after_op=self._index,
            location=user_location(2),
            version=version,
            start=start,
            end=end,
        )
        self.saves.append(record)
        packed = (detached, record)
        if record.sid not in self._last_out_sids:
            # Not an output of the op that just ran: an input of the op about to run (autograd saves inputs
            # before dispatching the op).
            self._pending_saves.append((record, None, None))
        elif grad_fn is not None:
            # An output of the op that just ran (saved after it returned), or that same tensor saved as an input
            # of the next op. Decided at the next op: the producer's node holds our object only in the first case.
            self._pending_saves.append((record, grad_fn, packed))
        return packed

    def _unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        detached, record = packed
        saved_at = record.after_op
        if record.version is not None and detached._version != record.version:
            record.unpacked_version_mismatch = True
            record.raising_writes = [w for w in self.writes.get(record.sid, ()) if w.index > saved_at]
        else:
            record.silent_writes = [w for w in self.writes.get(record.sid, ())
                                    if w.index > saved_at and w.start < record.end and record.start < w.end]
        return detached

    def __enter__(self):
        self._stream = dynamo_safe(OpStream)([self])
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        stream, self._stream = self._stream, None
        return stream.__exit__(*exc)

    def op(self, func, args, kwargs, call):
        if self._quiet:
            return call(func, args, kwargs)
        self._stop_when_done()
        self._index += 1
        index = self._index
        inputs: list[torch.Tensor] = []
        for a in (*args, *kwargs.values()):
            _tensors(a, inputs)
        in_sids = tuple(self._sid(t, allocate=False) for t in inputs)
        if self._pending_saves:
            self._attribute_pending_saves(func, index, in_sids)
        write_targets = _write_targets(func, args, kwargs)
        grad_enabled = torch.is_grad_enabled()
        phase = self._phase()

        # Snapshot pre-existing memory before its first in-place write, so the runner can restore state.
        if write_targets and self.snapshot_writes:
            self._snapshot(write_targets)

        if grad_enabled and phase == "forward":
            self._note_leaves(inputs)

        in_shapes = tuple(tuple(t.shape) for t in inputs)
        want_location = self.record or bool(self.plan)
        location = user_location(2) if want_location and phase == "forward" else None
        key = op_key(func.name(), phase, location, in_shapes, self._counter) if want_location else ()

        out = self._rewritten(key, func, args, kwargs) if self.plan else None
        if out is None:
            out = call(func, args, kwargs)  # run_op repairs the _foreach_ version bump (see writes.py)

        outputs = _tensors(out, [])
        out_sids = tuple(self._sid(t, allocate=True) for t in outputs)
        self._last_out_sids = out_sids

        if self.record:
            self._record_op(func, args, kwargs, index, phase, location, grad_enabled, inputs, in_sids, in_shapes,
                            write_targets, outputs, out_sids, key)
        return out

    def _stop_when_done(self) -> None:
        if self.stop_after_optimizer_steps is not None and self.optimizer_steps >= self.stop_after_optimizer_steps \
                and not self.in_optimizer:
            raise StepComplete()

    def _phase(self) -> str:
        return "backward" if torch._C._current_graph_task_id() != -1 else (
            "optimizer" if self.in_optimizer else "forward")

    def _attribute_pending_saves(self, func, index: int, in_sids: tuple) -> None:
        # Autograd saves an op's inputs before the op reaches us: attribute them to this op.
        for record, producer, packed in self._pending_saves:
            if record.sid is None or record.sid not in in_sids:
                continue
            if producer is not None and _node_holds(producer, packed):
                continue
            record.after_op = index
            record.node = func.name()
        self._pending_saves = []

    def _snapshot(self, write_targets: list) -> None:
        for t in write_targets:
            sid = self._sid(t, allocate=False)
            if sid is not None and sid in self.preexisting and sid not in self.snapshots:
                storage = t.untyped_storage()
                with self.quiet():
                    self.snapshots[sid] = (storage, storage.clone())

    def _note_leaves(self, inputs: list) -> None:
        for t in inputs:
            if t.requires_grad and t.is_leaf and id(t) not in self._leaf_ids:
                self._leaf_ids.add(id(t))
                self.leaves.append(t)
                self.leaf_grads_before.append(t.grad)

    def _rewritten(self, key, func, args, kwargs):
        """The rewrite: run the in-place overload on the dead operand and return an alias of it (None: no rewrite)."""
        operand = self.plan.get(key)
        if operand is None:
            return None
        target = inplace_overload(func)
        tensor_args = [a for a in args if isinstance(a, torch.Tensor)]
        if target is None or operand >= len(tensor_args):
            return None
        new_args = list(args)
        if operand == 1:
            new_args[0], new_args[1] = args[1], args[0]
        target(*new_args, **kwargs)
        self.applied.add(key)
        return torch.ops.aten.alias.default(new_args[0])

    def _record_op(self, func, args, kwargs, index, phase, location, grad_enabled, inputs, in_sids, in_shapes,
                   write_targets, outputs, out_sids, key) -> None:
        if phase == "forward":
            for t, sid in zip(outputs, out_sids):
                if sid is not None and sid in in_sids:
                    self._aliases.setdefault(sid, []).append(weakref.ref(t))
        for t in write_targets:
            sid = self._sid(t, allocate=False)
            if sid is not None:
                start, end = _byte_range(t)
                self.writes.setdefault(sid, []).append(
                    WriteEvent(index, func.name(), location or user_location(3), start, end))
        candidate = inplace_overload(func) is not None and phase == "forward"
        self.ops.append(OpRecord(
            index=index,
            name=func.name(),
            func=func,
            phase=phase,
            location=location,
            grad_enabled=grad_enabled,
            in_sids=in_sids,
            out_sids=out_sids,
            in_shapes=in_shapes,
            out_shapes=tuple(tuple(t.shape) for t in outputs),
            in_dtypes=tuple(t.dtype for t in inputs),
            out_dtypes=tuple(t.dtype for t in outputs),
            **_candidate_facts(inputs, candidate),
            key=key,
            swappable=candidate and _swappable(func, args, kwargs),
        ))

    def finish(self) -> None:
        """Called at the end of the step, before the caller drops its references: what is still alive."""
        self._pending_saves = []  # they hold autograd nodes and saved tensors: drop before judging liveness
        self.alive_sids_at_end = set(self._by_ptr.values())
        for op in self.ops:
            if op.in_refs:
                objs = [r() for r in op.in_refs]
                op.in_alive_end = tuple(o is not None for o in objs)
                op.view_alive_end = tuple(
                    any((a() is not None and a() is not o) for a in self._aliases.get(sid, ()))
                    for o, sid in zip(objs, op.in_sids)
                )
                del objs


def _write_targets(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place, read from its schema's mutable arguments."""
    write_targets: list[torch.Tensor] = []
    for position, name, kwarg_only in written_arguments(func) or ():
        value = kwargs.get(name) if (kwarg_only or position >= len(args)) else args[position]
        _tensors(value, write_targets)
    return write_targets


def _candidate_facts(inputs: list, candidate: bool) -> dict:
    """The autograd facts an in-place candidate's inputs need (the module around the op, liveness refs ...)."""
    if not candidate:
        return dict(module=None, in_refs=(), in_leaf_rg=(), in_view_meta=(), in_overlap=())
    return dict(
        module=_module_context(),
        in_refs=tuple(weakref.ref(t) for t in inputs),
        in_leaf_rg=tuple(t.is_leaf and t.requires_grad for t in inputs),
        in_view_meta=tuple(_view_meta(t) for t in inputs),
        in_overlap=tuple(_overlaps(t) for t in inputs),
    )


_SWAPPABLE = ("aten::add.Tensor", "aten::mul.Tensor")


def _swappable(func, args, kwargs) -> bool:
    return (func.name() in _SWAPPABLE and len(args) >= 2 and isinstance(args[0], torch.Tensor)
            and isinstance(args[1], torch.Tensor) and kwargs.get("alpha", 1) == 1)


def _node_holds(node, packed) -> bool:
    """Whether an autograd node saved exactly this packed object (``_raw_saved_*.data`` is what pack returned)."""
    for name in dir(node):
        if not name.startswith("_raw_saved_"):
            continue
        try:
            raw = getattr(node, name)
        except Exception as error:  # a released or unreadable saved slot cannot hold the tensor
            _log.debug("advisor: %s.%s unreadable (%s: %s)", node.name(), name, type(error).__name__, error)
            continue
        for item in raw if isinstance(raw, (list, tuple)) else (raw,):
            try:
                if item.data is packed:
                    return True
            except Exception as error:  # not a tensor slot
                _log.debug("advisor: saved slot %s skipped (%s: %s)", name, type(error).__name__, error)
                continue
    return False


def _current_node_name() -> str | None:
    try:
        node = torch._C._current_autograd_node()
    except Exception as error:  # private API absent in this torch: no node names in the report
        _log.debug("advisor: torch._C._current_autograd_node unavailable (%s: %s)", type(error).__name__, error)
        return None
    return node.name() if node is not None else None


def _view_meta(t: torch.Tensor) -> str | None:
    if not (t._is_view() and t.requires_grad):
        return None
    try:
        return torch._C._autograd._get_creation_meta(t).name
    except Exception as error:  # private API changed: the view is treated as unknown (never proposed)
        _log.debug("advisor: view creation meta unavailable (%s: %s)", type(error).__name__, error)
        return "UNKNOWN"


def _overlaps(t: torch.Tensor) -> bool:
    try:
        return torch._debug_has_internal_overlap(t) != 0
    except Exception as error:  # cannot tell: assume overlap, so the op is never proposed in place
        _log.debug("advisor: overlap check failed (%s: %s); assuming overlap", type(error).__name__, error)
        return True


class StepComplete(BaseException):
    """Raised inside a script once the requested number of optimizer steps ran: ends the recording."""
