"""What the checks of ``check_op`` pass each other: one regime's runs (``Run``, ``Suite``), where a check puts its
results (``Sink``, ``Outcome``), and the two ways a regime ends early."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .op_raised import OpRaised
from .regimes import Spec
from .report import CheckResult, Failure

__all__ = ["Run", "Suite", "Sink", "Outcome", "ReferenceRaised", "NotApplicable", "reorder"]


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


def reorder(lin, names: list[str]) -> None:
    """``lin``'s outputs in the order of ``names`` (the reference's names of the outputs it shares with fn)."""
    order = [lin.out_names.index(n) for n in names]
    lin.out_tensors = [lin.out_tensors[j] for j in order]
    lin.outputs = [lin.outputs[j] for j in order]
    lin.out_names = list(names)
