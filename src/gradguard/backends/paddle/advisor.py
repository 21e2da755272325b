"""The in-place memory advisor for PaddlePaddle (dygraph): ``gradguard.advise(step)`` when the step uses Paddle.

Paddle's part of the one advisor pipeline (``gradguard/advisor/pipeline.py``): the tests of the rules over Paddle's
recording, and the runs, each from the same restored state (parameters, buffers, ``.grad``, optimizer state, LR
schedulers, RNGs): an optional warm-up (one-time allocations stay out of the peaks), a record run (calls, reads,
writes and saves logged), plain baseline runs (the reference results and peak), poison and rewrite runs per group
of candidates (results bit-identical to the baseline), then measured rewrites (medians of ``repeats`` runs).

# NOTE [Recording Paddle without a dispatch mode]
# Paddle has no TorchDispatchMode equivalent, so the advisor sees the public Python entry points only: it
# patches them (module functions and ``paddle.Tensor`` methods) for the duration of ``advise``. Candidates are
# the calls of an out-of-place op with an in-place twin (``F.relu`` -> ``F.relu_``, ``Tensor.__add__`` ->
# ``add_``...) made directly from user code, or from the ``forward`` of a ``paddle.nn`` layer the user called
# (``nn.ReLU``). Calls made inside other Paddle functions are never candidates (the user cannot rewrite them),
# but their tensor arguments still count as reads. Ops called through ``paddle._C_ops`` and entry points
# bound before ``advise`` started (``from paddle import exp``) are not seen: a read through them is caught
# by the poison run instead (see NOTE [Why a poison run]).
#
# NOTE [Why a poison run]
# The "used later" rule only sees reads through the wrapped entry points. A read through anything else
# (``_C_ops``, a C++ extension, numpy via ``.numpy()`` into a later computation) would make a rewrite wrong
# without any rule firing. The poison run overwrites the operand with NaN right after the (out-of-place) op:
# if anything later reads it and the value matters, a gradient or parameter changes (NaN is compared bit for
# bit) and the candidate is rejected. It is stronger than the rewrite run, where a later reader would see the
# op's output, often close to the operand's values (relu of a mostly positive tensor).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import itertools
import os
import random
import statistics
import sys
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import paddle
from paddle.base import core

from ..._errors import InvalidArgument
from ...advisor import pipeline
from ...advisor.pipeline import Measured, advise_runs, closure_values, plan_of, ranges_overlap
from ...advisor.report import AdviceReport, Proposal, UnsafeInplaceOp
from ...checks.adapter_base import first_line
from ...core.findings import SourceLocation
from ...core.frames import LIBRARY_PATHS, location_of, user_frames, user_location
from ...core.internal import log_fallback
from ...core.patching import Patch, apply_patch, restore_patch
from .session import _parameters as _optimizer_parameters
from .session import _prefix, _pylayer_saver, _subclasses, _write_entry_points, memory_range

__all__ = ["advise_paddle", "candidate_ops", "Twin"]


# -- recording: the candidate ops and their in-place twins, the wrappers that log calls, reads, writes and saves
# while ``advise`` runs (NOTE [Recording Paddle without a dispatch mode]), and the log they fill (``_Run``)
_LAYER_DIR = os.path.join(os.path.abspath(paddle.__path__[0]), "nn", "layer") + os.sep

MEMORY_METHOD_CPU = ("Paddle host allocator peak above the step's starting level "
                     "(paddle.base.core.host_memory_stat_peak_value('Allocated', 0)), median of the runs")
MEMORY_METHOD_GPU = ("Paddle GPU allocator peak above the step's starting level "
                     "(paddle.device.cuda.max_memory_allocated), median of the runs")


@dataclass(frozen=True)
class Twin:
    """One patched out-of-place entry point and how to make a call of it in place."""

    op: str  # "paddle.nn.functional.relu"
    inplace_op: str  # "paddle.nn.functional.relu_"
    owner: Any  # the module or class the entry point is an attribute of
    attr: str
    operands: tuple  # argument positions that may be overwritten: (0,) or (0, 1)
    rewrite: Callable  # (args, kwargs, operand position) -> the in-place call's result
    spelling: str  # suggestion, {a} = operand, {b} = the other one


def _unary(inplace: Callable) -> Callable:
    def rewrite(args, kwargs, position):
        kwargs = {k: v for k, v in kwargs.items() if k != "name"}
        return inplace(*args, **kwargs)

    return rewrite


def _binary(inplace: Callable, scalar: Callable | None) -> Callable:
    """``x op y`` in place on ``x`` (position 0) or, for commutative ops, on ``y`` (position 1).

    NOTE [Python scalars]: Paddle computes ``x + 2.0`` / ``x * 2.0`` with its ``scale`` kernel, so the twin of a
    scalar call is ``scale_`` with the same arguments; verification decides whether it is bit-identical."""

    def rewrite(args, kwargs, position):
        x, y = args[0], (args[1] if len(args) > 1 else kwargs.get("y"))
        if position == 1:
            x, y = y, x
        if not isinstance(y, paddle.Tensor) and scalar is not None:
            return scalar(x, y)
        return inplace(x, y if isinstance(y, paddle.Tensor) else paddle.full([], y, x.dtype))

    return rewrite


def candidate_ops() -> list[Twin]:
    """The entry points the advisor can rewrite, as present in this Paddle (checked by attribute)."""
    T, F = paddle.Tensor, paddle.nn.functional
    add = _binary(T.add_, lambda x, y: T.scale_(x, 1.0, y))
    mul = _binary(T.multiply_, lambda x, y: T.scale_(x, y))
    sub = _binary(T.subtract_, lambda x, y: T.scale_(x, 1.0, -y))
    div = _binary(T.divide_, None)
    # (owners, attributes, in-place twin, operands, rewrite, spelling): every owner's every attribute that exists
    # (the modules have no dunders: only paddle.Tensor has __add__)
    table = [
        ((F,), ("relu",), "paddle.nn.functional.relu_", (0,), _unary(F.relu_), "F.relu_({a})"),
        ((F,), ("leaky_relu",), "paddle.nn.functional.leaky_relu_", (0,), _unary(F.leaky_relu_),
         "F.leaky_relu_({a}, ...)"),
        ((F,), ("elu",), "paddle.nn.functional.elu_", (0,), _unary(F.elu_), "F.elu_({a}, ...)"),
        ((F, paddle, T), ("sigmoid",), "paddle.Tensor.sigmoid_", (0,), _unary(T.sigmoid_), "{a}.sigmoid_()"),
        ((F, paddle), ("tanh",), "paddle.tanh_", (0,), _unary(paddle.tanh_), "paddle.tanh_({a})"),
        ((T,), ("tanh",), "paddle.Tensor.tanh_", (0,), _unary(T.tanh_), "{a}.tanh_()"),
        ((paddle, T), ("exp",), "paddle.Tensor.exp_", (0,), _unary(T.exp_), "{a}.exp_()"),
        ((paddle, T), ("scale",), "paddle.Tensor.scale_", (0,), _unary(T.scale_), "{a}.scale_(...)"),
        ((paddle, T), ("clip",), "paddle.Tensor.clip_", (0,), _unary(T.clip_), "{a}.clip_(min, max)"),
        ((paddle, T), ("add", "__add__"), "paddle.Tensor.add_", (0, 1), add, "{a}.add_({b})"),
        ((T,), ("__radd__",), "paddle.Tensor.add_", (0,), add, "{a}.add_({b})"),
        ((paddle, T), ("multiply", "__mul__"), "paddle.Tensor.multiply_", (0, 1), mul, "{a}.multiply_({b})"),
        ((T,), ("__rmul__",), "paddle.Tensor.multiply_", (0,), mul, "{a}.multiply_({b})"),
        ((paddle, T), ("subtract", "__sub__"), "paddle.Tensor.subtract_", (0,), sub, "{a}.subtract_({b})"),
        ((paddle, T), ("divide", "__truediv__"), "paddle.Tensor.divide_", (0,), div, "{a}.divide_({b})"),
    ]
    out = []
    for owners, attrs, inplace, operands, rewrite, spelling in table:
        for owner, attr in itertools.product(owners, attrs):
            if callable(getattr(owner, attr, None)):
                out.append(Twin(f"{_prefix(owner)}.{attr}", inplace, owner, attr, operands, rewrite, spelling))
    return out


# Read-only entry points: their tensor arguments count as reads for the "used later" rule.
_OP_MODULE_PREFIXES = ("paddle.tensor", "paddle.nn.functional", "paddle.base.dygraph.generated")
_READ_DUNDERS = ("__sub__", "__rsub__", "__truediv__", "__rtruediv__", "__matmul__", "__rmatmul__", "__pow__",
                 "__rpow__", "__neg__", "__getitem__", "__mod__", "__floordiv__", "__abs__")


def _read_entry_points(skip: dict) -> list[tuple[Any, str]]:
    found = []
    for owner in (paddle, paddle.nn.functional, paddle.linalg, paddle.Tensor):
        for name in dir(owner):
            value = getattr(owner, name, None)
            if (owner, name) in skip or not callable(value):
                continue
            if (owner is paddle.Tensor and name in _READ_DUNDERS) or (
                    not name.startswith("_") and not name.endswith("_") and isinstance(value, types.FunctionType)
                    and (value.__module__ or "").startswith(_OP_MODULE_PREFIXES)):
                found.append((owner, name))
    return found


@dataclass
class _Operand:
    position: int
    ref: Any  # weakref to the operand tensor
    range: tuple | None
    shape: tuple
    dtype: str
    nbytes: int
    leaf_requires_grad: bool
    same_shape: bool
    alive_after: bool = False


@dataclass
class _Call:
    start: int
    end: int
    key: tuple  # (file, line, op, occurrence)
    location: SourceLocation
    module: str | None
    twin: Twin
    operands: list


@dataclass
class _Saved:
    clock: int
    range: tuple
    saver: str | None
    location: SourceLocation | None
    pylayer: bool


@dataclass
class _Write:
    start: int
    end: int
    op: str
    range: tuple | None
    bumped: bool
    location: SourceLocation | None


class _Run:
    """What one execution of the step does: plain, record, rewrite(plan) or poison(plan)."""

    def __init__(self, kind: str, plan: dict | None = None):
        self.kind = kind
        self.plan = plan or {}  # call key -> operand position
        self.record = kind == "record"
        self.clock = 0
        self.counts: dict = {}
        self.stack: list[str] = []
        self.calls: list[_Call] = []
        self.reads: list[tuple[int, tuple]] = []
        self.saved: list[_Saved] = []
        self.writes: list[_Write] = []
        self.backwards: list[int] = []
        self.applied: set = set()
        self.optimizers: list = []

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def note_reads(self, args, kwargs, clock: int | None = None) -> None:
        clock = self.tick() if clock is None else clock
        for t in _tensors(args, kwargs):
            rng = memory_range(t)
            if rng is not None:
                self.reads.append((clock, rng))


_RUN: _Run | None = None


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, paddle.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, paddle.Tensor))


def _site(frame) -> tuple[SourceLocation, str | None] | None:
    """Where a call may be rewritten: the user's own line, or a ``paddle.nn`` layer's ``forward`` (the line is
    then the user's call of the layer). None for calls inside other Paddle code."""
    filename = frame.f_code.co_filename
    if not LIBRARY_PATHS.is_library(filename):
        return location_of(frame), None
    if frame.f_code.co_name == "forward" and os.path.abspath(filename).startswith(_LAYER_DIR):
        layer = frame.f_locals.get("self")
        user = next(user_frames(frame.f_back), None)
        if user is not None and layer is not None:
            return location_of(user), type(layer).__name__
    return None


def _wrapper(original: Callable, call: Callable, extra=None) -> Callable:
    """``original`` as patched: ``call(run, original, args, kwargs, extra)`` while a run is under way, else as is."""
    def wrapper(*args, **kwargs):
        run = _RUN
        if run is None:
            return original(*args, **kwargs)
        return call(run, original, args, kwargs, extra)

    return functools.wraps(original)(wrapper) if isinstance(original, types.FunctionType) else wrapper


def _candidate_call(run: _Run, original, args, kwargs, twin: Twin):
    if run.stack or "out" in kwargs:
        if run.record:
            run.note_reads(args, kwargs)
        return original(*args, **kwargs)
    site = _site(sys._getframe(2))
    if site is None:
        return _read_call(run, original, args, kwargs, twin.op)
    location, module = site
    base = (location.file, location.line, twin.op)
    occurrence = run.counts[base] = run.counts.get(base, 0) + 1
    key = (*base, occurrence)
    position = run.plan.get(key)
    run.stack.append(twin.op)
    start = run.tick()
    try:
        if position is not None and run.kind == "rewrite":
            run.applied.add(key)
            return twin.rewrite(args, kwargs, position)
        out = original(*args, **kwargs)
        if position is not None and run.kind == "poison":
            run.applied.add(key)
            _poison(_operand_of(args, kwargs, position))
        if run.record:
            _record_call(run, twin, key, location, module, args, kwargs, out, start)
        return out
    finally:
        run.stack.pop()


def _read_call(run: _Run, original, args, kwargs, op: str):
    if run.record:
        run.note_reads(args, kwargs)
    run.stack.append(op)
    try:
        return original(*args, **kwargs)
    finally:
        run.stack.pop()


def _write_call(run: _Run, original, args, kwargs, op: str):
    if not run.record:
        return original(*args, **kwargs)
    target = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(target, paddle.Tensor):
        return _read_call(run, original, args, kwargs, op)
    run.note_reads(args, kwargs)
    start = run.clock
    before = target.inplace_version
    out = _read_call(run, original, args, kwargs, op)
    run.writes.append(_Write(start, run.tick(), op, memory_range(target), target.inplace_version != before,
                             user_location(3)))
    return out


def _backward_call(run: _Run, original, args, kwargs, _):
    run.backwards.append(run.tick())
    return original(*args, **kwargs)


def _step_call(run: _Run, original, args, kwargs, _):
    if all(o is not args[0] for o in run.optimizers):
        run.optimizers.append(args[0])
    return original(*args, **kwargs)


def _operand_of(args, kwargs, position):
    if position < len(args):
        return args[position]
    return kwargs.get(("x", "y")[position])


def _poison(t) -> None:
    if isinstance(t, paddle.Tensor):
        with paddle.no_grad():
            t.set_value(paddle.full_like(t, float("nan")))


def _record_call(run: _Run, twin: Twin, key, location, module, args, kwargs, out, start) -> None:
    run.note_reads(args, kwargs, start)
    operands = []
    if isinstance(out, paddle.Tensor):
        for position in twin.operands:
            t = _operand_of(args, kwargs, position)
            if not isinstance(t, paddle.Tensor) or "float" not in str(t.dtype):
                continue  # only floating tensors: poisoning with NaN needs them, and they hold the activations
            operands.append(_Operand(
                position=position, ref=weakref.ref(t), range=memory_range(t), shape=tuple(t.shape),
                dtype=str(t.dtype).replace("paddle.", ""), nbytes=int(t.size) * t.element_size(),
                leaf_requires_grad=bool(t.is_leaf and not t.stop_gradient),
                same_shape=tuple(t.shape) == tuple(out.shape) and t.dtype == out.dtype))
    run.calls.append(_Call(start, run.tick(), key, location, module, twin, operands))


def _install_patches(twins: list[Twin]) -> list[Patch]:
    """Every patched entry point (the first wrapper of each wins), for the whole ``advise`` call; the caller
    always undoes them."""
    wrappers: dict = {}  # (owner, name) -> wrapper
    for twin in twins:
        wrappers.setdefault((twin.owner, twin.attr), _wrapper(getattr(twin.owner, twin.attr), _candidate_call, twin))
    for owner, name in _write_entry_points():
        wrappers.setdefault((owner, name), _wrapper(getattr(owner, name), _write_call, f"{_prefix(owner)}.{name}"))
    for owner, name in _read_entry_points(wrappers):
        wrappers.setdefault((owner, name), _wrapper(getattr(owner, name), _read_call, f"{_prefix(owner)}.{name}"))
    for owner in (paddle.Tensor, paddle.autograd):
        wrappers.setdefault((owner, "backward"), _wrapper(owner.backward, _backward_call))
    for cls in [paddle.optimizer.Optimizer, *_subclasses(paddle.optimizer.Optimizer)]:
        if "step" in cls.__dict__:
            wrappers.setdefault((cls, "step"), _wrapper(cls.__dict__["step"], _step_call))
    patches = [apply_patch(owner, name, lambda _original, w=w: w) for (owner, name), w in wrappers.items()]
    return [patch for patch in patches if patch is not None]  # NOTE [One way to patch]


# -- saved-tensor hooks (record run only) -----------------------------------------------------------------
def _pack(t):
    # NOTE: never raise here (an exception in Paddle's hooks leaves autograd disabled; see session.py)
    run = _RUN
    try:
        if run is not None and isinstance(t, paddle.Tensor):
            rng = memory_range(t)
            if rng is not None:
                run.saved.append(_Saved(run.tick(), rng, run.stack[-1] if run.stack else None, user_location(2),
                                        _pylayer_saver(2) is not None))
    except Exception as error:  # a missed save only makes the rules less strict; verification remains
        log_fallback("paddle.advisor", "recording a tensor saved for backward", error)
    return t


def _unpack(t):
    return t


# -- running the step again and again from one state: what it reaches (models, optimizers, schedulers), snapshots
# and restores of their state and the RNGs, the peak-memory meter, and one run of the step (``_Advisor.execute``)
_SKIP_MODULES = ("builtins", "numpy", "paddle", "typing", "functools", "collections")


def _discover(roots) -> list[list]:
    """Loose tensors, layers, optimizers and LR schedulers reachable from ``fn``, its arguments, closure cells
    and the globals its code names (bounded walk, depth 5; it stops at each of these)."""
    kinds = (paddle.Tensor, paddle.nn.Layer, paddle.optimizer.Optimizer, paddle.optimizer.lr.LRScheduler)
    found: list[dict] = [{} for _ in kinds]
    seen: set = set()
    todo = [(r, 0) for r in roots]
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen or depth > 5:
            continue
        seen.add(id(obj))
        kind = next((i for i, k in enumerate(kinds) if isinstance(obj, k)), None)
        if kind is None:
            todo += [(v, depth + 1) for v in _children(obj)]
            continue
        found[kind][id(obj)] = obj
        lr = getattr(obj, "_learning_rate", None) if kind == 2 else None  # an optimizer's LR scheduler
        if isinstance(lr, kinds[3]):
            found[3][id(lr)] = lr
    return [list(f.values()) for f in found]


def _children(obj) -> list:
    """What the walk visits next from ``obj`` (nothing inside modules, classes and library objects)."""
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        return list(obj.values() if isinstance(obj, dict) else obj) if len(obj) <= 10000 else []
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, functools.partial):
        return [obj.func, obj.args, obj.keywords]
    if isinstance(obj, types.FunctionType):
        return [*closure_values(obj),
                obj.__defaults__ or (),
                *(obj.__globals__[n] for n in _global_names(obj.__code__) if n in obj.__globals__)]
    if isinstance(obj, (types.ModuleType, type)) or type(obj).__module__.split(".")[0] in _SKIP_MODULES:
        return []
    if hasattr(obj, "__dict__"):
        return list(vars(obj).values())
    return []


