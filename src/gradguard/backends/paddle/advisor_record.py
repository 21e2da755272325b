"""Recording a Paddle step for the in-place advisor: the candidate ops and their in-place twins, the wrappers
that log calls, reads, writes and saves while ``advise`` runs (see NOTE [Recording Paddle without a dispatch
mode] in ``advisor``), and the log they fill (``_Run``)."""

from __future__ import annotations

import functools
import itertools
import os
import sys
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import paddle

from ...core.findings import SourceLocation
from ...core.frames import LIBRARY_PATHS, location_of, user_frames, user_location
from ...core.internal import log_fallback
from ...core.patching import Patch, apply_patch, restore_patch
from .naming import memory_range
from .session import _pylayer_saver, _prefix, _subclasses, _write_entry_points

__all__ = ["Twin", "candidate_ops"]

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


def _read_entry_points(skip: set) -> list[tuple[Any, str]]:
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
        self.depth = 0
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


def _candidate_wrapper(twin: Twin, original: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        run = _RUN
        if run is None:
            return original(*args, **kwargs)
        if run.depth or "out" in kwargs:
            if run.record:
                run.note_reads(args, kwargs)
            return original(*args, **kwargs)
        site = _site(sys._getframe(1))
        if site is None:
            return _read_call(run, original, args, kwargs, twin.op)
        location, module = site
        base = (location.file, location.line, twin.op)
        occurrence = run.counts[base] = run.counts.get(base, 0) + 1
        key = (*base, occurrence)
        position = run.plan.get(key)
        run.depth += 1
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
            run.depth -= 1

    return functools.wraps(original)(wrapper) if isinstance(original, types.FunctionType) else wrapper


def _read_call(run: _Run, original, args, kwargs, op: str):
    if run.record:
        run.note_reads(args, kwargs)
    run.depth += 1
    run.stack.append(op)
    try:
        return original(*args, **kwargs)
    finally:
        run.stack.pop()
        run.depth -= 1


def _read_wrapper(op: str, original: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        run = _RUN
        if run is None:
            return original(*args, **kwargs)
        return _read_call(run, original, args, kwargs, op)

    return functools.wraps(original)(wrapper) if isinstance(original, types.FunctionType) else wrapper


def _write_wrapper(op: str, original: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        run = _RUN
        if run is None or not run.record:
            return original(*args, **kwargs)
        target = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(target, paddle.Tensor):
            return _read_call(run, original, args, kwargs, op)
        run.note_reads(args, kwargs)
        start = run.clock
        before = target.inplace_version
        out = _read_call(run, original, args, kwargs, op)
        run.writes.append(_Write(start, run.tick(), op, memory_range(target), target.inplace_version != before,
                                 user_location(2)))
        return out

    return functools.wraps(original)(wrapper) if isinstance(original, types.FunctionType) else wrapper


def _backward_wrapper(original: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        run = _RUN
        if run is not None:
            run.backwards.append(run.tick())
        return original(*args, **kwargs)

    return functools.wraps(original)(wrapper) if isinstance(original, types.FunctionType) else wrapper


def _step_wrapper(original: Callable) -> Callable:
    def step(optimizer, *args, **kwargs):
        run = _RUN
        if run is not None and all(o is not optimizer for o in run.optimizers):
            run.optimizers.append(optimizer)
        return original(optimizer, *args, **kwargs)

    return functools.wraps(original)(step)


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


class _Patches:
    """Every patched entry point, installed for the whole ``advise`` call and always undone."""

    def __init__(self, twins: list[Twin]):
        self._saved: list[Patch] = []
        done: set = set()
        for twin in twins:
            self._patch(twin.owner, twin.attr, _candidate_wrapper(twin, getattr(twin.owner, twin.attr)), done)
        for owner, name in _write_entry_points():
            self._patch(owner, name, _write_wrapper(f"{_prefix(owner)}.{name}", getattr(owner, name)), done)
        for owner, name in _read_entry_points(done):
            self._patch(owner, name, _read_wrapper(f"{_prefix(owner)}.{name}", getattr(owner, name)), done)
        self._patch(paddle.Tensor, "backward", _backward_wrapper(paddle.Tensor.backward), done)
        self._patch(paddle.autograd, "backward", _backward_wrapper(paddle.autograd.backward), done)
        for cls in [paddle.optimizer.Optimizer, *_subclasses(paddle.optimizer.Optimizer)]:
            if "step" in cls.__dict__:
                self._patch(cls, "step", _step_wrapper(cls.__dict__["step"]), done)

    def _patch(self, owner, name, wrapper, done: set) -> None:
        if (owner, name) in done:
            return
        done.add((owner, name))
        patch = apply_patch(owner, name, lambda _original: wrapper)  # NOTE [One way to patch]
        if patch is not None:
            self._saved.append(patch)

    def undo(self) -> None:
        for patch in reversed(self._saved):
            restore_patch(patch)
        self._saved = []


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
