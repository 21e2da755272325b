"""``forward.reference`` and ``gradient.reference``: the op against a trusted implementation, within what the reference's
own error in the op's dtype allows (NOTE [What is compared with what] in ``audit``); at a kink, another valid
subgradient than the reference's passes (NOTE [Kink conventions])."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import numerical as num
from .op_raised import OpRaised
from .op_runs import OpRuns
from .report import CheckResult, Failure
from .runs import Check, Run, Sink, Subject, Suite, scale
from .tolerances import TOLERANCES

__all__ = ["ForwardReference", "GradientReference"]


def _derived_tol(op: Subject, got, ref_d, truth, dt, have_truth, floor):
    magnitude = scale(truth)
    eps = op.B.eps(dt)
    tol = TOLERANCES["reference"]
    if dt == "float64":
        return tol.at(dt, eps) * magnitude + floor, f"{tol.float64:g} x max|reference| (float64) + floor from input/output scales"
    if not have_truth or ref_d is truth:
        return tol.at(dt, eps) * magnitude + floor, f"{tol.ulps:g} ulp x max|reference| ({dt}; reference has no float64 run)"
    with np.errstate(invalid="ignore"):
        d = np.abs(ref_d - truth)
    ref_err = float(np.max(d[np.isfinite(d)], initial=0.0))
    factor = op.opts["reference_factor"]
    ulps = TOLERANCES["reference.ulps"]
    allowed = factor * ref_err + ulps.of(eps) * magnitude + floor
    return allowed, f"{factor:g} x reference's own {dt} error ({ref_err:.3g}) + {ulps.n:g} ulp x max|reference|"


class ForwardReference(Check):
    """``forward.reference``: the op's outputs against the reference's."""

    def compare(self, s: Suite, sink: Sink) -> None:
        lin_d, lin_rd, lin_r64 = s.run.lin_d, s.lin_rd, s.lin_r64
        ok = True
        for k, o in enumerate(s.shared):
            name = lin_d.out_names[o]
            dt = s.run.precision_of(lin_d.out_dtypes[o])
            truth = lin_r64.outputs[k] if lin_r64 is not None else lin_rd.outputs[k]
            allowed, rule = _derived_tol(self.op, lin_d.outputs[o], lin_rd.outputs[k], truth, dt, lin_r64 is not None, 0.0)
            m = num.compare(lin_d.outputs[o], truth, allowed)
            if not m.ok:
                ok = False
                idx = ", ".join(map(str, m.index or ()))
                sink.fail("forward.reference", input=name, message=f"{name} differs from the reference's",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                          where=f"{name}[{idx}]: op {m.got:.6g}, reference {m.expected:.6g}",
                          why="the forward computes a different function than the reference; gradient checks "
                          "against finite differences of the op itself cannot see this.",
                          fix="fix the forward first; then re-run check_op.")
        sink.record("forward.reference", ok)


@dataclass(eq=False)
class GradientReference(Check):
    """``gradient.reference``: the op's VJPs against the reference's; at kinks another valid subgradient passes."""

    runs: OpRuns  # the op's float64 run, when deferred, is made here (NOTE [Finite differences as arbiter])

    def compare(self, s: Suite, sink: Sink) -> tuple[list[CheckResult], list[Failure]]:
        """``gradient.reference``, taken out of the run's checks and failures (to be listed after gradient.numerical)."""
        run = s.run
        marks = len(run.checks), len(run.failures)
        if self.op.reference is not None:
            ok = True
            for i in range(len(self.op.wrt)):
                ok = self._input(s, sink, i) and ok
            sink.record("gradient.reference", ok)
        against_ref = run.checks[marks[0]:], run.failures[marks[1]:]
        del run.checks[marks[0]:], run.failures[marks[1]:]
        return against_ref

    def _input(self, s: Suite, sink: Sink, i: int) -> bool:
        op, run = self.op, s.run
        dt = run.precision_of(op.dtype(i))
        got = np.stack([g[i] for g in s.g_cmp])
        ref_d = np.stack([g[i] for g in s.g_rd])
        truth = np.stack([g[i] for g in s.g_r64]) if s.g_r64 is not None else ref_d
        allowed, rule = _derived_tol(op, got, ref_d, truth, dt, s.g_r64 is not None, op.floor(i, run, dt))
        m = num.compare(got, truth, allowed)
        if m.ok and run.g_64 is not None and s.g_r64 is not None and not s.all64 and run.eff == "float64" \
                and s.g_cmp is run.g_d:
            got64 = np.stack([g[i] for g in run.g_64])
            magnitude = scale(truth)
            rel64 = TOLERANCES["reference.float64_op"]
            m2 = num.compare(got64, truth, rel64 * magnitude + op.floor(i, run, "float64"))
            if not m2.ok:
                m, rule = m2, f"{rel64:g} x max|reference| (float64 op vs float64 reference)"
        if m.ok:
            return True
        # a padding row's zero gradient is a convention, not a kink: only the kinks regime has subgradients
        if s.regime == "kinks" and self._kink_subgradient(s, i, got, truth, allowed):
            return True
        m.index = m.index[1:] if m.index else m.index
        name = op.names[op.wrt[i]]
        sink.fail("gradient.reference", input=name,
                  message=f"gradient of {name} differs from the reference's",
                  max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                  where=op.where(i, m, "op", "reference"),
                  why="the op's backward does not compute the reference's gradient (to the precision the "
                  "reference itself reaches in this dtype).",
                  fix="compare the backward formula with the reference's; the worst element is shown above.")
        return False

    def _kink_subgradient(self, s: Suite, i: int, got, truth, allowed) -> bool:
        """Whether the op's gradient, which differs from the reference's in the kinks regime, is another valid
        subgradient there (NOTE [Kink conventions]); a note says so."""
        run = s.run
        self.runs.op64_late(s)
        if run.lin_64 is not None and s.g_cmp is run.g_d and \
                _within_subgradient(self.op, i, s.args, run, got, truth, allowed):
            name = self.op.names[self.op.wrt[i]]
            run.notes.append(f"gradient of {name} differs from the reference's only at kinks, where it is another "
                             f"valid subgradient (between the one-sided derivatives): accepted")
            return True
        return False


