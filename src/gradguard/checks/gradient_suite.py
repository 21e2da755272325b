"""One regime's gradient suite: the op's and the reference's runs, then each gradient check in the order the report
lists them (NOTE [What is compared with what] in ``audit``)."""

from __future__ import annotations

from typing import Any

from ..core.internal import log_fallback
from .gradient_numerical import NumericalCheck
from .op_runs import OpRuns
from .precision_check import LinearityCheck, NonfiniteCheck, PrecisionCheck
from .reference_check import ForwardReference, GradientReference
from .regimes import Spec, shrink_candidates
from .runs import Run, Sink, Subject

__all__ = ["GradientSuite"]


class GradientSuite:
    def __init__(self, op: Subject, runs: OpRuns):
        self.op = op
        self.runs = runs
        self.forward_reference = ForwardReference(op)
        self.gradient_reference = GradientReference(op, runs)
        self.numerical = NumericalCheck(op, runs)
        self.precision = PrecisionCheck(op)
        self.nonfinite = NonfiniteCheck(op)
        self.linearity = LinearityCheck(op)

    def run(self, args, regime: str, spec: Spec, linearity: bool, seed_offset: int) -> Run:
        reference = self.op.reference
        s = self.runs.of_op(args, regime, spec, seed_offset)
        if reference is not None:
            self.runs.of_reference(s)
        sink = Sink(s.run, regime)
        if reference is not None:
            self.forward_reference.compare(s, sink)
        # gradient.reference (run before gradient.numerical, listed after it: NOTE [Finite differences as arbiter])
        against_ref = self.gradient_reference.compare(s, sink)
        self.numerical.compare(s, sink, against_ref[1])
        s.run.checks += against_ref[0]
        s.run.failures += against_ref[1]
        if reference is None and spec.precision and s.run.g_64 is not None and not s.all64:
            self.precision.compare(s, sink)
        elif reference is None and spec.convention and s.run.g_64 is not None:
            self.nonfinite.compare(s, sink)
        if linearity:
            self.linearity.compare(s, sink)
        return s.run

    def shrink(self, args, spec, failures, seed_offset) -> list[Any]:
        """The smallest variant of ``args`` on which the same checks still fail."""
        if not self.op.opts["shrink"]:
            return args
        wanted = {f.check for f in failures}
        for cand in shrink_candidates(self.op.B, args):
            try:
                run = self.run(cand, "shrink", spec, linearity="gradient.cotangent_linearity" in wanted or "gradient.zero_cotangent" in wanted, seed_offset=seed_offset)
            except Exception as error:
                log_fallback("checks", "a shrink candidate's gradient suite", error)
                continue
            if wanted & {f.check for f in run.failures}:
                return cand
        return args