def _global_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _copy_containers(value, depth: int = 3):
    if depth == 0:
        return value
    if isinstance(value, dict):
        out = copy.copy(value)
        for k, v in value.items():
            out[k] = _copy_containers(v, depth - 1)
        return out
    if isinstance(value, list):
        return [_copy_containers(v, depth - 1) for v in value]
    if isinstance(value, set):
        return set(value)
    return value


def _tensors_in(value, depth: int = 3):
    if isinstance(value, paddle.Tensor):
        yield value
    elif depth and isinstance(value, (dict, list, tuple)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors_in(v, depth - 1)


def _numpy(t) -> np.ndarray:
    return np.array(t.numpy(), copy=True)


class _State:
    """The step's state, restored before every run; parameters and buffers are what runs are compared on."""

    def __init__(self, roots):
        loose, layers, self.optimizers, self.schedulers = _discover(roots)
        params: dict = {}
        buffers: dict = {}
        for layer in layers:
            for name, p in layer.named_parameters():
                params.setdefault(id(p), (f"{type(layer).__name__}.{name}", p))
            for name, b in layer.named_buffers():
                buffers.setdefault(id(b), (f"{type(layer).__name__}.{name}", b))
        for opt in self.optimizers:
            for i, p in enumerate(_optimizer_parameters(opt)):
                params.setdefault(id(p), (getattr(p, "name", f"param{i}"), p))
        self.params = list(params.values())
        self.buffers = list(buffers.values())
        self.loose = [t for t in loose if id(t) not in params and id(t) not in buffers]
        self.opt_dicts = [(opt, _copy_containers(dict(opt.__dict__))) for opt in self.optimizers]
        opt_tensors = [t for _, d in self.opt_dicts for t in _tensors_in(d)]
        everything = {id(t): t for t in [p for _, p in self.params] + [b for _, b in self.buffers]
                      + self.loose + opt_tensors}
        self.values = [(t, _numpy(t)) for t in everything.values() if t._is_initialized()]
        self.grads = [(p, None if p.grad is None else _numpy(p.grad)) for _, p in self.params]
        self.sched = [(s, copy.deepcopy(s.state_dict())) for s in self.schedulers]
        self.rng = paddle.get_rng_state()
        self.np_rng = np.random.get_state()
        self.py_rng = random.getstate()

    def restore(self) -> None:
        for opt, saved in self.opt_dicts:
            opt.__dict__.clear()
            opt.__dict__.update(_copy_containers(saved))
        for t, value in self.values:
            t.set_value(value)
        for p, g in self.grads:
            if g is None:
                p.clear_gradient(False)
            elif p.grad is None:
                p.grad = paddle.to_tensor(g, place=p.place)
            else:
                p.grad.set_value(g)
        for s, saved in self.sched:
            s.set_state_dict(copy.deepcopy(saved))
        paddle.set_rng_state(self.rng)
        np.random.set_state(self.np_rng)
        random.setstate(self.py_rng)

    def capture(self) -> list[tuple[str, np.ndarray | None]]:
        out = []
        for name, p in self.params:
            out.append((f"{name}.grad", None if p.grad is None else _numpy(p.grad)))
            out.append((name, _numpy(p)))
        for name, b in self.buffers:
            out.append((name, _numpy(b)))
        return out


def _difference(a: list, b: list) -> str | None:
    """None when ``a`` and ``b`` are bit-identical; else the first tensor that differs."""
    if len(a) != len(b):
        return "a different number of tensors"
    for (name, x), (_, y) in zip(a, b):
        if (x is None) != (y is None):
            return f"{name} is None in one run only"
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes()):
            return f"{name} differs"
    return None


