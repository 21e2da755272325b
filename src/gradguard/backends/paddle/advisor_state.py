"""Running a Paddle step again and again from one state for the in-place advisor: what the step reaches
(models, optimizers, schedulers), snapshots and restores of their state and the RNGs, the peak-memory meter,
and one run of the step (``_Step.run``)."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import random
import time
import types
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddle.base import core

from ...advisor.pipeline import closure_values
from . import advisor_record as _record
from .advisor_record import _Run, _pack, _unpack
from .session import _parameters as _optimizer_parameters

__all__: list[str] = []


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
        self._snapshot()

    def _snapshot(self) -> None:
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


class _Step:
    def __init__(self, fn, args, kwargs, state: _State):
        self.fn, self.args, self.kwargs, self.state = fn, args, kwargs, state
        self.gpu = any(p.place.is_gpu_place() for _, p in state.params)

    def _meter_start(self) -> None:
        if self.gpu:
            paddle.device.synchronize()
            paddle.device.cuda.reset_max_memory_allocated()
            self.base = paddle.device.cuda.memory_allocated()
        else:
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            self.base = core.host_memory_stat_current_value("Allocated", 0)

    def _meter_stop(self) -> int:
        if self.gpu:
            paddle.device.synchronize()
            return int(paddle.device.cuda.max_memory_allocated()) - self.base
        return int(core.host_memory_stat_peak_value("Allocated", 0)) - self.base

    def execute(self, run: _Run) -> _Outcome:
        self.state.restore()
        gc.collect()
        hooks = paddle.autograd.saved_tensors_hooks(_pack, _unpack) if run.record else contextlib.nullcontext()
        error, returned = None, []
        self._meter_start()
        start = time.perf_counter()
        _record._RUN = run
        try:
            with hooks:
                result = self.fn(*self.args, **self.kwargs)
                returned = [(f"the step's return value #{i}", _numpy(t)) for i, t in enumerate(_tensors_in(result))]
                del result
        except Exception as exc:  # noqa: BLE001 - reported (or re-raised by the caller for the baseline)
            error = exc
        finally:
            _record._RUN = None
        seconds = time.perf_counter() - start
        peak = self._meter_stop()
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