def _within_subgradient(op: Subject, i, args, run: Run, got, truth, allowed, most: int = 64) -> bool:
    """Whether every element where the op's gradient differs from the reference's lies between the one-sided
    derivatives of <u, fn> along that element (NOTE [Kink conventions]).

    # NOTE [Kink conventions]
    # At a kink (relu at 0, clamp at its limits) any value between the left and the right derivative is a valid
    # gradient; a reference that picks 0 does not make the op's 1 a bug. Where the two differ, fn's float64 forward
    # is stepped by +-h on that element alone (2 calls per element, at most ``most`` elements) and the op's value
    # must lie between <u, f(x) - f(x - h e_j)> / h and <u, f(x + h e_j) - f(x)> / h for every cotangent u.
    """
    B = op.B
    with np.errstate(invalid="ignore"):
        bad = np.abs(got - truth) > allowed
    flat_bad = np.argwhere(bad.reshape(bad.shape[0], -1).any(axis=0)).reshape(-1)
    if flat_bad.size == 0 or flat_bad.size > most:
        return False
    base = op.to64(args)
    pos = op.wrt[i]
    x = B.to_numpy(base[pos])
    names = run.lin_64.out_names
    f0 = run.lin_64.outputs
    K = got.shape[0]
    g = got.reshape(K, -1)
    tol = np.broadcast_to(np.asarray(allowed, dtype=np.float64), got.shape).reshape(K, -1)
    for j in flat_bad:
        h = TOLERANCES["kink.step"] * max(1.0, abs(float(x.reshape(-1)[j])))
        sides = []
        for sign in (1.0, -1.0):
            v = x.reshape(-1).copy()
            v[j] += sign * h
            moved = list(base)
            moved[pos] = B.with_values(base[pos], v.reshape(x.shape))
            try:
                f = B.forward64(op.fn, moved, op.kwargs, names)
            except OpRaised:
                return False
            sides.append(np.array([sign * num.dot(u, [a - b for a, b in zip(f, f0)]) / h for u in run.U]))
        lo, hi = np.minimum(*sides), np.maximum(*sides)
        slack = tol[:, j] + TOLERANCES["kink.slack"] * (np.abs(lo) + np.abs(hi))
        if not (np.all(np.isfinite(lo)) and np.all(g[:, j] >= lo - slack) and np.all(g[:, j] <= hi + slack)):
            return False
    return True