@dataclass
class _Outcome:
    run: _Run
    peak: int
    seconds: float
    error: BaseException | None
    results: list = field(default_factory=list)


@dataclass
class _Candidate(pipeline.Candidate):
    call: _Call
    arg: _Operand
    reasons: list = field(default_factory=list)  # (code, detail)

    operand = property(lambda self: self.arg.position)
    site = key = property(lambda self: self.call.key)
    op_name = property(lambda self: self.call.twin.op)
    location = property(lambda self: self.call.location)
    shape = property(lambda self: self.arg.shape)


def _short(loc: SourceLocation | None) -> str:
    return loc.short if loc is not None else "an unknown line"


def _rule_tests(run: _Run) -> list:
    """Paddle's test of each rule over the recorded log, in report order (see ``pipeline.judge``)."""

    def saved(c):
        s = next((s for s in run.saved if ranges_overlap(s.range, c.arg.range)), None)
        if s is not None:
            return f"saved for backward by {s.saver or 'an op'} at {_short(s.location)}"

    def used_later(c):
        later = next((clock for clock, rng in run.reads if clock > c.call.end and ranges_overlap(rng, c.arg.range)),
                     None)
        if later is not None:
            return f"read again later ({_reader(run, later)})"

    return [
        ("not_same_shape", lambda c: None if c.arg.same_shape else f"operand {list(c.arg.shape)} vs the output"),
        ("leaf_requires_grad", lambda c: f"the operand of {c.call.twin.op} at {_short(c.call.location)} is a leaf "
                                         "with stop_gradient=False" if c.arg.leaf_requires_grad else None),
        ("outlives_step", lambda c: "the operand is still referenced after the step returned (a parameter, an "
                                    "input, or a tensor the step keeps)" if c.arg.alive_after else None),
        ("saved_for_backward", saved), ("used_later", used_later)]


