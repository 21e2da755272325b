"""``gradient.numerical``: the op's VJP against central differences of its own forward (NOTE [Directional probes] and
NOTE [Tolerances] in ``tolerances``; NOTE [Finite differences as arbiter] in ``audit``), or ``gradient.surrogate``
where a surrogate gradient is declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import InvalidArgument
from . import numerical as num
from .op_raised import OpRaised
from .op_runs import OpRuns, reference_pairs
from .report import CheckResult, Failure
from .runs import Check, Run, Sink, Suite, reorder, scale
from .tolerances import TOLERANCES, difference_rtol, difference_step

__all__ = ["NumericalCheck", "SurrogateCheck", "Differences"]


@dataclass(eq=False)
class NumericalCheck(Check):
    """``gradient.numerical`` (or ``gradient.surrogate``) for one regime's suite, or why it is skipped."""

    runs: OpRuns  # the op's float64 run, when deferred, is made here (NOTE [Finite differences as arbiter])

    def compare(self, s: Suite, sink: Sink, against_ref: list[Failure]) -> None:
        """``gradient.numerical``: see NOTE [Directional probes] and NOTE [Effective precision]."""
        op, run, regime = self.op, s.run, s.regime
        dt = run.eff if run.lin_64 is not None or s.deferred else op.dtype(0)
        if op.opts["surrogate"] is not None:
            SurrogateCheck(op).compare(s, sink)
            return
        if not s.spec.numerical:
            skip = "finite differences not meaningful here"
        elif op.reference is not None and regime != "given" and not against_ref:
            skip = ("the op agrees with the reference's float64 gradient (finite differences would repeat that, "
                    "less precisely)")
        else:
            self.runs.op64_late(s)
            skip = None if run.lin_64 is not None or dt == "float32" else \
                f"fn does not run in float64 and {dt} is too coarse for finite differences"
        if skip is not None:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", skip))
            return
        use64 = run.lin_64 is not None
        fd = Differences(op.B, op.fn, op.kwargs, op.wrt, run.U, op.to64(s.args) if use64 else list(s.args),
                         run.lin_64 if use64 else run.lin_d, dt, op.opts)
        ok = True
        for i in range(len(fd.xs)):
            ok = self._input(fd, i, run.g_64 if use64 else run.g_d, run, regime, sink.fail, s.g_r64, dt) and ok
        sink.record("gradient.numerical", ok)

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
        reorder(lin, [n for _, n in pairs])
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


