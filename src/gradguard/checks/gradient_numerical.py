"""One regime's gradient checks, as NOTE [What is compared with what] in ``audit`` lists them: ``gradient.numerical``
(NOTE [Directional probes] in ``runs``) or ``gradient.surrogate``, ``forward.reference`` and ``gradient.reference`` (at
a kink another valid subgradient passes: NOTE [Kink conventions]), ``gradient.precision`` and ``gradient.nonfinite``,
``gradient.cotangent_linearity`` and ``gradient.zero_cotangent``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import InvalidArgument
from .adapter_base import OpRaised
from .report import CheckResult, Failure
from .runs import (Check, Cotangents, Mismatch, OpRuns, Run, Subject, Suite, absdot, compare, dot,
                   reference_pairs, reorder, scale, step_size)
from .tolerances import TOLERANCES, difference_rtol, difference_step, written

__all__ = ["NumericalCheck", "SurrogateCheck", "Differences", "ForwardReference", "GradientReference",
           "PrecisionCheck", "LinearityCheck"]

@dataclass(eq=False)
class NumericalCheck(Check):
    """``gradient.numerical`` (or ``gradient.surrogate``) for one regime's suite, or why it is skipped."""

    runs: OpRuns  # the op's float64 run, when deferred, is made here (NOTE [Finite differences as arbiter])

    def compare(self, s: Suite, against_ref: list[Failure]) -> None:
        """``gradient.numerical``: see NOTE [Directional probes] and NOTE [Effective precision]."""
        op, run, regime = self.op, s.run, s.regime
        dt = run.eff if run.lin_64 is not None or s.deferred else op.dtype(0)
        if op.opts["surrogate"] is not None:
            SurrogateCheck(op).compare(s)
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
        G_all = run.g_64 if use64 else run.g_d  # every input is judged (a list: ``all`` would stop at the first)
        s.record("gradient.numerical", all([self._input(fd, i, G_all, run, regime, s.fail, s.g_r64, dt)
                                            for i in range(len(fd.xs))]))

    def _input(self, fd: Differences, i: int, G_all, run: Run, regime, fail, g_r64, dt: str) -> bool:
        """``gradient.numerical`` for input ``wrt[i]``: whether it passes (failing, it adds the failure)."""
        opts = self.op.opts
        x = fd.xs[i]
        h = step_size(x, fd.rel_step)
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
        if not m.ok and full and padding:
            m = self._without_padding_row(x, G, expected, allowed, name, run, padding)
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

    def _failure(self, fd: Differences, i: int, m: Mismatch, full: bool, mode: str, dt: str, fail) -> None:
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

    def _without_padding_row(self, x, G, expected, allowed, name: str, run: Run, rows: tuple[int, ...]) -> Mismatch:
        # NOTE [padding_idx convention]: the padding row's gradient is zero by definition, although the
        # forward reads it; without a reference, exclude that row from the finite-difference comparison.
        rowmask = np.zeros(x.shape, dtype=bool)
        rowmask[rows] = True
        rowmask = np.broadcast_to(rowmask.reshape(1, -1), G.shape)
        m = compare(np.where(rowmask, expected, G), expected, allowed + TOLERANCES["tiny"])
        run.notes.append(f"row {rows[0]} of {name} (padding_idx) is excluded from the finite-difference check")
        return m

    def _reference_agrees_with_differences(self, i: int, G, g_r64, fd: Differences, run: Run, dt: str) -> bool:
        """Whether the reference's float64 gradient is the op's: finite differences disagree with both."""
        R = np.stack([g[i] for g in g_r64]).reshape(G.shape[0], -1)
        rel = TOLERANCES["reference.vs_differences"].at(dt, fd.eps)
        return compare(G, R, rel * scale(R) + self.op.floor(i, run, dt)).ok

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

    def compare(self, s: Suite) -> None:
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
            m = compare(got, truth, rel * scale(truth) + op.floor(i, run, dt))
            if not m.ok:
                ok = False
                self.fail_input(s, "gradient.surrogate", i, m, ("backward", "surrogate"),
                                message=f"backward of {op.names[op.wrt[i]]} differs from the declared surrogate's "
                                        f"gradient",
                                tolerance=f"{rel:g} x max|surrogate gradient| ({dt})",
                                why="the backward does not compute the surrogate gradient it is declared to use.",
                                fix="compare the backward with the surrogate's formula; the worst element is shown "
                                    "above.")
        s.record("gradient.surrogate", ok)


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
        self.rt = np.array([absdot(u, self.f0) for u in U])
        self.cot = Cotangents(U)  # every cotangent's dot products at once (the same numbers as dot per k)
        self.f0_finite = all(np.all(np.isfinite(o)) for o in self.f0)  # a domain edge needs a finite value at x itself

    def forward(self, k: int, value) -> list[np.ndarray]:
        """fn's outputs with input ``wrt[k]`` set to ``value`` and every other input as held."""
        new = list(self.held)
        new[self.wrt[k]] = self.B.with_values(self.base_args[self.wrt[k]], value)
        return self.B.forward64(self.fn, new, self.kwargs, self.out_names)

    def moved(self, i: int, w):
        """The step each element takes once rounded to the input's dtype, and fn's outputs moved forward and back."""
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

    def _dots(self, vs, absolute: bool = False) -> np.ndarray:
        """``<u_k, vs>`` (``<|u_k|, |vs|>``) for every cotangent k; one k at a time for outputs of another size than
        the cotangents (broadcasting), the same numbers either way (``Cotangents``)."""
        if self.cot.fits(vs):
            return self.cot.dot(vs, absolute)
        return np.array([(absdot if absolute else dot)(u, vs) for u in self.U])

    def directions(self, i: int, G: np.ndarray, h: float, padding) -> tuple[Mismatch, list[int]]:
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
            e, g = self._dots(jw), np.sum(G * d, axis=1)
            al = self.rounding * self.rt / h + self.rtol * (self._dots(jw, True) + np.sum(np.abs(G) * np.abs(d), axis=1))
            if self.low:  # Richardson: compare with half the step, both against the analytic side
                jw2, d2 = self.along(i, h / 2.0 * direction, h)
                al += self.richardson * np.abs((e - g) - 2.0 * (self._dots(jw2) - np.sum(G * d2, axis=1)))
            exp_s += e.tolist()
            got_s += g.tolist()
            allow_s += al.tolist()
        m = compare(np.array(got_s), np.array(exp_s), np.array(allow_s) + TOLERANCES["tiny"])
        return m, domain_edge

    def unsettled(self, i: int, h: float) -> bool:
        """Whether the central differences of input ``wrt[i]`` change, when the step halves, by more than the
        tolerance they are judged with (NOTE [Finite differences that do not settle])."""
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

    def jacobian(self, i: int, G: np.ndarray, h: float) -> tuple[Mismatch, list[int], Any, Any]:
        """The op's gradients ``G`` (K, n) against the full finite-difference Jacobian's (2n forward calls): the
        comparison, the columns whose steps left fn's domain (excluded), and the expected and allowed values."""
        x = self.xs[i]
        n = G.shape[1]
        domain_edge = []
        expected = np.zeros_like(G)
        allowed = np.zeros_like(G)
        for j in range(n):
            w = np.zeros(n)
            w[j] = h
            w = w.reshape(x.shape)
            col, step = self.column(i, w, j, h)
            expected[:, j] = e = self._dots(col)
            allowed[:, j] = self.rounding * self.rt / step + self.rtol * (self._dots(col, True) + np.abs(G[:, j]))
            if self.low:  # Richardson: two steps disagreeing bound the finite difference's own error
                allowed[:, j] += self.richardson * np.abs(e - self._dots(self.column(i, w / 2.0, j, h)[0]))
            if self.f0_finite and not self._finite(col) and not np.isfinite(expected[:, j]).all():
                domain_edge.append(j)
        mask = np.zeros_like(G, dtype=bool)
        mask[:, domain_edge] = True
        allowed = np.where(mask, 1.0, allowed)
        m = compare(np.where(mask, 0.0, G), np.where(mask, 0.0, expected), allowed + TOLERANCES["tiny"])
        return m, domain_edge, expected, allowed


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

    def compare(self, s: Suite) -> None:
        lin_d, lin_rd, lin_r64 = s.run.lin_d, s.lin_rd, s.lin_r64
        ok = True
        for k, o in enumerate(s.shared):
            name = lin_d.out_names[o]
            dt = s.run.precision_of(lin_d.out_dtypes[o])
            truth = lin_r64.outputs[k] if lin_r64 is not None else lin_rd.outputs[k]
            allowed, rule = _derived_tol(self.op, lin_d.outputs[o], lin_rd.outputs[k], truth, dt, lin_r64 is not None, 0.0)
            m = compare(lin_d.outputs[o], truth, allowed)
            if not m.ok:
                ok = False
                idx = ", ".join(map(str, m.index or ()))
                s.fail("forward.reference", input=name, message=f"{name} differs from the reference's",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                          where=f"{name}[{idx}]: op {m.got:.6g}, reference {m.expected:.6g}",
                          why="the forward computes a different function than the reference; gradient checks "
                          "against finite differences of the op itself cannot see this.",
                          fix="fix the forward first; then re-run check_op.")
        s.record("forward.reference", ok)