def _reader(run: _Run, clock: int) -> str:
    call = next((c for c in run.calls if c.start <= clock <= c.end), None)
    if call is not None:
        return f"{call.twin.op} at {_short(call.location)}"
    write = next((w for w in run.writes if w.start <= clock <= w.end), None)
    if write is not None:
        return f"{write.op} at {_short(write.location)}"
    return "by a Paddle call the advisor wraps"


def _unsafe_writes(run: _Run) -> list[UnsafeInplaceOp]:
    found = []
    for w in run.writes:
        for s in run.saved:
            consumed = any(s.clock < b < w.start for b in run.backwards)
            if s.clock < w.start and not consumed and ranges_overlap(s.range, w.range):
                why = ("Paddle does not check PyLayer ctx.save_for_backward tensors: the gradient is silently wrong"
                       if s.pylayer else
                       f"{w.op} does not bump the inplace version: Paddle computes the gradient from the new "
                       "values without any error" if not w.bumped else
                       "Paddle raises '...modified by an inplace operation' at backward")
                found.append(UnsafeInplaceOp(
                    "silent" if s.pylayer or not w.bumped else "raises", w.op, w.location, s.saver, s.location,
                    f"{w.op} at {_short(w.location)} overwrites a tensor that {s.saver or 'an op'} saved for "
                    f"backward at {_short(s.location)}: {why}. Fix: write into a copy (y = x.clone()) or use the "
                    f"out-of-place op."))
                break
    return found


