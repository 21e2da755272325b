"""The layout regimes (``regime.<name>`` for non-contiguous, channels-last and reshaped inputs): the same values in
another layout or shape must give the same outputs and gradients as the given inputs."""

from __future__ import annotations

import numpy as np

from . import numerical as num
from .op_raised import OpRaised
from .regimes import Regime
from .report import CheckResult, Failure
from .runs import Check, NotApplicable, Run, scale
from .tolerances import TOLERANCES

__all__ = ["LayoutCheck"]


class LayoutCheck(Check):
    """A layout regime's outputs and first-cotangent gradients against the given inputs' run."""

    def compare(self, regime: Regime, base: Run) -> tuple[list[Failure], list[CheckResult]]:
        op = self.op
        reshaped = regime.spec.reshaped
        try:
            lin = op.B.linearize(op.fn, regime.args, op.kwargs, op.wrt)
        except OpRaised:
            if reshaped:  # an op written for one rank may reject another: not a finding
                raise NotApplicable("fn does not accept the inputs in that shape")
            raise
        check = f"regime.{regime.name}"
        outs = {n: o for n, o in zip(lin.out_names, lin.outputs)}
        if reshaped:
            # NOTE [Same values, another shape]: the regime is only a test of the backward when fn's forward treats
            # the inserted dimension as a batch dimension (outputs equal once reshaped); otherwise fn gives that
            # shape another meaning (a rank-specific op) and the regime does not apply.
            outs = self._reshaped_like(outs, base)
            if outs is None:
                raise NotApplicable("fn gives the reshaped inputs another meaning (its outputs change, not only their shape)")
        found = []
        for what, got, expected, dt, floor in self._pairs(lin, outs, base, reshaped):
            if got is None:
                continue
            m = num.compare(got, expected, self._same_values_allowed(dt, base, expected) + floor)
            if not m.ok:
                found.append(self._failure(regime, what, m))
        return found, [CheckResult(check, regime.name, "fail" if found else "pass")]

    def _pairs(self, lin, outs: dict, base: Run, reshaped: bool) -> list[tuple]:
        """(what, the layout regime's value, the given run's, dtype, floor) for every output and gradient."""
        op = self.op
        g = lin.pullback([_shaped(base.U[0][j], lin.outputs[j]) for j in range(len(base.lin_d.out_names))]) \
            if set(outs) == set(base.lin_d.out_names) else None
        if g is not None and reshaped:
            g = [np.asarray(gi).reshape(np.shape(base.g_d[0][i])) for i, gi in enumerate(g)]
        pairs = [(n, outs.get(n), o, dt, 0.0) for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes)]
        if g is not None:
            pairs += [(f"gradient of {op.names[op.wrt[i]]}", g[i], base.g_d[0][i], op.dtype(i),
                       op.floor(i, base, op.dtype(i))) for i in range(len(op.wrt))]
        return pairs

    @staticmethod
    def _failure(regime: Regime, what: str, m: num.Mismatch) -> Failure:
        idx = ", ".join(map(str, m.index or ()))
        if regime.spec.reshaped:
            change = "the inputs get a size-1 dimension (same values; the forward agrees)"
            why = ("the backward treats a size-1 dimension differently from the forward: a squeeze() or sum() "
                   "without a dim drops it, or a broadcast lines up the wrong axes.")
            fix = "squeeze and unsqueeze only the dimension the op works on (squeeze(dim), keepdim=True)."
        else:
            change = "the inputs are laid out differently"
            why = "the kernel assumes a memory layout (contiguous rows, unit stride) instead of reading the strides."
            fix = "call .contiguous() on inputs before launching the kernel, or pass strides to it."
        return Failure(check=f"regime.{regime.name}", regime=regime.name, input=what.split()[-1] if what.startswith("gradient") else None,
                       message=f"{what} changes when {change} ({regime.description})",
                       max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                       tolerance=f"{TOLERANCES['regime.layout'].ulps:g} ulp x max|value|",
                       where=f"[{idx}]: {regime.name} {m.got:.6g}, as given {m.expected:.6g}",
                       why=why, fix=fix)

    def _same_values_allowed(self, dt: str, base: Run, expected) -> float:
        """What the same computation on the same values may differ by in another layout: ``regime.layout`` x max|value|."""
        dt = base.precision_of(dt)
        return TOLERANCES["regime.layout"].at(dt, self.op.B.eps(dt)) * scale(expected)

    def _reshaped_like(self, outs: dict, base: Run) -> dict | None:
        """The regime's outputs reshaped to the given run's, or None when their values differ."""
        shaped = {}
        for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes):
            got = outs.get(n)
            if got is None or np.size(got) != np.size(o):
                return None
            got = np.asarray(got).reshape(np.shape(o))
            if not num.compare(got, o, self._same_values_allowed(dt, base, o)).ok:
                return None
            shaped[n] = got
        return shaped


def _shaped(u, like):
    return np.asarray(u).reshape(np.shape(like)) if np.size(u) == np.size(like) else u