@dataclass(eq=False)
class GradientReference(Check):
    """``gradient.reference``: the op's VJPs against the reference's; at kinks another valid subgradient passes."""

    runs: OpRuns  # the op's float64 run, when deferred, is made here (NOTE [Finite differences as arbiter])

    def compare(self, s: Suite) -> tuple[list[CheckResult], list[Failure]]:
        """``gradient.reference``, taken out of the run's checks and failures (to be listed after gradient.numerical)."""
        run = s.run
        marks = len(run.checks), len(run.failures)
        if self.op.reference is not None:  # every input is judged (a list: ``all`` would stop at the first)
            s.record("gradient.reference", all([self._input(s, i) for i in range(len(self.op.wrt))]))
        against_ref = run.checks[marks[0]:], run.failures[marks[1]:]
        del run.checks[marks[0]:], run.failures[marks[1]:]
        return against_ref

    def _input(self, s: Suite, i: int) -> bool:
        op, run = self.op, s.run
        dt = run.precision_of(op.dtype(i))
        got = np.stack([g[i] for g in s.g_cmp])
        ref_d = np.stack([g[i] for g in s.g_rd])
        truth = np.stack([g[i] for g in s.g_r64]) if s.g_r64 is not None else ref_d
        allowed, rule = _derived_tol(op, got, ref_d, truth, dt, s.g_r64 is not None, op.floor(i, run, dt))
        m = compare(got, truth, allowed)
        if m.ok and run.g_64 is not None and s.g_r64 is not None and not s.all64 and run.eff == "float64" \
                and s.g_cmp is run.g_d:
            got64 = np.stack([g[i] for g in run.g_64])
            magnitude = scale(truth)
            rel64 = TOLERANCES["reference.float64_op"]
            m2 = compare(got64, truth, rel64 * magnitude + op.floor(i, run, "float64"))
            if not m2.ok:
                m, rule = m2, f"{rel64:g} x max|reference| (float64 op vs float64 reference)"
        if m.ok:
            return True
        # a padding row's zero gradient is a convention, not a kink: only the kinks regime has subgradients
        if s.regime == "kinks" and self._kink_subgradient(s, i, got, truth, allowed):
            return True
        self.fail_input(s, "gradient.reference", i, m, ("op", "reference"),
                        message=f"gradient of {op.names[op.wrt[i]]} differs from the reference's", tolerance=rule,
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
            sides.append(np.array([sign * dot(u, [a - b for a, b in zip(f, f0)]) / h for u in run.U]))
        lo, hi = np.minimum(*sides), np.maximum(*sides)
        slack = tol[:, j] + TOLERANCES["kink.slack"] * (np.abs(lo) + np.abs(hi))
        if not (np.all(np.isfinite(lo)) and np.all(g[:, j] >= lo - slack) and np.all(g[:, j] <= hi + slack)):
            return False
    return True


_LINEARITY_ALPHA = 2.5


class PrecisionCheck(Check):
    """No reference: the op's dtype run against its float64 run (``gradient.precision``; at kinks ``nonfinite``)."""

    def compare(self, s: Suite, nonfinite: bool = False) -> None:
        op, run = self.op, s.run
        ok = True
        for i in range(len(op.wrt)):
            dt, name = op.dtype(i), op.names[op.wrt[i]]
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            if nonfinite:
                bad = ~np.isfinite(got) & np.isfinite(truth)
                if bad.any():
                    ok = False
                    s.fail("gradient.nonfinite", input=name,
                              message=f"gradient of {name} is not finite ({int(bad.sum())} elements)",
                              why="a value at a kink or boundary makes the backward divide by zero or take log(0).",
                              fix="guard the special value in backward (torch.where) the way the forward does.")
                continue
            rel = TOLERANCES["gradient.precision"].get(dt, TOLERANCES["gradient.precision.other"])
            m = compare(got, truth, rel * scale(truth) + op.floor(i, run, dt))
            if not m.ok:
                ok = False
                self.fail_input(s, "gradient.precision", i, m, (dt, "float64"),
                                message=f"gradient of {name} in {dt} is far from the op's own float64 gradient",
                                tolerance=f"{rel:g} x max|float64 gradient|",
                                why="overflow, cancellation or a missing upcast in low precision (the float64 run is "
                                "correct or was checked against finite differences).",
                                fix=f"accumulate in float32 (or subtract the row max / use a stable formula); pass "
                                f"reference= to judge {dt} error against a trusted implementation instead of a fixed "
                                f"tolerance.")
        s.record("gradient.nonfinite" if nonfinite else "gradient.precision", ok)


class LinearityCheck(Check):
    """The backward's linearity in the cotangent, on two fresh graphs (NOTE [One backward per graph])."""

    def compare(self, s: Suite) -> None:
        op, run, fail = self.op, s.run, s.fail
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
            m = compare(g_a[i], expected, tol * magnitude + floor)
            coarse = dt == "float64" and not m.ok and \
                compare(g_a[i], expected, linear.at("float32", op.B.eps("float32")) * magnitude + floor).ok
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
            mz = compare(gz, np.zeros_like(gz), 0.0)
            if not mz.ok:
                ok_zero = False
                fail("gradient.zero_cotangent", input=name,
                     message=f"a zero upstream gradient gives a non-zero gradient for {name}",
                     max_abs_err=mz.max_abs, where=op.where(i, mz, "g(0)", "expected"),
                     why="backward adds something that does not depend on grad_output.",
                     fix="every term of the gradient must be multiplied by grad_output.")
        s.record("gradient.cotangent_linearity", ok_lin)
        s.record("gradient.zero_cotangent", ok_zero)
        if not ok_precise:
            s.record("gradient.precision", False)
