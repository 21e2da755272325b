"""The PyTorch probe: saved-tensor hooks and the write log, feeding the core guard engine.

The pipeline is :class:`gradguard.core.engine.GuardEngine`, shared with Paddle and MindSpore; this module turns
torch's hooks and writes into :mod:`gradguard.core.events`, answers the engine's questions about torch tensors and
keeps what only torch has: user saved-tensor hooks stacked under ours, tensors a Function keeps on ctx, graph
nodes and their argument names, the forward lines of freed graphs.

# NOTE [Saved-tensor hooks switch PyTorch's own version check off]
# torch/csrc/autograd/saved_variable.cpp, SavedVariable::unpack: "Only check version counter in the case
# without hooks". So the moment the guard installs hooks, PyTorch stops raising "one of the variables
# needed for gradient computation has been modified by an inplace operation". The unpack hook below redoes
# exactly that check (saved ``_version`` vs current), so the guard raises when PyTorch would and only then.
#
# NOTE [What pack keeps]
# What PyTorch itself keeps (SavedVariable): a leaf (a parameter, a buffer, any tensor that needs no grad)
# is kept as the tensor itself, so ``u.data = new`` before backward makes backward read the new memory;
# an op's output is kept as a shallow copy over the same memory, which such a rebinding does not move.
# Pack keeps the same: a leaf itself (its fingerprint then shows the rebinding, a silent write), any other
# tensor as ``t.detach()``, which shares ``t``'s memory *and* version counter and breaks the Python<->C++
# reference cycle that returning an output itself creates (that leaks the output of every op that saves its
# result). ``t.data`` would not do: it has its own version counter. Pack cannot tell a non-leaf input from
# an output, so a ``.data =`` rebinding of a non-leaf input is not followed (PyTorch would follow it).
#
# NOTE [Reading grad_fn crashes deep graphs]
# ``t.grad_fn`` creates a Python object for the autograd node. Once tens of thousands of nodes along one chain
# have such objects, freeing the graph recurses once per node through their deallocators and overflows the C
# stack (segfault, measured on torch 2.13 with a 60k-op chain; plain PyTorch code that reads ``grad_fn`` on
# every step crashes the same way). Pack therefore asks ``is_leaf`` (no Python node object) and reads the
# producer's name for at most ``_PRODUCER_NAMES`` saves per backward pass; later saves of a very long forward
# go without "output of X" in their finding, nothing else changes. ``torch._C._current_autograd_node()`` makes
# the same Python object for the node that is unpacking, so the unpack hook asks it for at most
# ``_PRODUCER_NAMES`` unpacks per backward pass too (NOTE [Where a freed graph was made]): a 100k-op graph freed
# inside a function segfaulted with one per unpack.
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from torch.autograd.graph import saved_tensors_hooks

from ...core.diagnosis import classify_source, saves_running_stat
from ...core.engine import LedgerRecord, SavedRecord
from ...core.events import BackwardStarted, TensorSaved, TensorUnpacked, TensorWritten
from ...core.facts import Facts
from ...core.findings import Finding, TensorInfo, WriteRecord
from ...core.frames import LIBRARY_PATHS, caller_context, user_location, user_location_and_caller, user_variable_names
from ...core.module_sites import path_in_user_self
from ...core.internal import log_fallback
from ...core.data_statements import may_write_data
from ..adapter import ProbeBase
from . import attribution as _attribution, backward_calls as _backward_calls, forward_hooks as _forward_hooks
from . import user_hooks as _user_hooks
from .fingerprint import bits, byte_range as _byte_range, fingerprint as _fingerprint, share_elements
from .fingerprint import same as _same_fingerprint
from .graph import NODE_NAMES as _NODE_NAMES, _unpacking_argument, capture_graph, iter_saved, name_by_variable
from .graph import name_in_writing_frame, name_tensor, node_name, one_heap_scan, storage_key
from .backward_calls import loss_made_before_steps, recompute_in_loop
from .writes import Bisector, CallGate, OpStream, WriteLog, dynamo_safe, install, lifted, python_op_name, uninstall

__all__ = ["TorchGuardSession", "FINGERPRINT_MODES"]

FINGERPRINT_MODES = ("full", "sample", "off")
_PRODUCER_NAMES = 4096  # grad_fn names read per backward pass (see NOTE [Reading grad_fn crashes deep graphs])

LIBRARY_PATHS.add(torch.__path__[0])

_ACTIVATIONS = {
    "relu_", "leaky_relu_", "elu_", "celu_", "selu_", "silu_", "gelu_", "hardtanh_", "hardsigmoid_",
    "hardswish_", "mish_", "threshold_", "sigmoid_", "tanh_", "rrelu_with_noise_",
    "bernoulli_", "feature_dropout_", "dropout_", "alpha_dropout_",
}


def _plain(t: torch.Tensor) -> bool:
    """A tensor of one strided block of real memory (no subclass, sparse, nested or meta tensor)."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout is torch.strided and not t.is_meta
            and not t.is_nested)


