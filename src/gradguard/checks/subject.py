"""The op ``check_op`` audits (``Subject``): fn, the reference, the adapter, the options and the current inputs, and the
scales every gradient comparison's tolerance floor reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import numerical as num
from .tolerances import TOLERANCES, gradient_floor

__all__ = ["Subject", "Check", "scale"]


@dataclass(eq=False)
class Subject:
    """What every check reads about the op under audit.

    # NOTE [The current regime's inputs]
    # ``args``, ``kwargs`` and ``wrt`` are the inputs being checked now: the regime stage sets them to a regime's
    # (the batch slice's args, an argument regime's kwargs, a subset's wrt) and puts the given ones back, so every
    # check reads them here instead of keeping a copy.
    """

    B: Any  # the framework's check adapter (NOTE [One audit engine] in ``adapter_base``)
    fn: Callable
    reference: Callable | None
    opts: dict
    args: list
    kwargs: dict
    wrt: list[int]
    names: list[str]
    defaults: dict
    input_scales: dict[int, tuple[Any, float]] = field(default_factory=dict)  # id -> (tensor, max|x|) for ``floor``

    def to64(self, args):
        return [self.B.to_float64(a) if self.B.is_tensor(a) and self.B.kind(a) == "float" else a for a in args]

    def dtype(self, i) -> str:
        return self.B.dtype_name(self.args[self.wrt[i]])

    def floor_scales(self, i, run) -> tuple[float, float, float, float]:
        """What ``tolerances.gradient_floor`` needs for the gradient of ``wrt[i]`` in ``run``: max|u| of the first
        cotangent, max|f| of the outputs, max|x| of that input, and the largest max|x| of the differentiated inputs."""
        if run.scales is None:  # the run's cotangent and output scales, once per run
            run.scales = (max((float(np.max(np.abs(x), initial=0.0)) for x in run.U[0]), default=1.0),
                          max((scale(o) for o in run.lin_d.outputs), default=1.0))
        u, f = run.scales
        xs = [self._input_scale(self.args[j]) for j in self.wrt]
        return u, f, xs[i], max(xs, default=0.0)

    def floor(self, i, run, dt) -> float:
        """Absolute tolerance floor in gradient units (see NOTE [Tolerance floor] in ``tolerances``)."""
        return gradient_floor(self.B.eps(dt), *self.floor_scales(i, run))

    def _input_scale(self, t) -> float:
        held, x = self.input_scales.get(id(t), (None, None))
        if held is not t:  # once per input tensor
            x = scale(self.B.to_numpy(t)) if self.B.numel(t) else 1.0
            self.input_scales[id(t)] = (t, x)
        return x

    def where(self, i, m: num.Mismatch, got_label, exp_label) -> str:
        idx = ", ".join(map(str, m.index or ()))
        return f"{self.names[self.wrt[i]]}[{idx}]: {got_label} {m.got:.6g}, {exp_label} {m.expected:.6g}"


@dataclass(eq=False)
class Check:
    """One check of ``check_op`` (as torch.testing's ``Pair``): it reads the op under audit and has one ``compare``."""

    op: Subject


def scale(a: np.ndarray) -> float:
    """max|a| over its finite values (``tiny`` when there are none or all are 0)."""
    a = np.asarray(a)
    fin = a[np.isfinite(a)]
    return float(np.max(np.abs(fin), initial=0.0)) or TOLERANCES["tiny"]
