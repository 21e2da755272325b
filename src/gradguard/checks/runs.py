"""What the checks of ``check_op`` share and pass each other: the op under audit (``Subject``: fn, the reference, the
adapter, the options, the current inputs, and the scales every gradient comparison's tolerance floor reads), one
regime's runs (``Run``, ``Suite``), where a check puts its results (``Sink``, ``Outcome``), and the two ways a regime
ends early."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import numerical as num
from .op_raised import OpRaised
from .regimes import Spec
from .report import CheckResult, Failure
from .tolerances import TOLERANCES, gradient_floor

__all__ = ["Subject", "Check", "scale", "Run", "Suite", "Sink", "Outcome", "ReferenceRaised", "NotApplicable", "reorder"]


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


class ReferenceRaised(Exception):
    """The reference (not the op) raised."""

    def __init__(self, raised: OpRaised):
        super().__init__(str(raised))
        self.raised = raised


class NotApplicable(Exception):
    """A regime whose inputs the reference itself cannot handle."""


@dataclass
class Run:
    """Everything one regime's gradient suite computed."""

    lin_d: Any
    U: list[list[np.ndarray]]
    g_d: list[list[np.ndarray]]
    lin_64: Any = None
    g_64: list | None = None
    eff: str | None = None  # precision the float64 run really has (NOTE [Effective precision])
    failures: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scales: tuple[float, float] | None = None  # max|u| of the first cotangent, max|f| of the outputs (``floor``)

    def precision_of(self, dt: str) -> str:
        """A float64 declared dtype computed in lower precision is judged at that precision."""
        return self.eff if dt == "float64" and self.eff not in (None, "float64") else dt


@dataclass
class Suite:
    """One regime's gradient suite in progress: its inputs, the op's run and the reference's runs."""

    args: list[Any]
    regime: str
    spec: Spec
    run: Run
    all64: bool  # the op's outputs and differentiated inputs are all float64: its run is the float64 run
    deferred: bool  # the op's float64 run is put off until a disagreement needs it (NOTE [Finite differences as arbiter])
    g_cmp: list  # the op's gradients to compare with the reference's (NOTE [Partial references])
    shared: list[int]  # the op's outputs the reference returns too
    lin_rd: Any = None  # the reference in the op's dtype
    lin_r64: Any = None  # the reference in float64
    g_rd: list | None = None
    g_r64: list | None = None


@dataclass
class Sink:
    """Where one regime's checks put their failures and results."""

    run: Run
    regime: str

    def fail(self, check, **kw) -> None:
        self.run.failures.append(Failure(check=check, regime=self.regime, **kw))

    def record(self, check, ok, detail="") -> None:
        self.run.checks.append(CheckResult(check, self.regime, "pass" if ok else "fail", detail))


@dataclass
class Outcome:
    """The whole audit's findings, check results and notes, in the order the stages add them."""

    findings: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, findings=(), checks=(), notes=()) -> None:
        self.findings += findings
        self.checks += checks
        self.notes += notes


def reorder(lin, names: list[str]) -> None:
    """``lin``'s outputs in the order of ``names`` (the reference's names of the outputs it shares with fn)."""
    order = [lin.out_names.index(n) for n in names]
    lin.out_tensors = [lin.out_tensors[j] for j in order]
    lin.outputs = [lin.outputs[j] for j in order]
    lin.out_names = list(names)