def _alias_past_the_op_stream(t: torch.Tensor) -> torch.Tensor:
    """``t.detach()`` (NOTE [What pack keeps]) without the guard's own op stream (~5 us per saved tensor in
    forensic mode). Plain tensors only: a tensor subclass's own ``__torch_dispatch__`` must see its detach."""
    if (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and _dispatch_stack_len():
        with torch._C._DisableTorchDispatch():
            return t.detach()
    return t.detach()  # no dispatch mode active (the sentinel; forensic outside in-place calls): 1.0 -> 0.4 us


_dispatch_stack_len = torch._C._len_torch_dispatch_stack


_OWNERS = (torch.optim.Optimizer, torch.nn.Module)  # what a write's frames may name as its owner

_STRIDED = torch.strided
_DYNAMO_TRACES_HOOKS = _user_hooks.DYNAMO_TRACES_HOOKS
_SAVED_TENSOR_DATA = _user_hooks.SAVED_TENSOR_DATA
_current_graph_task_id = torch._C._current_graph_task_id
_current_autograd_node = torch._C._current_autograd_node
_NODE_SITES = 65536  # entries kept before the map starts over (diagnosis only: losing old ones is harmless)


@dataclasses.dataclass(slots=True, weakref_slot=True, eq=False)
class _UserHookRecord:
    """What the guard's pack returns for a tensor that goes through the user's own saved-tensor hooks: the
    user's packed object and a small summary of the tensor at save time (never the tensor: offloading hooks
    must free it)."""

    packed: object
    shape: tuple
    strides: tuple
    dtype: torch.dtype
    fp: object
    samples: object
    site: object
    producer: str | None
    version: int | None


class _VersionOnly:
    """A saved tensor gradguard cannot fingerprint (sparse, nested): PyTorch's own version check, redone."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.version = tensor, tensor._version

    def unpack(self) -> torch.Tensor:
        now = self.tensor._version
        if now != self.version:
            layout = _user_hooks.unreadable_layout(self.tensor)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[a {layout.replace(' tensors', '')} {str(self.tensor.dtype).replace('torch.', '')} tensor] is at "
                f"version {now}; expected version {self.version} instead. (PyTorch's own check, redone by "
                f"gradguard, which cannot fingerprint {layout})")
        return self.tensor


def _samples(t: torch.Tensor):
    """Up to 64 elements at fixed logical positions, as float64 (the value check of user-hook round trips)."""
    if not _plain(t) or t.numel() == 0 or t.is_complex() or t.dtype == torch.bool:
        return None
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        flat = t.detach().reshape(-1) if t.is_contiguous() else t.detach().flatten()
        n = flat.numel()
        index = torch.linspace(0, n - 1, min(n, 64), device=t.device).long()
        return flat.index_select(0, index).to("cpu", torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # bf16/fp16 compression hooks are lossy on purpose: accept their rounding (8 mantissa bits), nothing more.
    return bool(torch.allclose(a, b, rtol=1e-2, atol=1e-3 * float(a.abs().max()) + 1e-6, equal_nan=True))


# -- saved tensors on a GPU: fingerprints compared on the device, one host read per backward pass ------------
# NOTE [No host sync per saved tensor]
# Comparing a device fingerprint at unpack needs its answer on the host (``torch.equal`` is a synchronisation:
# the CPU waits until the GPU has run everything queued before it). Doing that for every saved tensor, inside
# the autograd engine's backward, drains the launch queue hundreds of times per step. So on a device:
#   * pack takes the fingerprint in one launch and never waits for it (``device_sample``, fingerprint.py);
#   * unpack checks the version counter at once (a host integer: loud findings stay immediate), takes the
#     fingerprint again, and only queues the pair; it never waits either;
#   * when the backward pass ends (an autograd engine callback, before ``backward()`` returns and so before
#     any optimizer step can use the gradients), the queued pairs are compared in a few batched launches per
#     dtype, and one value is read on the host: the pass's "something changed" flag;
#   * only when that flag is set does gradguard look (with syncs) for which saved tensor changed, and raise
#     the same ``SilentModificationError`` as at unpack on a CPU.
# What the finding loses against a CPU tensor's: the error is raised at the end of the backward pass rather
# than inside the node that unpacked it, so the graph picture is not drawn; the saver node is still named.
# A saved tensor the node released before the end is not kept alive for this (the pass would hold every
# activation until its end): the finding then describes it from its shape and dtype.
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_MAX_PASSES = 8  # passes with queued pairs kept at once (nested backward passes; a pass that failed never flushes)
# A pass's queue: (saved fingerprint, fingerprint now, the record or None, the saver node's name and argument, then,
# without the record, what rebuilds it: its class, version, place, rarely set fields, and the tensor's shape, dtype
# and device) per pair. ``session._device_pass``: (task, queue) of the previous unpack's pass.


def _defer(session, record, now) -> bool:
    """Queue the comparison of ``record``'s device fingerprint with ``now`` until backward ends. Returns False when
    it cannot be deferred (no backward pass running: compare now)."""
    # Once per saved tensor at unpack: the pass of the previous unpack is kept at hand, and a node's name per class
    # (NOTE [The pack and unpack hooks' own cost]).
    task = _current_graph_task_id()
    if task < 0:
        return False
    current = session.__dict__.get("_device_pass")
    pending = current[1] if current is not None and current[0] == task else _pass_of(session, task)
    unpacking = session._unpacking
    if unpacking is not None and unpacking[0] is record:  # the node the session's unpack has just asked for
        node, name = unpacking[1], unpacking[2]
    elif (node := _current_autograd_node()) is None:
        name = None
    else:
        name = node_name(node)
    argument = None
    if name is not None and "BatchNorm" in name:  # NOTE [Running stats saved in eval mode]
        argument = _unpacking_argument(node, record)
        if _training_running_stat(node, name, argument):
            return True  # a training-mode BatchNorm's running stats: a change is allowed, nothing to compare
    # A leaf stays alive anyway, and the write log's records must keep their writes: keep the record. An
    # activation's record would keep its memory alive to the end of the pass: keep what the finding needs of it
    # (see _MAX_PASSES), in the entry's own tuple (one object per entry: NOTE [Few objects per saved tensor]).
    if record.where.producer == "leaf" or session.track_writes or record.writes is not None:
        pending.append((record.fp, now, record, name, argument))
    else:
        t = record.tensor
        pending.append((record.fp, now, None, name, argument, type(record), record.version, record.where,
                        record._seldom, t.shape, t.dtype, t.device))
    return True


def _training_running_stat(node, name: str, argument: str | None) -> bool:
    """A running stat a BatchNorm node saved in training mode (a node that does not say counts as one)."""
    return saves_running_stat(name, argument) and getattr(node, "_saved_training", True) is not False


def _pass_of(session, task: int) -> list:
    """The queue of backward pass ``task`` (made, with its end-of-pass callback, on the pass's first unpack)."""
    passes = session.__dict__.setdefault("_device_passes", {})
    pending = passes.get(task)
    if pending is None:
        if len(passes) >= _MAX_PASSES:
            passes.pop(next(iter(passes)))
        pending = passes[task] = []
        _queue_callback(lambda: _flush(session, task))
    session._device_pass = (task, pending)
    return pending


def _flush(session, task: int) -> None:
    """The end of one backward pass: compare its queued pairs with one host read; raise for the first changed."""
    entries = session.__dict__.get("_device_passes", {}).pop(task, None)
    current = session.__dict__.get("_device_pass")
    if current is not None and current[1] is entries:
        session._device_pass = None
    if not entries:
        return
    changed = _changed(entries)
    if not changed:
        return
    entry = changed[0]
    old, record, name, argument = entry[0], entry[2], entry[3], entry[4]
    if record is None:  # released by backward: a stand-in record over one element expanded to the tensor's shape
        kind, version, where, seldom, shape, dtype, device = entry[5:]
        record = SavedRecord.__new__(kind)
        record.tensor = torch.empty((), dtype=dtype, device=device).expand(shape)
        record.version, record.fp = version, old
        record.where, record._seldom = where, seldom
    note = None
    if len(changed) > 1:
        note = f"{len(changed) - 1} more saved tensor(s) of this backward pass were also modified"
    facts = Facts(checked="at the end of the backward pass (device fingerprints are compared there, with one "
                          "host read per pass)")
    session.engine.raise_record(record, "silent_write", note=note, facts=facts, saver=(name, argument))


def _changed(entries: list) -> list:
    """The entries whose fingerprint changed. One host read when none did (the common case); more only then."""
    groups: dict = {}
    for entry in entries:
        old, now = entry[0], entry[1]
        dtype, shape = old.dtype, old.shape
        if dtype != now.dtype or shape != now.shape:  # another layout came back: changed, no read needed
            return [entry] + [e for e in entries if e is not entry and not _same_fingerprint(e[0], e[1])]
        key = (old.device, dtype, shape[1:])  # torch.cat joins tensors alike but in their first dimension
        olds, nows = groups.setdefault(key, ([], []))
        olds.append(old)
        nows.append(now)
    flags: dict = {}  # device -> one flag per dtype
    with torch._C._DisableTorchDispatch():
        for (device, _dtype, _rest), (olds, nows) in groups.items():
            flags.setdefault(device, []).append(torch.ne(bits(torch.cat(olds)), bits(torch.cat(nows))).any())
        for per_dtype in flags.values():
            flag = per_dtype[0] if len(per_dtype) == 1 else torch.stack(per_dtype).any()  # one read per device
            if flag.item():  # the pass's single host read (one per device the pass saved on)
                return [entry for entry in entries if not _same_fingerprint(entry[0], entry[1])]
    return []


class TorchGuardSession(ProbeBase):
    """The torch probe: installs the hooks (and, with ``track_writes``, the write log) between ``enter()`` and
    ``exit()``; its :class:`~gradguard.core.engine.GuardEngine` checks and raises."""

    backend = "torch"
    framework = "PyTorch"
    raise_at_unpack = True  # torch propagates an exception raised in an unpack hook cleanly
    direct_writers = None  # the core rules' wording is torch's own
    tensor_type = torch.Tensor

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True, bisect: bool = False):
        super().__init__(fingerprint=fingerprint, track_writes=track_writes, bisect=bisect)
        self.bisect = self.engine.bisect
        self._bisect = None
        self.backward_calls: list = []  # _backward_calls.BackwardCall of the backward passes
        self._mode = None  # the op stream (write log, bisect), or the call gate in front of it, while entered
        # no call gate in bisect mode (the bisector checks around every op) or on torch 2.4 (_user_hooks.GATE_CALLS)
        self._gate_calls = self.track_writes and not self.bisect and _user_hooks.GATE_CALLS
        self._write_log = None
        self._forward_hooks = None  # the sentinel's module hooks (forward_hooks.py)
        # writer attribution at Function / Triton boundaries hashes saved memory (attribution.py)
        self._alias = _alias_past_the_op_stream if self.track_writes else torch.Tensor.detach
        self.boundary_mode = self.fingerprint_mode if (self.track_writes and self.fingerprint_mode != "off") else None
        self._attribution = False
        self._triton_pending = False
        self._names_pass, self._names_left = -1, _PRODUCER_NAMES
        self._sites_pass, self._sites_left = -1, _PRODUCER_NAMES  # nodes asked for per backward pass (_unpack)
        self._site_values: dict = {}  # (id(line), id(caller)) -> the node_sites value of this pass (_unpack)
        self._user_hooks = False
        self._unpacking: tuple | None = None  # (record, its node, the node's name) of the unpack running
        # (node name, sequence number) -> (forward line, pass, caller): NOTE [Where a freed graph was made]
        self.node_sites: dict = {}
        # id(tensor) -> reads of it a module's caller has still to make (forward_hooks.py)
        self._pending_reads: dict[int, _forward_hooks.PendingRead] = {}
        self._emit = self.engine.emit
        self._ledger = self.engine.ledger

    @property
    def backward_sites(self) -> list:
        """The user lines of the backward passes seen (CPU: the engine runs on this thread)."""
        return self.engine.backward_sites

    # -- lifecycle -----------------------------------------------------------------------------
    def enter(self) -> None:
        # NOTE [Stack with the user's saved-tensor hooks, never replace them]
        # PyTorch uses only the innermost saved_tensors_hooks. Hooks the user entered before the guard
        # (activation offloading, compression) are therefore called from the guard's own hooks; hooks the
        # user enters inside the guard are wrapped the same way (user_hooks.py). What goes through user
        # hooks is checked on the way back: unpack must return what pack was given (shape, dtype, values).
        _attribution.baselines()  # measured before any hook of ours is installed
        outer = _user_hooks.top_hooks()
        if (outer is None and _user_hooks.TOP_HOOKS is None and _user_hooks.saved_tensors_hooks_active()
                and not _user_hooks.guard_hooks_on_top()):
            # torch 2.4 cannot hand the user's hooks back: keep them, watch no saved tensor in this guard
            _user_hooks.not_watched(self, "hooks", "not watching saved tensors: your saved_tensors_hooks are "
                                    "active and torch < 2.5 cannot show them to gradguard (enter the guard first)")
        else:
            if outer is not None:
                pack, unpack = self.composed(*outer)
            elif self._gate_calls:
                pack, unpack = self._pack_past_the_gate, self._unpack_past_the_gate
            else:
                pack, unpack = self._pack, self._unpack
            self._hooks = saved_tensors_hooks(pack, unpack)
            self._hooks.__enter__()
            _user_hooks.install(self)
            self._user_hooks = True
        try:  # Function and tensor-hook boundaries: hygiene in every mode, writer attribution with the write log
            _attribution.install(self)
            self._attribution = True
            if not self.track_writes:  # NOTE [Silent classes without the write log] (forward_hooks.py)
                self._forward_hooks = _forward_hooks.ForwardHooks(self.engine.report_extra)
                self._forward_hooks.install()
                return
            self._write_log = WriteLog(self._on_write)
            subscribers = [self._write_log]
            if self.bisect:
                self._bisect = Bisector(self)
                subscribers.insert(0, self._bisect)  # outermost: it checks around the write log's work too
            mode = dynamo_safe(OpStream)(subscribers)
            if self._gate_calls:  # NOTE [Ops at the price of calls] (writes.py)
                mode = CallGate(mode, self._write_log, self._wants_ops, self._ledger.any_alive, self._write_seen_after)
            mode.__enter__()
            self._mode = mode  # only once entered: exit() must not exit a mode that never entered
            if isinstance(mode, CallGate):
                install(mode)
            if self.boundary_mode is not None:
                self._triton_pending = not _attribution.triton_wrapped()
            if self._bisect is not None:
                self._bisect.start()
                self.engine.attach_bisector(self._bisect)
        except BaseException:  # undo what was installed
            self.exit()
            raise

    def exit(self) -> None:
        try:
            if self._forward_hooks is not None:
                hooks, self._forward_hooks = self._forward_hooks, None
                hooks.uninstall()
            if self._bisect is not None:
                bisect, self._bisect = self._bisect, None
                self.engine.attach_bisector(None)
                bisect.stop()
            if self._attribution:
                self._attribution = False
                _attribution.uninstall(self)
            if self._mode is not None:
                if isinstance(self._mode, CallGate):
                    uninstall(self._mode)
                self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            if self._user_hooks:
                self._user_hooks = False
                _user_hooks.uninstall(self)
            if self._hooks is not None:
                self._hooks.__exit__(None, None, None)
                self._hooks = None

    # -- hooks -> events -----------------------------------------------------------------------
    @_user_hooks.guard_pack
    def _pack(self, t: torch.Tensor):
        # NOTE [The pack and unpack hooks' own cost]
        # Both hooks run once per saved tensor (~700 times per step in an LSTMCell loop), where each Python call or
        # attribute lookup counts: the producer's name and the user's frames are read here without helper calls,
        # and the engine is called without an event object while nothing subscribes to events
        # (NOTE [The per-tensor path] in core/engine.py).
        #
        # NOTE [Few objects per saved tensor]
        # Every container object that outlives the hook (a record, a tensor object, a tuple kept in a table) counts
        # towards Python's cyclic garbage collector: one young-generation collection per ~700 of them, and the
        # survivors of those pushed into the old generation, whose full collections walk every object of the
        # process (~300k with torch imported: ~250 ms each on the benchmark machine). Plain PyTorch keeps its saved
        # tensors in C++ and makes none. So the hooks keep as few as they can: no event object, one node_sites value
        # per place and pass, one tuple per deferred device comparison (_defer). Measured on the LSTMCell
        # loop (device path, 20 steps, gc.callbacks): 8.3 young and 0.75 middle collections per step and a full one
        # every 20 steps, before; 3.7 and 0.3 and none in 20 steps, after.
        if t.layout is not _STRIDED or t.is_nested:  # NOTE [Tensors the fingerprint cannot read]
            return self._version_only(t)
        if _DYNAMO_TRACES_HOOKS and torch.compiler.is_compiling():  # NOTE in user_hooks.py (torch 2.4)
            return t
        site, caller = user_location_and_caller(2)
        engine = self.engine
        if t.is_leaf:
            alias, producer = t, ("leaf" if t.requires_grad else None)
        else:  # NOTE [What pack keeps]; the producer's name: _producer(), inlined
            alias, producer = self._alias(t), None
            passes = engine.ledger.backward_passes
            if passes != self._names_pass:
                self._names_pass, self._names_left = passes, _PRODUCER_NAMES
            if self._names_left > 0:
                self._names_left -= 1
                grad_fn = t.grad_fn
                if grad_fn is not None:
                    producer = _NODE_NAMES.get(type(grad_fn)) or node_name(grad_fn)
        if engine.subscribers:
            record = engine.emit(TensorSaved(alias, site, None, producer, None, caller))
        else:
            record = engine.save(alias, site, producer, caller)
        if (self.track_writes and site is not None and site.function == "forward" and t.requires_grad
                and may_write_data(site.file, "forward")):
            self._check_data_in_forward(t)
        if self._triton_pending and "triton" in sys.modules:  # imported after the guard was entered
            self._triton_pending = not _attribution.maybe_wrap_triton()
        return record

    def _check_data_in_forward(self, t: torch.Tensor) -> None:
        """A forward saving its parameter after changing it through ``.data`` (forward_hooks.py)."""
        parameter = _forward_hooks.parameter_of(t)
        finding = None if parameter is None else _attribution.quietly(
            "torch.data_in_forward", "reading the forward that saves a parameter",
            _forward_hooks.data_write_before_save, parameter, 4)
        if finding is not None:
            self.engine.report_extra(finding)

    def watch_ctx_tensor(self, t: torch.Tensor, saver: tuple[str, str]) -> SavedRecord | None:
        """Record a tensor a custom Function kept on ctx (``ctx.x = x``) like a saved tensor; checked by
        ``engine.check_kept`` when its backward starts. Inference tensors (no version counter) are not watched."""
        if not _plain(t) or t.numel() == 0 or t.is_inference():
            return None
        return self._emit(TensorSaved(t.detach(), user_location(1), None, self._producer(t), kept_on=saver))

    def saved_before(self, t: torch.Tensor, version: int) -> bool:
        """Whether memory of ``t`` was saved for backward at ``version`` or earlier: backward's own version
        check then raises at a later write (loud), so a boundary check must not call that write silent."""
        span = self.span(t)
        if span is None:
            return False
        if self.track_writes:
            return any(r.version is not None and r.version <= version for r in self._ledger.overlapping(*span))
        node = t.grad_fn  # the sentinel keeps no ledger: the producer's own saved result (exp, sigmoid, tanh)
        return node is not None and any(
            getattr(data, "tensor", None) is not None and data.version is not None and data.version <= version
            and storage_key(data.tensor) == span[0] for _argument, data in iter_saved(node))

    def _producer(self, t: torch.Tensor) -> str | None:
        if t.is_leaf:
            return "leaf" if t.requires_grad else None
        passes = self.engine.ledger.backward_passes
        if passes != self._names_pass:
            self._names_pass, self._names_left = passes, _PRODUCER_NAMES
        if self._names_left <= 0:
            return None
        self._names_left -= 1
        grad_fn = t.grad_fn
        if grad_fn is None:
            return None
        return _NODE_NAMES.get(type(grad_fn)) or node_name(grad_fn)

    def _unwatched(self, t: torch.Tensor, how: str) -> None:
        kind = _user_hooks.unreadable_layout(t)
        _user_hooks.not_watched(self, kind, f"not watching {kind} saved for backward (no strided memory to "
                                f"fingerprint or match writes to): {how}")

    def _version_only(self, t: torch.Tensor) -> "_VersionOnly":
        """A sparse or nested saved tensor: kept with its version, so that unpack raises PyTorch's own error
        where PyTorch's version check would (hooks switch that check off: NOTE at the top)."""
        self._unwatched(t, "only PyTorch's own version check runs for them")
        return _VersionOnly(t if t.is_leaf else t.detach())  # NOTE [What pack keeps]

    def _unpack(self, record: SavedRecord) -> torch.Tensor:
        kind = type(record)
        if kind is not SavedRecord and kind is not LedgerRecord:  # NOTE [The pack and unpack hooks' own cost]
            if kind is _VersionOnly:
                return record.unpack()
            if isinstance(record, torch.Tensor):  # stepped aside at pack time
                return record
        if not _SAVED_TENSOR_DATA and _user_hooks.probing_unpack(record):  # torch 2.4 naming a saved argument
            return record.tensor
        engine = self.engine
        ledger = engine.ledger
        task = _current_graph_task_id()
        if task != ledger.last_pass_id and ledger.note_backward_pass(task):  # a call only once per pass
            self._backward_pass_started()
        # NOTE [Where a freed graph was made]
        # "Trying to backward through the graph a second time" names no node and no line, and a freed node keeps
        # neither its saved tensors nor gradguard's records of them. While a backward unpacks, the node running is
        # known: keep its forward line under (name, sequence number), which a node keeps for life, so the eager
        # diagnosis can name the line that made the freed part the failing backward reached (~0.3 us per unpack).
        # Only the first ``_PRODUCER_NAMES`` unpacks of a pass ask (NOTE [Reading grad_fn crashes deep graphs]);
        # a longer backward names the freed part only where it is within those nodes.
        # The value (line, pass, caller) is one tuple per place and pass, shared by its nodes (NOTE [Few objects per
        # saved tensor]).
        where = record.where
        site = where.site
        if site is not None:
            passes = ledger.backward_passes
            if passes != self._sites_pass:
                self._sites_pass, self._sites_left = passes, _PRODUCER_NAMES
                self._site_values = {}
            if self._sites_left > 0:
                self._sites_left -= 1
                node = _current_autograd_node()
                if node is not None:
                    name = _NODE_NAMES.get(type(node)) or node_name(node)
                    self._unpacking = (record, node, name)  # the device check's defer asks for the same node
                    key = (name, node._sequence_nr())
                    sites = self.node_sites
                    if key not in sites:
                        if len(sites) >= _NODE_SITES:
                            sites.clear()
                        caller = where.caller
                        value = self._site_values.get((id(site), id(caller)))
                        if value is None or value[0] is not site or value[2] is not caller:
                            value = self._site_values[(id(site), id(caller))] = (site, passes, caller)
                        sites[key] = value
        try:
            if engine.subscribers:
                return engine.emit(TensorUnpacked(record))
            return engine.unpacked(record)
        finally:
            self._unpacking = None

    @_user_hooks.guard_pack
    def _pack_past_the_gate(self, t: torch.Tensor):
        # A custom Function's saves and backward's unpacks run under the call gate (NOTE [Ops at the price of
        # calls]); the guard's own reads of the tensor must not pay it (~1 us each). A subclass's own
        # __torch_function__ still runs.
        with lifted(self._mode):
            return self._pack(t)

    def _unpack_past_the_gate(self, record: SavedRecord) -> torch.Tensor:
        with lifted(self._mode):
            return self._unpack(record)

    def _backward_pass_started(self) -> None:
        """The first unpack of a backward pass: where it was called, and the checks that wait for it."""
        if _attribution.entries:  # NOTE [Seeing a dropped inner update]
            _attribution.quietly("torch.second_order", "watching a backward for a dropped inner update",
                                 _attribution.watch_backward, self.engine.report_extra, user_location(3))
        site = user_location(3)
        if site is None:
            return
        self._emit(BackwardStarted(site))
        call = _attribution.quietly("torch.backward_calls", "recording the receiver of a backward call",
                                    _backward_calls.backward_call, 4)
        if call is not None:
            self.backward_calls = (self.backward_calls + [call])[-8:]

    def composed(self, user_pack, user_unpack):
        """(pack, unpack) that run the user's hooks and check the round trip (see NOTE above)."""

        def pack(t: torch.Tensor):
            if t.layout != torch.strided or t.is_nested:  # NOTE [Tensors the fingerprint cannot read]
                self._unwatched(t, "your saved_tensors_hooks keep them as they choose")
                return user_pack(t)
            version = _attribution.tensor_version(t)
            plain = _plain(t)
            fp = _fingerprint(t.detach(), self.fingerprint_mode) if plain and self.fingerprint_mode != "off" else None
            record = _UserHookRecord(None, tuple(t.shape), t.stride(), t.dtype, fp, _samples(t) if plain else None,
                                     user_location(2), self._producer(t), version)
            record.packed = user_pack(t)
            return record

        def unpack(record):
            if not isinstance(record, _UserHookRecord):  # packed before the guard entered
                return user_unpack(record)
            if not _SAVED_TENSOR_DATA and _user_hooks.probing_unpack(record):  # torch 2.4 reading the record:
                return torch.empty(0)  # the user's unpack runs once per real unpack, never for gradguard's reads
            out = user_unpack(record.packed)
            if isinstance(out, torch.Tensor) and not self._round_trip_ok(record, out):
                # NOTE [What a failed round trip through the user's hooks says]
                # Another shape, or other strides with other values: unpack handed back another tensor (a dedup
                # keyed by storage returns one copy for a tensor and its transpose): no write to look for, and
                # the re-run is skipped. Same layout, other values: a write into a tensor the hooks kept, or a
                # copy of another tensor; the write log can tell.
                reason = ("shape" if tuple(out.shape) != record.shape
                          else "layout" if out.stride() != record.strides else "values")
                facts = Facts(user_hooks=reason, packed={"shape": list(record.shape), "strides": list(record.strides)},
                              unpacked={"shape": list(out.shape), "strides": list(out.stride())},
                              writer_unknowable=reason != "values")
                note = None if reason != "values" else (
                    "the tensor came back from your saved_tensors_hooks unpack different from what pack was given "
                    "(an in-place write to a tensor the hooks kept, or an unpack that returns another tensor)")
                self.engine.raise_record(SavedRecord(out.detach(), record.version, record.fp, record.site,
                                                     producer=record.producer,
                                                     passes_at_save=self.engine.ledger.backward_passes),
                                         "silent_write", note=note, facts=facts)
            return out

        return _user_hooks.mark(pack), _user_hooks.mark(unpack)

    def _round_trip_ok(self, record: _UserHookRecord, out: torch.Tensor) -> bool:
        if tuple(out.shape) != record.shape:
            return False
        # the fingerprint hashes memory: a shortcut only for the same layout (a transpose of it hashes equal)
        if record.fp is not None and out.dtype == record.dtype and _plain(out) and out.stride() == record.strides:
            if _same_fingerprint(_fingerprint(out.detach(), self.fingerprint_mode), record.fp):
                return True  # bit-identical round trip (the common case: offloading)
        if record.samples is None:
            return True
        now = _samples(out)
        return now is None or _close(record.samples, now)

    def _on_write(self, func, targets):
        if _attribution.in_kernel():  # the Triton launch boundary reports the kernel's writes itself
            return None
        if torch.is_grad_enabled():
            _attribution.quietly("torch.module_inputs", "looking for the caller of a module's in-place write",
                                 self._watch_module_inputs, func, targets)
        if _attribution.entries:  # the line of a parameter update that drops a create_graph gradient
            for target in targets:
                if _plain(target):
                    _attribution.note_write(target)
        for target in targets:
            key, records = self._saved_records_under(target)
            if key is None:
                continue
            if not records:
                self._note_shared_counter(func, target, key)
            else:
                write = self._describe_write(func.name().replace("::", "."), target)  # "aten.add_.Tensor"
                alias = None
                impl = target.untyped_storage()._cdata
                for record in records:
                    # another storage object on the same memory (torch.from_numpy, DLPack): its own version
                    numpy = record.tensor.untyped_storage()._cdata != impl and write.category in ("other", "copy")
                    if numpy and alias is None:
                        alias = dataclasses.replace(write, category="numpy", via=write.via or "a NumPy/DLPack alias")
                    self.record_write([record], alias if numpy else write, target)
        return None

    def _wants_ops(self, args, kwargs) -> bool:
        """Whether an in-place call needs the op stream (NOTE [Ops at the price of calls]): something listens to
        every write, or one of its tensor arguments shares storage with a saved tensor."""
        if torch.is_grad_enabled() or _attribution.entries or self._write_log.on_read is not None:
            return True
        ledger = self._ledger
        if not ledger.any_alive():
            return False
        items = (item for value in (*args, *kwargs.values())
                 for item in (value if isinstance(value, (list, tuple)) else (value,)))
        # a subclass or meta tensor: the op stream decides, as before the gate
        return any(isinstance(t, torch.Tensor) and (not _plain(t) or ledger.has_storage(storage_key(t))) for t in items)

    def _saved_records_under(self, target) -> tuple[int | None, list]:
        """(storage key, the saved records whose elements ``target`` shares); (None, []) when no saved tensor is
        on its storage (or it is not a plain, non-empty tensor)."""
        span = self.span(target)
        if span is None or not self._ledger.has_storage(span[0]):
            return None, []
        return span[0], [r for r in self._ledger.overlapping(*span) if share_elements(r.tensor, target)]

    def _write_seen_after(self, func, target, before: int, after: int) -> None:
        """A call the gate did not class as in-place moved ``target``'s version: log the write under the call's
        Python name, with the versions around it."""
        _key, records = self._saved_records_under(target)
        if records:
            self.record_write(records, self._describe_write(python_op_name(func), target), target, before, after)

    def _watch_module_inputs(self, func, targets) -> None:
        """A write by a module into its caller's variable that the caller reads again: wait for that read."""
        for target in targets:
            pending = _forward_hooks.written_input(func, target, skip=4)
            if pending is not None:
                reads = self._pending_reads
                if len(reads) >= _forward_hooks.MAX_PENDING:
                    reads.pop(next(iter(reads)))
                reads[id(target)] = pending
                self._write_log.on_read = self._on_read

    def _on_read(self, func, args) -> None:
        reads = self._pending_reads
        for value in args:
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if id(item) in reads:
                    self._check_read(reads, item)

    def _check_read(self, reads: dict, t) -> None:
        pending = reads[id(t)]
        if pending.tensor() is t:
            read = _attribution.quietly("torch.module_inputs", "matching an op to the caller's read",
                                        _forward_hooks.read_of, pending, 5)
            if read is None:
                return  # the module's own ops, or another use of the tensor: not the read
        else:  # another tensor at a freed one's address
            read = None
        del reads[id(t)]
        if not reads and self._write_log is not None:
            self._write_log.on_read = None
        if read is not None:
            self.engine.report_extra(_forward_hooks.finding(pending, t, read))

    def _note_shared_counter(self, func, target, key) -> None:
        """A write into another part of a storage that holds saved tensors (slot t of a preallocated buffer
        while slot t-1 is saved): the bytes differ, but views of one base share one version counter, so the
        write still moves the saved slot's version. Recorded once per saved tensor: its first bump."""
        version = target._version
        stale = [r for r in self.engine.ledger.overlapping(key, 0, 1 << 62)
                 if r.version == version and r.tensor._version == version and not r.writes]
        if stale:
            write = self._describe_write(func.name().replace("::", "."), target)
            self.record_write(stale, dataclasses.replace(write, category="shared_counter"), target)

    def record_write(self, records, write: WriteRecord, target=None, before: int | None = None,
                     after: int | None = None) -> None:
        """Log ``write`` into saved records this probe matched itself (element-wise, for strided views): one
        TensorWritten, logged before the write runs (the engine reads each record's version then), or after it
        with the versions around it (a write the call gate saw only as a version delta)."""
        self._emit(TensorWritten(target, write.op, write.category, write.location, write.library_frame, before, after,
                                 via=write.via, records=records))

    def _describe_write(self, op: str, target) -> WriteRecord:
        owners: list[object] = []
        context = caller_context(skip=4, owner_filter=lambda o: isinstance(o, _OWNERS) and (owners.append(o) or True))
        name = op.split(".")[1] if op.startswith("aten.") else op.rsplit(".", 1)[-1]
        optimizer = next((o for o in reversed(owners) if isinstance(o, torch.optim.Optimizer)), None)
        module = next((o for o in owners if isinstance(o, torch.nn.Module)), None)
        if optimizer is not None:
            category, via = "optimizer", f"{type(optimizer).__name__}.step()"
        elif module is not None and getattr(module, "inplace", False):
            category, via = "activation", _inplace_module_via(module, owners)
        elif name in _ACTIVATIONS:
            category, via = "activation", f"torch.{name}" if name.endswith("_") else op
        else:
            code = context.location.code if context.location else ""
            category, via = classify_source(code) or ("copy" if name == "copy_" else "other"), None
        return WriteRecord(op=op, location=context.location, via=via, library_frame=context.library_frame,
                           category=category)

    # -- the engine's questions ----------------------------------------------------------------
    version = staticmethod(_attribution.tensor_version)  # None for inference tensors (no version counter)

    @staticmethod
    def span(t: torch.Tensor) -> tuple[int, int, int] | None:
        return _byte_range(t) if _plain(t) and t.numel() > 0 else None

    @staticmethod
    def fingerprint(t: torch.Tensor, mode: str):
        kind = type(t)  # _plain(), inlined: once per saved tensor at pack and at unpack
        if ((kind is torch.Tensor or kind is torch.nn.Parameter) and t.layout is _STRIDED and not t.is_meta
                and not t.is_nested):
            return _fingerprint(t, mode)
        return None

    same_fingerprint = staticmethod(_same_fingerprint)
    defer_fingerprint_check = _defer  # NOTE [No host sync per saved tensor]
    name_at_write = staticmethod(name_in_writing_frame)  # NOTE [Naming a tensor where it is written]

    # describe(): ProbeBase's (a module's parameter or buffer, else the user variable holding it: `out`, `labels`)
    name_tensor = staticmethod(name_tensor)
    name_by_variable = staticmethod(name_by_variable)
    finding_scope = staticmethod(one_heap_scan)  # NOTE [One heap scan per finding]

    @staticmethod
    def dtype_name(t: torch.Tensor) -> str:
        return str(t.dtype).replace("torch.", "")

    @staticmethod
    def device_name(t: torch.Tensor) -> str:
        return str(t.device)

    def context(self) -> Facts:
        return Facts()

    @staticmethod
    def saver(record: SavedRecord, tensor: TensorInfo) -> tuple[str | None, str | None]:
        """(node name, argument) of ``record``, which the node running now is unpacking."""
        node = torch._C._current_autograd_node()
        if node is None:
            return None, None
        return node.name(), _unpacking_argument(node, record)

    def phrase(self, finding: Finding, record: SavedRecord) -> None:
        return None  # the core rules speak torch

    def allowed_change(self, record: SavedRecord) -> bool:
        """BatchNorm updates running stats in place without declaring it; its training-mode backward
        does not read them, so the change is harmless.

        # NOTE [Running stats saved in eval mode]
        # An eval-mode forward normalises with the running stats and its backward reads them
        # (dx = dy * w / sqrt(running_var + eps)); a train-mode forward in between updates them in place
        # without moving their version, and the eval backward silently uses the new ones. Only a node saved
        # in training mode (``_saved_training``) is exempt; where the node does not say, it stays exempt.
        """
        node = torch._C._current_autograd_node()
        return node is not None and _training_running_stat(node, node.name(), _unpacking_argument(node, record))

    def annotate(self, finding: Finding, record: SavedRecord, current: bool) -> None:
        """Torch facts the diagnosis reads: backward passes since the save, ``retain_graph``, where the loss was
        made, fused optimizer kernels, and the picture of the graph around the saver."""
        backward = user_location(2)
        facts = finding.facts
        facts.backward_passes_since_save = max(0, self.engine.ledger.backward_passes - record.passes_at_save - 1)
        facts.retain_graph = bool(backward and "retain_graph=True" in backward.code) or None
        facts.backward_at = backward.to_dict() if backward else None
        facts.write_log = self.track_writes
        kind, writes = finding.kind, finding.modified_at
        if kind == "silent_write":
            self._annotate_silent_write(finding, record)
        if current and kind == "inplace_modification" and any(w.category == "optimizer" for w in writes):
            try:  # NOTE [A loss made before the steps]
                facts.loss_made_early = loss_made_before_steps()
                facts.recompute_in_loop = recompute_in_loop()  # NOTE [A value made once, ...]
            except Exception as error:
                log_fallback("torch.loss_site", "finding where the loss was made", error)
        if not current:  # another stale tensor: no graph node is unpacking it now
            return
        try:  # the picture of the graph around the saver (HTML report); never breaks the error path
            facts.graph = capture_graph(torch._C._current_autograd_node(), record, finding)
        except Exception as error:
            log_fallback("torch.graph", "capturing the graph picture", error)

    def _annotate_silent_write(self, finding: Finding, record: SavedRecord) -> None:
        for w in finding.modified_at:
            if not w.bumps_version and w.op.startswith("aten._fused_"):
                w.category = "optimizer"
        if self.track_writes and _plain(record.tensor) and record.tensor.is_leaf:
            saved_in = self._ledger.storage_key_of(record)
            if saved_in is not None and record.tensor.numel() and saved_in != storage_key(record.tensor):
                finding.notes.append(  # NOTE [What pack keeps]
                    "this tensor has other memory than when it was saved (a `.data = ...` assignment after the "
                    "forward): backward reads the new values, as PyTorch does without gradguard, and no version "
                    "counter moved")


def _inplace_module_via(module: torch.nn.Module, owners: list) -> str:
    """An in-place activation module as the user can find it ("gate.2 (ReLU(inplace=True))"): the outermost module
    the user called, by its variable name, plus the submodule path. Only reached for writes into saved memory."""
    via = f"{type(module).__name__}(inplace=True)"
    root = next(o for o in reversed(owners) if isinstance(o, torch.nn.Module))
    prefix = user_variable_names({id(root)}).get(id(root)) or path_in_user_self(root)
    sub = "" if root is module else next((n for n, m in root.named_modules() if m is module), "")
    return f"{prefix}{'.' + sub if sub else ''} ({via})" if prefix else via
