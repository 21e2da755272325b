"""The checks of the op's own runs. Without a reference: ``gradient.precision`` (the op's dtype against its own float64
run) and ``gradient.nonfinite`` (at kinks, finite where the float64 gradient is). ``gradient.cotangent_linearity`` and
``gradient.zero_cotangent``: g(a*u) = a*g(u), g(0) = 0; a float64 gradient linear only to float32's precision is
``gradient.precision``."""

from __future__ import annotations

import numpy as np

from . import numerical as num
from .runs import Check, Sink, Suite, scale
from .tolerances import TOLERANCES, written

__all__ = ["PrecisionCheck", "NonfiniteCheck", "LinearityCheck"]

_LINEARITY_ALPHA = 2.5


class PrecisionCheck(Check):
    """``gradient.precision`` without a reference: the op's dtype run against its own float64 run."""

    def compare(self, s: Suite, sink: Sink) -> None:
        op, run = self.op, s.run
        ok = True
        for i in range(len(op.wrt)):
            dt = op.dtype(i)
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            rel = TOLERANCES["gradient.precision"].get(dt, TOLERANCES["gradient.precision.other"])
            m = num.compare(got, truth, rel * scale(truth) + op.floor(i, run, dt))
            if not m.ok:
                ok = False
                m.index = m.index[1:] if m.index else m.index
                name = op.names[op.wrt[i]]
                sink.fail("gradient.precision", input=name,
                          message=f"gradient of {name} in {dt} is far from the op's own float64 gradient",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|float64 gradient|",
                          where=op.where(i, m, dt, "float64"),
                          why="overflow, cancellation or a missing upcast in low precision (the float64 run is "
                          "correct or was checked against finite differences).",
                          fix=f"accumulate in float32 (or subtract the row max / use a stable formula); pass reference= to "
                          f"judge {dt} error against a trusted implementation instead of a fixed tolerance.")
        sink.record("gradient.precision", ok)


class NonfiniteCheck(Check):
    """``gradient.nonfinite`` at kinks without a reference: finite where the float64 gradient is."""

    def compare(self, s: Suite, sink: Sink) -> None:
        op, run = self.op, s.run
        ok = True
        for i in range(len(op.wrt)):
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            bad = ~np.isfinite(got) & np.isfinite(truth)
            if bad.any():
                ok = False
                name = op.names[op.wrt[i]]
                sink.fail("gradient.nonfinite", input=name, message=f"gradient of {name} is not finite ({int(bad.sum())} elements)",
                          why="a value at a kink or boundary makes the backward divide by zero or take log(0).",
                          fix="guard the special value in backward (torch.where) the way the forward does.")
        sink.record("gradient.nonfinite", ok)


class LinearityCheck(Check):
    """The backward's linearity in the cotangent, on two fresh graphs (NOTE [One backward per graph])."""

    def compare(self, s: Suite, sink: Sink) -> None:
        op, run, fail = self.op, s.run, sink.fail
        use64 = run.lin_64 is not None
        base = run.g_64 if use64 else run.g_d
        u0 = run.U[0]
        args = op.to64(s.args) if use64 else s.args
        fresh = lambda: op.B.linearize(op.fn, args, op.kwargs, op.wrt)  # NOTE [One backward per graph]
        g_a = fresh().pullback([_LINEARITY_ALPHA * u for u in u0])
        g_z = fresh().pullback([np.zeros_like(u) for u in u0])
        ok_lin = ok_zero = ok_precise = True
        linear = TOLERANCES["gradient.cotangent_linearity"]
        for i in range(len(op.wrt)):
            name = op.names[op.wrt[i]]
            dt = run.eff if use64 else op.dtype(i)
            expected = _LINEARITY_ALPHA * base[0][i]
            magnitude = scale(expected)
            tol = linear.at(dt, op.B.eps(dt))
            floor = _LINEARITY_ALPHA * op.floor(i, run, dt)
            m = num.compare(g_a[i], expected, tol * magnitude + floor)
            coarse = dt == "float64" and not m.ok and \
                num.compare(g_a[i], expected, linear.at("float32", op.B.eps("float32")) * magnitude + floor).ok
            if coarse:
                # linear to float32's precision, not float64's: a backward that rounds to float32 and casts back
                ok_precise = False
                fail("gradient.precision", input=name,
                     message=f"the float64 gradient of {name} is only float32-accurate (scaling the upstream gradient "
                             f"by {_LINEARITY_ALPHA:g} changes it by {m.max_rel:.1e} relative, float64 rounding allows "
                             f"{written(linear.float64)})",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{tol:g} x max|expected|",
                     where=op.where(i, m, f"g({_LINEARITY_ALPHA:g} u)", f"{_LINEARITY_ALPHA:g} g(u)"),
                     why="the backward computes in float32 (or casts grad_output or a saved tensor down) and casts the "
                     "result back: float64 inputs get float32-accurate gradients, which gradcheck's tolerances and "
                     "the dtype of the result both hide.",
                     fix="compute the backward in the input's dtype (remove the float32 casts).")
            elif not m.ok:
                ok_lin = False
                fail("gradient.cotangent_linearity", input=name,
                     message=f"gradient of {name} does not scale linearly with the upstream gradient",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{tol:g} x max|expected|",
                     where=op.where(i, m, f"g({_LINEARITY_ALPHA:g} u)", f"{_LINEARITY_ALPHA:g} g(u)"),
                     why="backward must be linear in grad_output; squaring it, ignoring it or adding a constant "
                     "passes gradcheck (which only uses upstream gradients of 0 and 1) but breaks every loss "
                     "scaling, mean reduction and chain rule.",
                     fix="multiply by grad_output exactly once, and do not use it elsewhere.")
            # 0 x inf = nan where the gradient itself is infinite (a domain edge): arithmetic, not a bug
            inf_here = ~np.isfinite(np.asarray(base[0][i]))
            gz = np.where(inf_here & np.isnan(g_z[i]), 0.0, g_z[i])
            mz = num.compare(gz, np.zeros_like(gz), 0.0)
            if not mz.ok:
                ok_zero = False
                fail("gradient.zero_cotangent", input=name,
                     message=f"a zero upstream gradient gives a non-zero gradient for {name}",
                     max_abs_err=mz.max_abs, where=op.where(i, mz, "g(0)", "expected"),
                     why="backward adds something that does not depend on grad_output.",
                     fix="every term of the gradient must be multiplied by grad_output.")
        sink.record("gradient.cotangent_linearity", ok_lin)
        sink.record("gradient.zero_cotangent", ok_zero)
        if not ok_precise:
            sink.record("gradient.precision", False)
