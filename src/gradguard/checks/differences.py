"""The finite differences behind ``gradient.numerical`` (``gradient_numerical.NumericalCheck``): one regime's run, one input at a time.

The comparisons they feed, and the tolerances, are NOTE [Directional probes] and NOTE [Tolerances] in
``tolerances``; the step in low precision is NOTE [Effective precision] in ``audit``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import numerical as num
from .tolerances import TOLERANCES, difference_rtol, difference_step

__all__ = ["Differences"]


class Differences:
    """fn's central differences around the inputs ``base_args`` of one run (float64, or the op's dtype ``dt``)."""

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
        """The step each element really takes once rounded to the input's dtype, and the inputs moved by it."""
        x = self.xs[i]
        wp = self.B.round_to(x + w, self.input_dts[i]) - x
        wm = x - self.B.round_to(x - w, self.input_dts[i])
        return (wp + wm) / 2.0, x + wp, x - wm

    def column(self, i: int, w, j: int, h: float):
        w_eff, xp, xm = self.moved(i, w)
        step = float(w_eff.reshape(-1)[j]) or h
        fp = self.forward(i, xp)
        fm = self.forward(i, xm)
        with np.errstate(invalid="ignore", over="ignore"):
            return [(a - b) / (2.0 * step) for a, b in zip(fp, fm)], step

    def along(self, i: int, w, h: float):
        w_eff, xp, xm = self.moved(i, w)
        fp = self.forward(i, xp)
        fm = self.forward(i, xm)
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
        they cannot be the arbiter there (NOTE [Finite differences that do not settle] in ``gradient_numerical``)."""
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
