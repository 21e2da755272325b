"""``gradient.numerical``: the op's VJP against central differences of its own forward (NOTE [Directional probes] and
NOTE [Tolerances] in ``tolerances``; NOTE [Finite differences as arbiter] in ``audit``), or ``gradient.surrogate``
where a surrogate gradient is declared."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._errors import InvalidArgument
from . import numerical as num
from .differences import Differences
from .op_raised import OpRaised
from .op_runs import OpRuns, reference_pairs
from .report import CheckResult, Failure
from .runs import Run, Sink, Suite
from .subject import Check, scale
from .tolerances import TOLERANCES

__all__ = ["NumericalCheck", "SurrogateCheck"]


@dataclass(eq=False)
class NumericalCheck(Check):
    """``gradient.numerical`` (or ``gradient.surrogate``) for one regime's suite, or why it is skipped."""

    runs: OpRuns  # the op's float64 run, when deferred, is made here (NOTE [Finite differences as arbiter])

    def compare(self, s: Suite, sink: Sink, against_ref: list[Failure]) -> None:
        run, regime, ref = s.run, s.regime, self.op.reference
        numeric_dt = run.eff if run.lin_64 is not None or s.deferred else self.op.dtype(0)
        if self.op.opts["surrogate"] is not None:
            SurrogateCheck(self.op).compare(s, sink)
        elif not s.spec.numerical:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "finite differences not meaningful here"))
        elif ref is not None and regime != "given" and not against_ref:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "the op agrees with the reference's "
                                          "float64 gradient (finite differences would repeat that, less precisely)"))
        else:
            self.runs.op64_late(s)
            if run.lin_64 is not None or numeric_dt == "float32":
                self._inputs(s.args, run, regime, sink.fail, sink.record, s.g_r64, numeric_dt)
            else:
                run.checks.append(CheckResult("gradient.numerical", regime, "skip", f"fn does not run in float64 and {numeric_dt} is too coarse for finite differences"))

    def _inputs(self, args, run: Run, regime, fail, record, g_r64, dt: str):
        """``gradient.numerical``: see NOTE [Directional probes] and NOTE [Effective precision]."""
        op = self.op
        base_args = op.to64(args) if run.lin_64 is not None else list(args)
        G_all = run.g_64 if run.lin_64 is not None else run.g_d
        lin = run.lin_64 if run.lin_64 is not None else run.lin_d
        fd = Differences(op.B, op.fn, op.kwargs, op.wrt, run.U, base_args, lin, dt, op.opts)
        ok = True
        for i in range(len(fd.xs)):
            ok = self._input(fd, i, G_all, run, regime, fail, g_r64, dt) and ok
        record("gradient.numerical", ok)

    def _input(self, fd: Differences, i: int, G_all, run: Run, regime, fail, g_r64, dt: str) -> bool:
        """``gradient.numerical`` for input ``wrt[i]``: whether it passes (failing, it adds the failure)."""
        opts = self.op.opts
        x = fd.xs[i]
        h = num.step_size(x, fd.rel_step)
        name = self.op.names[self.op.wrt[i]]
        G = np.stack([g[i] for g in G_all]).reshape(len(run.U), -1)  # (K, n): 0-dim inputs too
        n = G.shape[1]
        # NOTE [Regimes use directions]: K random directions (2K forward calls) see any wrong element, so they
        # judge every input in every regime. The full Jacobian (2n calls) points at the wrong element: it is
        # computed only where directions found a disagreement, for small inputs, on the given inputs (or their
        # shrunk copy), without a reference (whose comparison points at the element already); its verdict then
        # stands, being the finer test. A correct op never pays the 2n calls.
        locate = n <= opts["full_jacobian_max"] and regime in ("given", "shrink") and self.op.reference is None
        full = False
        padding = self._padding_rows(x) if g_r64 is None and x.ndim >= 1 else ()
        m, domain_edge = fd.directions(i, G, h, padding)
        mode = f"{opts['probes']} random directions x {len(run.U)} cotangents"
        if not m.ok and locate:
            full = True
            m, domain_edge, expected, allowed = fd.jacobian(i, G, h)
            mode = "full Jacobian"
        if domain_edge:
            run.notes.append(f"{name}: {len(domain_edge)} finite-difference point(s) leave fn's domain (fn(x +- h) is not "
                             f"finite, e.g. a log at 0): those are excluded; the gradient there is judged by the reference only")
        if fd.low:
            mode += f", {dt} precision: step {fd.rel_step:.2g} x max(1, |x|)"
        if not m.ok and g_r64 is None and x.ndim >= 1 and full:
            m = self._without_padding_row(x, G, expected, allowed, m, name, run)
        if m.ok:
            return True
        if g_r64 is not None and self._reference_agrees_with_differences(i, G, g_r64, fd, run, dt):
            run.notes.append(f"finite differences disagree with both the op and the reference for {name} "
                             f"(a kink or a convention such as a padding row): judged by the reference's convention")
            return True
        if not fd.low and fd.unsettled(i, h):
            # NOTE [Finite differences that do not settle]: a failure is only as good as its arbiter. In float64
            # (in low precision Richardson's term already bounds it) the differences at h and h/2 are compared
            # once the op disagrees with them; when they disagree with each other beyond the tolerance, fn varies
            # faster than the step resolves (sin(x @ w) with inputs x1000) and nothing is concluded here.
            run.notes.append(f"{name}: finite differences do not settle at this step (h and h/2 disagree beyond the "
                             f"tolerance: fn varies faster than the step resolves), so they do not judge its "
                             f"gradient in regime {regime}")
            return True
        self._failure(fd, i, m, full, mode, dt, fail)
        return False

    def _failure(self, fd: Differences, i: int, m: num.Mismatch, full: bool, mode: str, dt: str, fail) -> None:
        x = fd.xs[i]
        name = self.op.names[self.op.wrt[i]]
        if full:
            idx = np.unravel_index(m.index[1], x.shape) if m.index and x.ndim else ()
            m.index = tuple(int(t) for t in idx)
            where = self.op.where(i, m, f"backward ({dt})", "finite differences")
        else:
            where = f"<u, J d> along a random direction d of {name}: backward {m.got:.6g}, finite differences {m.expected:.6g}"
        fail("gradient.numerical", input=name,
             message=f"backward of {name} disagrees with central differences ({mode})",
             max_abs_err=m.max_abs, max_rel_err=m.max_rel,
             tolerance=f"rounding + rtol {fd.rtol:g} x magnitude of the terms (gradient units)",
             where=where,
             why="the hand-written backward does not compute the vector-Jacobian product of the forward "
             f"(checked in {dt} with random non-unit upstream gradients).",
             fix="re-derive the backward; the worst element is shown above.")

    def _without_padding_row(self, x, G, expected, allowed, m: num.Mismatch, name: str, run: Run) -> num.Mismatch:
        rows = self._padding_rows(x)
        if not rows:
            return m
        # NOTE [padding_idx convention]: the padding row's gradient is zero by definition, although the
        # forward reads it; without a reference, exclude that row from the finite-difference comparison.
        rowmask = np.zeros(x.shape, dtype=bool)
        rowmask[rows] = True
        rowmask = np.broadcast_to(rowmask.reshape(1, -1), G.shape)
        m = num.compare(np.where(rowmask, expected, G), expected, allowed + TOLERANCES["tiny"])
        run.notes.append(f"row {rows[0]} of {name} (padding_idx) is excluded from the finite-difference check")
        return m

    def _reference_agrees_with_differences(self, i: int, G, g_r64, fd: Differences, run: Run, dt: str) -> bool:
        """Whether the reference's float64 gradient is the op's: finite differences disagree with both."""
        R = np.stack([g[i] for g in g_r64]).reshape(G.shape[0], -1)
        rel = TOLERANCES["reference.vs_differences"].at(dt, fd.eps)
        return num.compare(G, R, rel * scale(R) + self.op.floor(i, run, dt)).ok

    def _padding_rows(self, x) -> tuple[int, ...]:
        op = self.op
        positional = {n: a for n, a in zip(op.names, op.args) if n == "padding_idx"}
        p = {**op.defaults, **positional, **op.kwargs}.get("padding_idx")
        if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < x.shape[0]:
            return (p,)
        return ()