class Differences:
    """fn's central differences around the inputs ``base_args`` of one run (float64, or the op's dtype ``dt``), one
    input at a time; the step in low precision is NOTE [Effective precision] in ``audit``."""

    def __init__(self, B, fn, kwargs, wrt, U, base_args, lin, dt: str, opts):
        self.B, self.fn, self.kwargs, self.wrt, self.U = B, fn, kwargs, wrt, U
        self.low = dt != "float64"
        self.probes = opts["probes"]
        self.base_args = base_args
        self.xs = [B.to_numpy(base_args[i]) for i in wrt]
        self.out_names = lin.out_names
        self.f0 = lin.outputs
        self.rng = np.random.default_rng(opts["seed"] + 1000)
        self.eps = eps = B.eps(dt)
        self.rounding = TOLERANCES["gradient.numerical.rounding"].of(eps)  # per unit of sum|u||f| / h
        self.richardson = TOLERANCES["gradient.numerical.richardson"]
        self.input_dts = [B.dtype_name(base_args[i]) for i in wrt]

        # the unmoved inputs as the op gets them (contiguous, values xs), built once; forward64 feeds fn copies
        self.held = list(base_args)
        for i, v in zip(wrt, self.xs):
            self.held[i] = B.with_values(base_args[i], v)

        # In low precision the step must grow (rounding noise ~ eps/h); Richardson bounds the truncation.
        self.rel_step = difference_step(self.low, eps)
        self.rtol = difference_rtol(opts["rtol"], self.low, eps)
        self.round_terms = [num.absdot(u, self.f0) for u in U]
        self.rt = np.array(self.round_terms)
        self.cot = num.Cotangents(U)  # every cotangent's dot products at once (the same numbers as num.dot per k)
        self.f0_finite = all(np.all(np.isfinite(o)) for o in self.f0)  # a domain edge needs a finite value at x itself

    def forward(self, k: int, value) -> list[np.ndarray]:
        """fn's outputs with input ``wrt[k]`` set to ``value`` and every other input as held."""
        new = list(self.held)
        new[self.wrt[k]] = self.B.with_values(self.base_args[self.wrt[k]], value)
        return self.B.forward64(self.fn, new, self.kwargs, self.out_names)

    def moved(self, i: int, w):
        """The step each element really takes once rounded to the input's dtype, and fn's outputs at the inputs
        moved forward and back by it."""
        x = self.xs[i]
        wp = self.B.round_to(x + w, self.input_dts[i]) - x
        wm = x - self.B.round_to(x - w, self.input_dts[i])
        return (wp + wm) / 2.0, self.forward(i, x + wp), self.forward(i, x - wm)

    def column(self, i: int, w, j: int, h: float):
        w_eff, fp, fm = self.moved(i, w)
        step = float(w_eff.reshape(-1)[j]) or h
        with np.errstate(invalid="ignore", over="ignore"):
            return [(a - b) / (2.0 * step) for a, b in zip(fp, fm)], step

    def along(self, i: int, w, h: float):
        w_eff, fp, fm = self.moved(i, w)
        with np.errstate(invalid="ignore", over="ignore"):
            return [(a - b) / (2.0 * h) for a, b in zip(fp, fm)], w_eff.reshape(-1) / h  # gradient units

    def _finite(self, values) -> bool:
        return all(np.all(np.isfinite(c)) for c in values)

    def directions(self, i: int, G: np.ndarray, h: float, padding) -> tuple[num.Mismatch, list[int]]:
        """The op's gradients ``G`` (K, n) along ``probes`` random directions against finite differences, and the
        probes whose steps left fn's domain."""
        x = self.xs[i]
        domain_edge: list[int] = []
        exp_s: list[float] = []
        got_s: list[float] = []
        allow_s: list[float] = []
        for _ in range(self.probes):
            direction = self.rng.standard_normal(x.shape)
            if padding:  # NOTE [padding_idx convention]: the padding row is not differentiated through
                direction[padding] = 0.0
            jw, d = self.along(i, h * direction, h)
            if self.f0_finite and not self._finite(jw):
                domain_edge.append(len(exp_s))
                continue
            jw2, d2 = self.along(i, h / 2.0 * direction, h) if self.low else (None, None)
            if self.cot.fits(jw) and (not self.low or self.cot.fits(jw2)):
                e, g, al = self._direction_stacked(G, h, jw, d, jw2, d2)
                exp_s += e.tolist()
                got_s += g.tolist()
                allow_s += al.tolist()
                continue
            self._direction_each(G, h, jw, d, jw2, d2, exp_s, got_s, allow_s)
        m = num.compare(np.array(got_s), np.array(exp_s), np.array(allow_s) + TOLERANCES["tiny"])
        return m, domain_edge

    def unsettled(self, i: int, h: float) -> bool:
        """Whether the central differences of input ``wrt[i]`` change, when the step halves, by more than the
        tolerance they are judged with: fn varies faster than the step resolves (``sin`` of arguments ~1e6), so
        they cannot be the arbiter there (NOTE [Finite differences that do not settle])."""
        x = self.xs[i]
        for _ in range(self.probes):
            direction = self.rng.standard_normal(x.shape)
            jw, _d = self.along(i, h * direction, h)
            jw2, _d2 = self.along(i, h / 2.0 * direction, h)  # u.J(d/2): twice it is comparable with u.J d
            if not (self._finite(jw) and self._finite(jw2) and self.cot.fits(jw) and self.cot.fits(jw2)):
                return False  # a domain edge or broadcast outputs: no verdict of this kind
            e, e2 = self.cot.dot(jw), 2.0 * self.cot.dot(jw2)
            allowed = 3.0 * self.rounding * self.rt / h + self.rtol * (np.abs(e) + np.abs(e2)) + TOLERANCES["tiny"]
            if np.any(np.abs(e - e2) > allowed):
                return True
        return False

    def _direction_stacked(self, G, h, jw, d, jw2, d2):
        cot, rtol = self.cot, self.rtol
        e, g = cot.dot(jw), np.sum(G * d, axis=1)
        al = self.rounding * self.rt / h + rtol * (cot.absdot(jw) + np.sum(np.abs(G) * np.abs(d), axis=1))
        if self.low:  # Richardson: compare with half the step, both against the analytic side
            al += self.richardson * np.abs((e - g) - 2.0 * (cot.dot(jw2) - np.sum(G * d2, axis=1)))
        return e, g, al

    def _direction_each(self, G, h, jw, d, jw2, d2, exp_s, got_s, allow_s) -> None:
        """One cotangent at a time (outputs of another size than the cotangents: broadcasting)."""
        for k, u in enumerate(self.U):
            exp_s.append(num.dot(u, jw))
            got_s.append(float(np.sum(G[k] * d)))
            allow_s.append(self.rounding * self.round_terms[k] / h + self.rtol * (num.absdot(u, jw) + num.absdot([G[k]], [d])))
            if self.low:
                allow_s[-1] += self.richardson * abs((exp_s[-1] - got_s[-1]) - 2.0 * (num.dot(u, jw2) - float(np.sum(G[k] * d2))))

    def jacobian(self, i: int, G: np.ndarray, h: float) -> tuple[num.Mismatch, list[int], Any, Any]:
        """The op's gradients ``G`` (K, n) against the full finite-difference Jacobian's (2n forward calls): the
        comparison, the columns whose steps left fn's domain (excluded), and the expected and allowed values."""
        x = self.xs[i]
        n = G.shape[1]
        domain_edge = []
        got = G
        expected = np.zeros_like(G)
        allowed = np.zeros_like(G)
        for j in range(n):
            w = np.zeros(n)
            w[j] = h
            w = w.reshape(x.shape)
            col, step = self.column(i, w, j, h)
            col2 = self.column(i, w / 2.0, j, h)[0] if self.low else None
            if self.cot.fits(col) and (not self.low or self.cot.fits(col2)):
                expected[:, j] = e = self.cot.dot(col)
                allowed[:, j] = self.rounding * self.rt / step + self.rtol * (self.cot.absdot(col) + np.abs(G[:, j]))
                if self.low:  # Richardson: two steps disagreeing bound the finite difference's own error
                    allowed[:, j] += self.richardson * np.abs(e - self.cot.dot(col2))
            else:  # outputs of another size than the cotangents: one k at a time, broadcasting
                self._column_each(G, j, col, col2, step, expected, allowed)
            if self.f0_finite and not self._finite(col) and not np.isfinite(expected[:, j]).all():
                domain_edge.append(j)
        mask = np.zeros_like(G, dtype=bool)
        mask[:, domain_edge] = True
        allowed = np.where(mask, 1.0, allowed)
        m = num.compare(np.where(mask, 0.0, got), np.where(mask, 0.0, expected), allowed + TOLERANCES["tiny"])
        return m, domain_edge, expected, allowed

    def _column_each(self, G, j, col, col2, step, expected, allowed) -> None:
        for k, u in enumerate(self.U):
            expected[k, j] = num.dot(u, col)
            allowed[k, j] = self.rounding * self.round_terms[k] / step + self.rtol * (num.absdot(u, col) + abs(G[k, j]))
            if self.low:
                allowed[k, j] += self.richardson * abs(expected[k, j] - num.dot(u, col2))