class _Advisor:
    """Paddle's advisee (``advisor/pipeline.py``), making the runs the module doc lists."""

    verify_kinds = ("poison", "rewrite")
    explain_together = True

    def __init__(self, fn, args, kwargs, state: _State, tracker, repeats: int, warmup: bool):
        self.fn, self.args, self.kwargs, self.state = fn, args, kwargs, state
        self.tracker, self.repeats, self.warmup = tracker, repeats, warmup
        self.gpu = any(p.place.is_gpu_place() for _, p in state.params)
        self.memory_method = MEMORY_METHOD_GPU if self.gpu else MEMORY_METHOD_CPU
        self.count = 0
        self.base: _Outcome | None = None

    def _meter_start(self) -> int:
        if self.gpu:
            paddle.device.synchronize()
            paddle.device.cuda.reset_max_memory_allocated()
            return paddle.device.cuda.memory_allocated()
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        return core.host_memory_stat_current_value("Allocated", 0)

    def _meter_peak(self) -> int:
        if self.gpu:
            paddle.device.synchronize()
            return int(paddle.device.cuda.max_memory_allocated())
        return int(core.host_memory_stat_peak_value("Allocated", 0))

    def execute(self, run: _Run, label: str) -> _Outcome:
        global _RUN
        self.count += 1
        self.tracker.update(f"run {self.count}: {label}")
        self.state.restore()
        gc.collect()
        hooks = paddle.autograd.saved_tensors_hooks(_pack, _unpack) if run.record else contextlib.nullcontext()
        error, returned = None, []
        base = self._meter_start()
        start = time.perf_counter()
        _RUN = run
        try:
            with hooks:
                result = self.fn(*self.args, **self.kwargs)
                returned = [(f"the step's return value #{i}", _numpy(t)) for i, t in enumerate(_tensors_in(result))]
                del result
        except Exception as exc:  # noqa: BLE001 - reported (or re-raised by the caller for the baseline)
            error = exc
        finally:
            _RUN = None
        seconds = time.perf_counter() - start
        peak = self._meter_peak() - base
        if not paddle.is_grad_enabled():
            paddle.set_grad_enabled(True)
        if run.record:
            gc.collect()
            for call in run.calls:
                for operand in call.operands:
                    operand.alive_after = operand.ref() is not None
        # NOTE: what the step returns (its loss) is compared too: a poisoned operand read by something the
        # advisor does not see may change the loss without changing any gradient.
        results = self.state.capture() + returned if error is None else []
        return _Outcome(run, peak, seconds, error, results)

    def record(self, report: AdviceReport) -> list:
        report.device = "gpu" if self.gpu else "cpu"
        self.first = self.execute(_Run("plain"), "warm-up" if self.warmup else "baseline")
        if self.warmup:
            _check_optimizers(self.state, self.first.run)
        self.recorded = self.execute(_Run("record"), "recording the step")
        rec = self.recorded.run
        report.unsafe_inplace = _unsafe_writes(rec)
        candidates = pipeline.judge([_Candidate(call, arg) for call in rec.calls for arg in call.operands],
                                    _rule_tests(rec), keep_rejected=True)
        report.notes.append(f"{len(rec.calls)} candidate call(s) recorded at Python-level Paddle entry points, "
                            f"{len(rec.saved)} tensor(s) saved for backward; claimed saving = the operand's bytes "
                            "(an upper bound), measured = drop of the allocator peak")
        if self.recorded.error is not None and self.first.error is None:
            raise self.recorded.error
        if not self.warmup:
            _check_optimizers(self.state, rec)
        return candidates

    def baseline(self, report: AdviceReport) -> bool:
        """The plain baseline runs, checked to reproduce each other and the recording (False: the step raises)."""
        plain_error = self.first.error
        if plain_error is not None:
            if not report.unsafe_inplace:
                raise plain_error
            report.notes.append(f"the step raises in plain Paddle ({first_line(plain_error)}): fix the unsafe "
                                "in-place op(s) first; no proposal was verified")
            return False
        done = [] if self.warmup else [self.first]
        base_runs = done + [self.execute(_Run("plain"), "baseline") for _ in range(self.repeats - len(done))]
        error = next((o.error for o in base_runs if o.error is not None), None)
        if error is not None:
            raise error
        self.base = base_runs[0]
        for other in [self.recorded, *base_runs[1:]]:
            diff = _difference(self.base.results, other.results)
            if diff is not None:
                raise InvalidArgument(
                    f"advise(...): the step is not reproducible: two runs from the same restored state differ "
                    f"({diff}). The advisor compares runs bit for bit, so the step must be deterministic and all of "
                    "its state (layers, optimizers, schedulers) reachable from fn, its arguments or the globals it "
                    "names. Pass the model and optimizer as arguments (advise(step, model, opt)) or make the step "
                    "deterministic.")
        report.baseline_peak = self.baseline_peak = int(statistics.median(o.peak for o in base_runs))
        self.baseline_seconds = [o.seconds for o in base_runs]
        return True

    def check(self, kind: str, group: list[_Candidate]) -> str | None:
        out = self.execute(_Run(kind, plan_of(group)), f"{kind} ({len(group)} candidate(s))")
        if out.error is not None:
            return f"{kind} run raised {first_line(out.error)}"
        if len(out.run.applied) != len(group):
            return f"the call was not found again in the {kind} run"
        diff = _difference(self.base.results, out.results)
        if diff is None:
            return None
        if kind == "poison":
            return (f"poison run: {diff} when the operand is overwritten with NaN right after the op "
                    "(something the advisor does not see reads it later)")
        return f"rewrite run: {diff} (gradients or parameters not bit-identical)"

    @staticmethod
    def proposal(c: _Candidate) -> Proposal:
        call, operand = c.call, c.arg
        a, b = ("x", "y") if operand.position == 0 else ("y", "x")
        suggestion = call.twin.spelling.format(a=a, b=b)
        if operand.position == 1:
            suggestion += ": overwrite the second operand, it is the dead one"
        if call.module is not None:
            suggestion = (f"paddle.nn.{call.module} has no in-place switch: call {suggestion} in place of the layer "
                          f"(in the forward that uses it)")
        return Proposal(op=call.twin.op, inplace_op=call.twin.inplace_op, location=call.location, module=call.module,
                        operand="self" if operand.position == 0 else "other", shape=operand.shape,
                        dtype=operand.dtype, tensor_bytes=operand.nbytes, suggestion=suggestion,
                        claimed_peak_saving=operand.nbytes, occurrence=call.key[-1])

    def measure(self, c: _Candidate) -> Measured:
        peak, _, problem = self.measure_runs([c], f"measuring {c.call.location.short}")
        saving = self.baseline_peak - peak
        return Measured(saving, problem or "", identical=problem is None, gain=saving > 0)

    def measure_runs(self, group: list[_Candidate], label: str) -> tuple[int, list[float], str | None]:
        peaks, seconds, problem = [], [], None
        for _ in range(self.repeats):
            out = self.execute(_Run("rewrite", plan_of(group)), label)
            if out.error is not None:
                return 0, [], f"raised {first_line(out.error)}"
            problem = problem or _difference(self.base.results, out.results)
            peaks.append(out.peak)
            seconds.append(out.seconds)
        return int(statistics.median(peaks)), seconds, problem

    def totals(self, report: AdviceReport, kept: list, proposed: list[_Candidate]) -> None:
        if proposed:
            peak, seconds, problem = self.measure_runs(proposed, "all proposals together")
            report.rewritten_peak = peak
            report.measured_total_saving = report.baseline_peak - peak
            report.claimed_total_saving = sum(p.claimed_peak_saving for p in report.proposals)
            report.gradients_identical = problem is None
            if seconds:
                report.baseline_seconds = statistics.median(self.baseline_seconds)
                report.rewritten_seconds = statistics.median(seconds)
                report.timing_runs = (self.baseline_seconds, seconds)
        if report.unsafe_inplace:
            report.notes.append("the step has unsafe in-place writes; proposals are checked against the step as it is")