class SurrogateCheck(Check):
    """A declared surrogate gradient (a straight-through estimator, LSQ's step-size gradient) replaces finite
    differences, which an intended surrogate fails by design.

    # NOTE [Surrogate gradients]
    # ``surrogate=`` is a function with fn's signature whose autograd gradient is the one fn's backward is meant to
    # compute (``lambda x: x`` for a rounding with a straight-through backward). Wherever finite differences would
    # judge the backward, the op's VJP is compared with the surrogate's float64 VJP for the same cotangents, at the
    # precision the op computes in; the forward is still compared with the reference, when there is one.
    """

    def compare(self, s: Suite, sink: Sink) -> None:
        op, args, run = self.op, s.args, s.run
        B = op.B
        use64 = run.lin_64 is not None
        base = op.to64(args) if use64 else list(args)
        try:
            lin = B.linearize(op.opts["surrogate"], base, op.kwargs, op.wrt)
        except OpRaised as exc:
            raise InvalidArgument(f"check_op: surrogate raised {type(exc.error).__name__} in its {exc.phase} "
                                  f"({str(exc.error)[:200]}); it must run on the inputs fn is checked on.") from exc
        pairs = reference_pairs(B, run.lin_64 or run.lin_d, lin)
        if len(pairs) != len(run.lin_d.out_names):
            raise InvalidArgument("check_op: surrogate must return the same differentiable outputs as fn.")
        order = [lin.out_names.index(n) for _, n in pairs]
        lin.out_tensors = [lin.out_tensors[j] for j in order]
        g_s = [lin.pullback(us) for us in run.U]
        lin.release()
        mine = run.g_64 if use64 else run.g_d
        ok = True
        for i in range(len(op.wrt)):
            dt = run.eff if use64 else op.dtype(i)
            got, truth = np.stack([g[i] for g in mine]), np.stack([g[i] for g in g_s])
            rel = TOLERANCES["gradient.surrogate"].at(dt, B.eps(dt))
            m = num.compare(got, truth, rel * scale(truth) + op.floor(i, run, dt))
            if not m.ok:
                ok = False
                m.index = m.index[1:] if m.index else m.index
                name = op.names[op.wrt[i]]
                sink.fail("gradient.surrogate", input=name, message=f"backward of {name} differs from the declared surrogate's gradient",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|surrogate gradient| ({dt})",
                          where=op.where(i, m, "backward", "surrogate"),
                          why="the backward does not compute the surrogate gradient it is declared to use.",
                          fix="compare the backward with the surrogate's formula; the worst element is shown above.")
        sink.record("gradient.surrogate", ok)