def _check_optimizers(state: _State, run: _Run) -> None:
    known = {id(o) for o in state.optimizers}
    for opt in run.optimizers:
        if id(opt) not in known:
            raise InvalidArgument(
                f"advise(...): the step called {type(opt).__name__}.step() on an optimizer the advisor cannot "
                "reach from fn, its arguments or the globals it names, so its state could not be restored between "
                "runs. Pass it (and the model) as arguments: advise(step, model, opt) with def step(model, opt): ...")


def advise_paddle(fn, args: tuple = (), kwargs: dict | None = None, *, per_proposal: bool = True,
                  repeats: int = 3, warmup: bool = True, allocator_check: bool | None = None) -> AdviceReport:
    """The Paddle advisor; called by :func:`gradguard.advise` when the step uses Paddle (see the module doc)."""
    if allocator_check is not None:
        raise InvalidArgument("advise(..., allocator_check=...) is PyTorch-only (a torch.profiler cross-check); "
                              "on Paddle the peak is always Paddle's own allocator statistics: drop the argument")
    if per_proposal is not True:
        raise InvalidArgument("advise(..., per_proposal=False) is not supported on Paddle: a Paddle proposal is "
                              "reported only with its own measured peak drop; drop the argument")
    if repeats < 1:
        raise InvalidArgument(f"advise(..., repeats={repeats}) on Paddle: peaks are medians of 'repeats' measured "
                              "runs, so it must be >= 1")
    from ...report.progress import progress

    kwargs = dict(kwargs or {})
    state = _State([fn, *args, *kwargs.values()])
    if not state.params:
        raise InvalidArgument("advise(...): found no Paddle parameters reachable from fn, its arguments or the "
                              "globals it names, so gradients and parameters could not be compared. Pass the model "
                              "(and optimizer) as arguments: advise(step, model, opt).")
    patches = _install_patches(candidate_ops())
    try:
        with progress("gradguard advise (paddle):") as tracker:
            return advise_runs(_Advisor(fn, args, kwargs, state, tracker, repeats, warmup))
    finally:
        for patch in reversed(patches):
            restore_patch(patch)
        state.restore()
