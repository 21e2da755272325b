"""``check_op``: the op audit. Orchestrates gradient, regime, mutation, aliasing and composition checks.

# NOTE [What is compared with what]
# For the inputs of each regime the op runs in its own dtype and (when it accepts float64) in float64;
# the reference, when given, runs the same two ways. With cotangents U (random, non-unit, rounded to the
# output dtype so every run sees identical values):
#   gradient.numerical   op float64 VJP vs float64 central differences (see _numerical)
#   gradient.reference   op VJP in its dtype vs reference float64 VJP; allowed error = factor x the
#                        reference's own dtype error against its float64 VJP + a few ulps
#   forward.reference    the same for outputs (catches ops wrong in forward and backward consistently)
#   gradient.precision   no reference: op dtype VJP vs op float64 VJP within a dtype tolerance
#   gradient.cotangent_linearity / gradient.zero_cotangent: g(a*u) = a*g(u), g(0) = 0
# Failures in regimes other than "given" are named ``regime.<name>`` and say which comparison failed.
# When finite differences disagree with both the op and the reference, the reference's convention wins
# (a kink, a padding row): reported as a note, not a failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._errors import InvalidArgument
from . import _numerical as num
from ._composition import audit_composition
from ._mutation import audit_mutation
from ._regimes import REGIME_NAMES, Regime, Spec, build_regimes, shrink_candidates
from ._report import CheckResult, Failure, OpReport

__all__ = ["run_check_op", "CHECK_GROUPS", "DEFAULT_OPTIONS"]

CHECK_GROUPS = ("gradient", "regime", "mutation", "aliasing", "composition")
DEFAULT_OPTIONS: dict[str, Any] = {
    "kwargs": None,  # keyword arguments passed to fn and reference
    "wrt": None,  # positions of the inputs to differentiate (default: see NOTE [Which inputs])
    "checks": CHECK_GROUPS,
    "regimes": REGIME_NAMES,
    "seed": 0,
    "probes": 3,  # random cotangents, and random tangents per input
    "full_jacobian_max": 32,  # inputs with at most this many elements get the full Jacobian
    "rtol": 1e-4,  # finite-difference comparison, relative to the magnitude of the terms
    "reference_factor": 5.0,  # the op may be this many times less accurate than the reference
    "shrink": True,  # look for a smaller reproducing input for failures
    "name": None,  # name shown in the report
}
# NOTE [Which inputs]
# Floating-point tensor inputs are differentiated. If some of them have requires_grad=True, only those
# are (so an input can be excluded by passing it with requires_grad=False next to ones with True);
# ``wrt=`` overrides both.
_PRECISION_REL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1, "complex64": 1e-4}
_FLOOR_ULPS = 8.0
_LINEARITY_ALPHA = 2.5


class _Skip(Exception):
    pass


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


@dataclass
class _Run:
    """Everything one regime's gradient suite computed."""

    lin_d: Any
    U: list[list[np.ndarray]]
    g_d: list[list[np.ndarray]]
    lin_64: Any = None
    g_64: list | None = None
    failures: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Audit:
    def __init__(self, B, fn, args, reference, opts):
        self.B = B
        self.fn = fn
        self.reference = reference
        self.opts = opts
        self.kwargs = dict(opts["kwargs"] or {})
        self.args = list(args)
        self.names = B.parameter_names(fn, len(args))
        self.defaults = B.signature_defaults(fn)
        self.wrt = self._choose_wrt()
        self.findings: list[Failure] = []
        self.checks: list[CheckResult] = []
        self.notes: list[str] = []

    # ---- validation --------------------------------------------------------------------------------
    def _choose_wrt(self) -> list[int]:
        B, args = self.B, self.args
        floats = [i for i, a in enumerate(args) if B.kind(a) == "float"]
        if not floats:
            got = ", ".join(f"{n}: {B.describe(a)}" for n, a in zip(self.names, args))
            raise InvalidArgument(
                f"check_op: inputs has no floating-point tensor (got {got}), so there is no gradient to check. "
                f"Pass at least one floating-point tensor input (for example x.float())."
            )
        wrt = self.opts["wrt"]
        if wrt is None:
            marked = [i for i in floats if B.requires_grad(args[i])]
            return marked or floats
        if isinstance(wrt, int):
            wrt = [wrt]
        try:
            wrt = [int(i) for i in wrt]
        except TypeError:
            raise InvalidArgument(f"check_op: wrt must be an int or a sequence of input positions; got {_type_name(wrt)}.") from None
        for i in wrt:
            if not 0 <= i < len(args) or i not in floats:
                raise InvalidArgument(
                    f"check_op: wrt contains {i}, which is not the position of a floating-point input; "
                    f"floating-point inputs are at {floats}."
                )
        return wrt

    def _check_outputs(self, lin, who: str):
        if lin.out_tensors:
            return
        got = ", ".join(f"{n}: {self.B.describe(o)}{'' if self.B.requires_grad(o) else ' (does not require grad)'}" for n, o in lin.all_outputs) or "no tensor"
        raise InvalidArgument(
            f"check_op: {who} returned no differentiable tensor output (got {got}). check_op audits gradients, so "
            f"{who} must return at least one floating-point tensor computed from its inputs with autograd on; "
            f"did it detach its result or run under torch.no_grad()?"
        )

    def _check_reference_outputs(self, lin, lin_r):
        ours = {n: self.B.shape(o) for n, o in zip(lin.out_names, lin.out_tensors)}
        theirs = {n: self.B.shape(o) for n, o in zip(lin_r.out_names, lin_r.out_tensors)}
        if set(ours) != set(theirs):
            raise InvalidArgument(
                f"check_op: reference returned differentiable outputs {sorted(theirs)} but fn returned {sorted(ours)}; "
                f"the reference must compute the same function as fn (same outputs, same shapes)."
            )
        for n in ours:
            if tuple(ours[n]) != tuple(theirs[n]):
                raise InvalidArgument(
                    f"check_op: reference returned {n} with shape {list(theirs[n])} but fn returned shape "
                    f"{list(ours[n])}; the reference must compute the same function as fn (same outputs, same shapes)."
                )

    # ---- helpers -----------------------------------------------------------------------------------
    def _cotangents(self, lin, rng) -> list[list[np.ndarray]]:
        U = []
        for _ in range(self.opts["probes"]):
            us = []
            for out, dt in zip(lin.outputs, lin.out_dtypes):
                u = rng.standard_normal(out.shape)
                u = np.where(np.abs(np.abs(u) - 1.0) < 0.25, u * 1.7, u)  # keep away from +-1 (NOTE [Directional probes])
                us.append(self.B.round_to(np.asarray(u), dt) if dt in _PRECISION_REL or dt == "float64" else u)
            U.append(us)
        return U

    def _vjps(self, fn, args, U, first, out_names=None) -> list[list[np.ndarray]]:
        """One VJP per cotangent, each on its own forward pass.

        # NOTE [One backward per graph]
        # A backward that mutates what it saved (Liger's cross entropy scales its saved gradient in place)
        # is only right the first time. That is reported once, by mutation.backward_not_repeatable; the
        # gradient checks must not be polluted by it, so every cotangent gets a fresh graph.
        """
        out = [first.pullback(U[0])]
        for u in U[1:]:
            lin = self.B.linearize(fn, args, self.kwargs, self.wrt)
            if out_names is not None:
                lin.out_tensors = [lin.out_tensors[lin.out_names.index(n)] for n in out_names]
            out.append(lin.pullback(u))
        return out

    def _to64(self, args):
        return [self.B.to_float64(a) if self.B.is_tensor(a) and self.B.kind(a) == "float" else a for a in args]

    def _linearize64(self, fn, args, who, run_notes):
        try:
            lin = self.B.linearize(fn, self._to64(args), self.kwargs, self.wrt)
        except Exception as exc:
            run_notes.append(f"{who} failed on float64 inputs ({type(exc).__name__}: {str(exc)[:120]}); float64 checks skipped")
            return None
        if any(dt != "float64" for dt in lin.out_dtypes):
            run_notes.append(f"{who} returned {', '.join(sorted(set(lin.out_dtypes)))} outputs for float64 inputs; float64 checks skipped")
            return None
        return lin

    def _where(self, i, m: num.Mismatch, got_label, exp_label) -> str:
        idx = ", ".join(map(str, m.index or ()))
        return f"{self.names[self.wrt[i]]}[{idx}]: {got_label} {m.got:.6g}, {exp_label} {m.expected:.6g}"

    def _dtype(self, i) -> str:
        return self.B.dtype_name(self.args[self.wrt[i]])

    # ---- the gradient suite ------------------------------------------------------------------------
    def gradient_suite(self, args, regime: str, spec: Spec, linearity: bool, seed_offset: int) -> _Run:
        B, fn, ref = self.B, self.fn, self.reference
        rng = np.random.default_rng(self.opts["seed"] + seed_offset)
        lin_d = B.linearize(fn, args, self.kwargs, self.wrt)
        self._check_outputs(lin_d, "fn")
        U = self._cotangents(lin_d, rng)
        g_d = self._vjps(fn, args, U, lin_d)
        run = _Run(lin_d=lin_d, U=U, g_d=g_d)
        all64 = all(dt == "float64" for dt in lin_d.out_dtypes) and all(self._dtype(i) == "float64" for i in range(len(self.wrt)))
        if all64:
            run.lin_64, run.g_64 = lin_d, g_d
        else:
            run.lin_64 = self._linearize64(fn, args, "fn", run.notes)
            run.g_64 = self._vjps(fn, self._to64(args), U, run.lin_64) if run.lin_64 else None

        lin_rd = lin_r64 = g_rd = g_r64 = None
        if ref is not None:
            lin_rd = B.linearize(ref, args, self.kwargs, self.wrt)
            self._check_outputs(lin_rd, "reference")
            self._check_reference_outputs(lin_d, lin_rd)
            order = [lin_rd.out_names.index(n) for n in lin_d.out_names]
            lin_rd.out_tensors = [lin_rd.out_tensors[j] for j in order]
            lin_rd.outputs = [lin_rd.outputs[j] for j in order]
            lin_rd.out_names = list(lin_d.out_names)
            g_rd = self._vjps(ref, args, U, lin_rd, lin_d.out_names)
            if all64:
                lin_r64, g_r64 = lin_rd, g_rd
            else:
                lin_r64 = self._linearize64(ref, args, "reference", run.notes)
                if lin_r64 is not None:
                    order = [lin_r64.out_names.index(n) for n in lin_d.out_names]
                    lin_r64.out_tensors = [lin_r64.out_tensors[j] for j in order]
                    lin_r64.outputs = [lin_r64.outputs[j] for j in order]
                    g_r64 = self._vjps(ref, self._to64(args), U, lin_r64, lin_d.out_names)

        def fail(check, **kw):
            run.failures.append(Failure(check=check, regime=regime, **kw))

        def record(check, ok, detail=""):
            run.checks.append(CheckResult(check, regime, "pass" if ok else "fail", detail))

        # forward.reference
        if ref is not None:
            ok = True
            for o, name in enumerate(lin_d.out_names):
                dt = lin_d.out_dtypes[o]
                truth = lin_r64.outputs[o] if lin_r64 is not None else lin_rd.outputs[o]
                allowed, rule = self._derived_tol(lin_d.outputs[o], lin_rd.outputs[o], truth, dt, lin_r64 is not None)
                m = num.compare(lin_d.outputs[o], truth, allowed)
                if not m.ok:
                    ok = False
                    idx = ", ".join(map(str, m.index or ()))
                    fail("forward.reference", input=name, message=f"{name} differs from the reference's",
                         max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                         where=f"{name}[{idx}]: op {m.got:.6g}, reference {m.expected:.6g}",
                         why="the forward computes a different function than the reference; gradient checks "
                         "against finite differences of the op itself cannot see this.",
                         fix="fix the forward first; then re-run check_op.")
            record("forward.reference", ok)

        # gradient.numerical
        if spec.numerical and run.lin_64 is not None:
            self._numerical(args, run, regime, fail, record, g_r64)
        elif not spec.numerical:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "finite differences not meaningful here"))
        else:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "fn does not run in float64"))

        # gradient.reference
        if ref is not None:
            ok = True
            for i in range(len(self.wrt)):
                dt = self._dtype(i)
                got = np.stack([g[i] for g in g_d])
                ref_d = np.stack([g[i] for g in g_rd])
                truth = np.stack([g[i] for g in g_r64]) if g_r64 is not None else ref_d
                allowed, rule = self._derived_tol(got, ref_d, truth, dt, g_r64 is not None)
                m = num.compare(got, truth, allowed)
                if m.ok and run.g_64 is not None and g_r64 is not None and not all64:
                    got64 = np.stack([g[i] for g in run.g_64])
                    scale = _scale(truth)
                    m2 = num.compare(got64, truth, 1e-7 * scale)
                    if not m2.ok:
                        m, rule = m2, "1e-07 x max|reference| (float64 op vs float64 reference)"
                if not m.ok:
                    ok = False
                    m.index = m.index[1:] if m.index else m.index
                    name = self.names[self.wrt[i]]
                    fail("gradient.reference", input=name,
                         message=f"gradient of {name} differs from the reference's",
                         max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                         where=self._where(i, m, "op", "reference"),
                         why="the op's backward does not compute the reference's gradient (to the precision the "
                         "reference itself reaches in this dtype).",
                         fix="compare the backward formula with the reference's; the worst element is shown above.")
            record("gradient.reference", ok)
        elif spec.precision and run.g_64 is not None and not all64:
            ok = True
            for i in range(len(self.wrt)):
                dt = self._dtype(i)
                got = np.stack([g[i] for g in g_d])
                truth = np.stack([g[i] for g in run.g_64])
                rel = _PRECISION_REL.get(dt, 1e-4)
                m = num.compare(got, truth, rel * _scale(truth))
                if not m.ok:
                    ok = False
                    m.index = m.index[1:] if m.index else m.index
                    name = self.names[self.wrt[i]]
                    fail("gradient.precision", input=name,
                         message=f"gradient of {name} in {dt} is far from the op's own float64 gradient",
                         max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|float64 gradient|",
                         where=self._where(i, m, dt, "float64"),
                         why="overflow, cancellation or a missing upcast in low precision (the float64 run is "
                         "correct or was checked against finite differences).",
                         fix=f"accumulate in float32 (or subtract the row max / use a stable formula); pass reference= to "
                         f"judge {dt} error against a trusted implementation instead of a fixed tolerance.")
            record("gradient.precision", ok)
        elif spec.convention and run.g_64 is not None:
            ok = True
            for i in range(len(self.wrt)):
                got = np.stack([g[i] for g in g_d])
                truth = np.stack([g[i] for g in run.g_64])
                bad = ~np.isfinite(got) & np.isfinite(truth)
                if bad.any():
                    ok = False
                    name = self.names[self.wrt[i]]
                    fail("gradient.nonfinite", input=name, message=f"gradient of {name} is not finite ({int(bad.sum())} elements)",
                         why="a value at a kink or boundary makes the backward divide by zero or take log(0).",
                         fix="guard the special value in backward (torch.where) the way the forward does.")
            record("gradient.nonfinite", ok)

        if linearity:
            self._linearity(run, regime, fail, record)
        return run

    def _derived_tol(self, got, ref_d, truth, dt, have_truth):
        scale = _scale(truth)
        eps = self.B.eps(dt)
        if dt == "float64":
            return 1e-9 * scale, "1e-09 x max|reference| (float64)"
        if not have_truth:
            return 64 * eps * scale, f"64 ulp x max|reference| ({dt}; reference has no float64 run)"
        with np.errstate(invalid="ignore"):
            d = np.abs(ref_d - truth)
        ref_err = float(np.max(d[np.isfinite(d)], initial=0.0))
        factor = self.opts["reference_factor"]
        allowed = factor * ref_err + _FLOOR_ULPS * eps * scale
        return allowed, f"{factor:g} x reference's own {dt} error ({ref_err:.3g}) + {_FLOOR_ULPS:g} ulp x max|reference|"

    def _numerical(self, args, run: _Run, regime, fail, record, g_r64):
        B, opts = self.B, self.opts
        args64 = self._to64(args)
        xs = [B.to_numpy(args64[i]) for i in self.wrt]
        out_names = run.lin_64.out_names
        f0 = run.lin_64.outputs
        rng = np.random.default_rng(opts["seed"] + 1000)

        def forward(values):
            new = list(args64)
            for i, v in zip(self.wrt, values):
                new[i] = B.with_values(args64[i], v)
            return B.forward64(self.fn, new, self.kwargs, out_names)

        rtol = opts["rtol"]
        round_terms = [num.absdot(u, f0) for u in run.U]
        ok = True
        for i, x in enumerate(xs):
            h = num.step_size(x)
            name = self.names[self.wrt[i]]
            G = np.stack([g[i] for g in run.g_64])  # (K, *shape)
            if x.size <= opts["full_jacobian_max"]:
                expected = np.zeros_like(G)
                allowed = np.zeros_like(G)
                for j in range(x.size):
                    w = np.zeros(x.shape)
                    w.reshape(-1)[j] = h
                    col = [c / h for c in num.central_difference(forward, xs, i, w)]
                    for k, u in enumerate(run.U):
                        expected[k].reshape(-1)[j] = num.dot(u, col)
                        allowed[k].reshape(-1)[j] = 64 * num.EPS64 * round_terms[k] / h + rtol * (num.absdot(u, col) + abs(G[k].reshape(-1)[j]))
                m = num.compare(G, expected, allowed + 1e-300)
                mode = "full Jacobian"
            else:
                exp_s, got_s, allow_s = [], [], []
                for _ in range(opts["probes"]):
                    w = h * rng.standard_normal(x.shape)
                    jw = num.central_difference(forward, xs, i, w)
                    for k, u in enumerate(run.U):
                        exp_s.append(num.dot(u, jw))
                        got_s.append(float(np.sum(G[k] * w)))
                        allow_s.append(64 * num.EPS64 * round_terms[k] + rtol * (num.absdot(u, jw) + num.absdot([G[k]], [w])))
                m = num.compare(np.array(got_s), np.array(exp_s), np.array(allow_s) + 1e-300)
                if not m.ok:
                    m.max_rel = float(np.max(np.abs(np.array(got_s) - np.array(exp_s)) / (np.array(allow_s) / rtol + 1e-300)))
                mode = f"{opts['probes']} random tangents x {opts['probes']} cotangents"
            if not m.ok and g_r64 is None and x.ndim >= 1 and x.size <= opts["full_jacobian_max"]:
                rows = self._padding_rows(x)
                if rows:
                    # NOTE [padding_idx convention]: the padding row's gradient is zero by definition, although the
                    # forward reads it; without a reference, exclude that row from the finite-difference comparison.
                    mask = np.zeros(G.shape, dtype=bool)
                    mask[(slice(None), *rows)] = True
                    m = num.compare(np.where(mask, expected, G), expected, allowed + 1e-300)
                    run.notes.append(f"row {rows[0]} of {name} (padding_idx) is excluded from the finite-difference check")
            if m.ok:
                continue
            if g_r64 is not None:
                R = np.stack([g[i] for g in g_r64])
                if num.compare(G, R, 1e-7 * _scale(R)).ok:
                    run.notes.append(f"finite differences disagree with both the op and the reference for {name} "
                                     f"(a kink or a convention such as a padding row): judged by the reference's convention")
                    continue
            ok = False
            if x.size <= opts["full_jacobian_max"]:
                m.index = m.index[1:] if m.index else m.index
                where = self._where(i, m, "backward (float64)", "finite differences")
            else:
                where = f"<u, J w> along a random tangent of {name}: backward {m.got:.6g}, finite differences {m.expected:.6g}"
            fail("gradient.numerical", input=name,
                 message=f"backward of {name} disagrees with float64 central differences ({mode})",
                 max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                 tolerance=f"rounding + rtol {rtol:g} x magnitude of the terms",
                 where=where,
                 why="the hand-written backward does not compute the vector-Jacobian product of the forward "
                 "(checked in float64 with random non-unit upstream gradients).",
                 fix="re-derive the backward; the worst element is shown above.")
        record("gradient.numerical", ok)

    def _padding_rows(self, x) -> tuple[int, ...]:
        p = {**self.defaults, **self.kwargs}.get("padding_idx")
        if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < x.shape[0]:
            return (p,)
        return ()

    def _linearity(self, run: _Run, regime, fail, record):
        use64 = run.lin_64 is not None
        base = run.g_64 if use64 else run.g_d
        u0 = run.U[0]
        args = self._to64(self.args) if use64 else self.args
        fresh = lambda: self.B.linearize(self.fn, args, self.kwargs, self.wrt)  # NOTE [One backward per graph]
        g_a = fresh().pullback([_LINEARITY_ALPHA * u for u in u0])
        g_z = fresh().pullback([np.zeros_like(u) for u in u0])
        ok_lin = ok_zero = True
        for i in range(len(self.wrt)):
            name = self.names[self.wrt[i]]
            dt = "float64" if run.lin_64 is not None else self._dtype(i)
            expected = _LINEARITY_ALPHA * base[0][i]
            scale = _scale(expected)
            tol = 1e-9 if dt == "float64" else 16 * self.B.eps(dt)
            m = num.compare(g_a[i], expected, tol * scale)
            if not m.ok:
                ok_lin = False
                fail("gradient.cotangent_linearity", input=name,
                     message=f"gradient of {name} does not scale linearly with the upstream gradient",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{tol:g} x max|expected|",
                     where=self._where(i, m, f"g({_LINEARITY_ALPHA:g} u)", f"{_LINEARITY_ALPHA:g} g(u)"),
                     why="backward must be linear in grad_output; squaring it, ignoring it or adding a constant "
                     "passes gradcheck (which only uses upstream gradients of 0 and 1) but breaks every loss "
                     "scaling, mean reduction and chain rule.",
                     fix="multiply by grad_output exactly once, and do not use it elsewhere.")
            mz = num.compare(g_z[i], np.zeros_like(g_z[i]), 0.0)
            if not mz.ok:
                ok_zero = False
                fail("gradient.zero_cotangent", input=name,
                     message=f"a zero upstream gradient gives a non-zero gradient for {name}",
                     max_abs_err=mz.max_abs, where=self._where(i, mz, "g(0)", "expected"),
                     why="backward adds something that does not depend on grad_output.",
                     fix="every term of the gradient must be multiplied by grad_output.")
        record("gradient.cotangent_linearity", ok_lin)
        record("gradient.zero_cotangent", ok_zero)

    # ---- layout regimes ----------------------------------------------------------------------------
    def layout_check(self, regime: Regime, base: _Run) -> tuple[list[Failure], list[CheckResult]]:
        B = self.B
        lin = B.linearize(self.fn, regime.args, self.kwargs, self.wrt)
        found = []
        check = f"regime.{regime.name}"
        outs = {n: o for n, o in zip(lin.out_names, lin.outputs)}
        g = lin.pullback([base.U[0][j] for j in range(len(base.lin_d.out_names))]) if set(outs) == set(base.lin_d.out_names) else None
        pairs = [(n, outs.get(n), o, dt) for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes)]
        if g is not None:
            pairs += [(f"gradient of {self.names[self.wrt[i]]}", g[i], base.g_d[0][i], self._dtype(i)) for i in range(len(self.wrt))]
        for what, got, expected, dt in pairs:
            if got is None:
                continue
            eps = B.eps(dt)
            m = num.compare(got, expected, (16 * eps if dt != "float64" else 1e-12) * _scale(expected))
            if not m.ok:
                idx = ", ".join(map(str, m.index or ()))
                found.append(Failure(check=check, regime=regime.name, input=what.split()[-1] if what.startswith("gradient") else None,
                                     message=f"{what} changes when the inputs are laid out differently ({regime.description})",
                                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"16 ulp x max|value|",
                                     where=f"[{idx}]: {regime.name} {m.got:.6g}, as given {m.expected:.6g}",
                                     why="the kernel assumes a memory layout (contiguous rows, unit stride) instead of "
                                     "reading the strides.",
                                     fix="call .contiguous() on inputs before launching the kernel, or pass strides to it."))
        return found, [CheckResult(check, regime.name, "fail" if found else "pass")]

    # ---- minimal reproducer ------------------------------------------------------------------------
    def repro(self, args, regime: Regime | None) -> str:
        B = self.B
        lines = []
        for name, a in zip(self.names, args):
            if B.numel(a) <= 64:
                lines.append(f"{name} = {B.literal(a)}")
            else:
                v = B.to_numpy(a)
                lines.append(f"{name}: {B.describe(a)}, values in [{v.min():.4g}, {v.max():.4g}] "
                             f"(too large to print; the {regime.name if regime else 'given'} regime of your inputs, seed={self.opts['seed']})")
        if regime is not None and regime.spec.layout:
            lines.append(f"# then: {regime.description}")
        call = ", ".join(self.names)
        kw = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        lines.append(f"gradguard.check_op(fn, {call}{', kwargs=dict(' + kw + ')' if kw else ''}{', reference=reference' if self.reference else ''})")
        return "\n".join(lines)

    def shrink(self, args, regime_obj, spec, failures, seed_offset) -> list[Any]:
        """The smallest variant of ``args`` on which the same checks still fail."""
        if not self.opts["shrink"]:
            return args
        wanted = {f.check for f in failures}
        for cand in shrink_candidates(self.B, args):
            try:
                run = self.gradient_suite(cand, "shrink", spec, linearity="gradient.cotangent_linearity" in wanted or "gradient.zero_cotangent" in wanted, seed_offset=seed_offset)
            except Exception:
                continue
            if wanted & {f.check for f in run.failures}:
                return cand
        return args

    # ---- the whole audit ---------------------------------------------------------------------------
    def run(self) -> OpReport:
        t0 = time.perf_counter()
        groups = set(self.opts["checks"])
        base = self.gradient_suite(self.args, "given", Spec(), linearity="gradient" in groups, seed_offset=0)
        self.notes += base.notes
        if "gradient" in groups:
            self.checks += base.checks
            if base.failures:
                small = self.shrink(self.args, None, Spec(), base.failures, 0)
                text = self.repro(small, None)
                for f in base.failures:
                    f.repro = text
                self.findings += base.failures

        if "mutation" in groups or "aliasing" in groups:
            found, checks = audit_mutation(self.B, self.fn, self.args, self.kwargs, self.wrt, self.names, base.U[0])
            keep = lambda c: c.split(".")[0] in groups
            self.findings += [f for f in found if keep(f.check)]
            self.checks += [c for c in checks if keep(c.check)]

        if "composition" in groups:
            found, checks = audit_composition(self.B, self.fn, self.args, self.kwargs, self.wrt, self.names,
                                              base.U[0], base.lin_d.out_names, self.notes)
            self.findings += found
            self.checks += checks

        if "regime" in groups:
            regimes, skipped = build_regimes(self.B, self.args, self.wrt, self.kwargs, self.defaults, set(self.opts["regimes"]))
            for name, why in skipped.items():
                self.checks.append(CheckResult(f"regime.{name}", name, "skip", why))
            for n, regime in enumerate(regimes, start=1):
                self._run_regime(regime, base, n)

        report = OpReport(
            op=self.opts["name"] or self.B.op_name(self.fn),
            backend=self.B.name,
            inputs=[f"{n}: {self.B.describe(a)}{' (differentiated)' if i in self.wrt else ''}" for i, (n, a) in enumerate(zip(self.names, self.args))],
            reference=self.B.op_name(self.reference) if self.reference is not None else None,
            findings=self.findings,
            checks=self.checks,
            notes=_dedupe(self.notes),
            options={k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in self.opts.items() if k != "kwargs"} | {"kwargs": {k: repr(v) for k, v in self.kwargs.items()}},
        )
        report.elapsed_s = time.perf_counter() - t0
        return report

    def _run_regime(self, regime: Regime, base: _Run, n: int):
        check = f"regime.{regime.name}"
        try:
            if regime.spec.layout:
                found, checks = self.layout_check(regime, base)
                for f in found:
                    f.repro = self.repro(self.args, regime)
                self.findings += found
                self.checks += checks
                return
            run = self.gradient_suite(regime.args, regime.name, regime.spec, linearity=False, seed_offset=n)
        except InvalidArgument:
            raise
        except Exception as exc:
            self.findings.append(Failure(check=check, regime=regime.name, severity="warning",
                                         message=f"fn raised {type(exc).__name__} on these inputs ({regime.description}): {str(exc)[:200]}",
                                         why="the op may not support this input (fine if documented) or crashes on it.",
                                         fix="if the op should support it, this is a bug; otherwise exclude the regime with regimes=[...]."))
            self.checks.append(CheckResult(check, regime.name, "warn", type(exc).__name__))
            return
        self.notes += run.notes
        # A bug that already fails on the given inputs fails in most regimes too: report it once.
        given = {(f.check, f.input) for f in self.findings if f.regime == "given"}
        repeated = [f for f in run.failures if (f.check, f.input) in given]
        run.failures = [f for f in run.failures if (f.check, f.input) not in given]
        if repeated and not run.failures:
            self.checks.append(CheckResult(check, regime.name, "fail", "same failures as on the given inputs"))
            self.notes.append(f"{check} fails the same way as the given inputs ({', '.join(sorted({f.check for f in repeated}))}); not repeated")
            return
        if run.failures:
            small = self.shrink(regime.args, regime, regime.spec, run.failures, n)
            text = self.repro(small, regime)
            for f in run.failures:
                f.message = f"[{f.check}] {f.message} ({regime.description})"
                f.check = check
                f.repro = text
            self.findings += run.failures
        self.checks.append(CheckResult(check, regime.name, "fail" if run.failures else "pass", regime.description))


def _scale(a: np.ndarray) -> float:
    a = np.asarray(a)
    fin = a[np.isfinite(a)]
    return float(np.max(np.abs(fin), initial=0.0)) or 1e-300


def _dedupe(items):
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def run_check_op(B, fn: Callable, inputs: tuple, reference, options: dict) -> OpReport:
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"check_op: unknown option {unknown[0]!r}; known options: {', '.join(sorted(DEFAULT_OPTIONS))}. "
            f"Keyword arguments for fn itself go in kwargs={{...}}."
        )
    opts = {**DEFAULT_OPTIONS, **options}
    if not callable(fn):
        raise InvalidArgument(
            f"check_op: fn must be callable (a function, autograd.Function.apply, a torch.library op or a module); got {_type_name(fn)}."
        )
    if reference is not None and not callable(reference):
        raise InvalidArgument(f"check_op: reference must be callable or None; got {_type_name(reference)}.")
    if not inputs:
        raise InvalidArgument("check_op: no inputs given; pass the op's tensor inputs after fn: check_op(fn, x, ...).")
    names = B.parameter_names(fn, len(inputs))
    for name, x in zip(names, inputs):
        if not B.is_tensor(x):
            raise InvalidArgument(
                f"check_op: input {name} is {_type_name(x)}, not a {B.tensor_type_name}; every positional input must be a tensor. "
                f"Pass other arguments of fn through kwargs={{...}} or functools.partial(fn, ...)."
            )
    if opts["kwargs"] is not None and not isinstance(opts["kwargs"], dict):
        raise InvalidArgument(f"check_op: kwargs must be a dict of keyword arguments for fn; got {_type_name(opts['kwargs'])}.")
    bad_groups = sorted(set(opts["checks"]) - set(CHECK_GROUPS)) if not isinstance(opts["checks"], str) else [opts["checks"]]
    if bad_groups:
        raise InvalidArgument(f"check_op: checks contains {bad_groups[0]!r}; expected a sequence drawn from {list(CHECK_GROUPS)}.")
    bad_regimes = sorted(set(opts["regimes"]) - set(REGIME_NAMES)) if not isinstance(opts["regimes"], str) else [opts["regimes"]]
    if bad_regimes:
        raise InvalidArgument(f"check_op: regimes contains {bad_regimes[0]!r}; expected a sequence drawn from {list(REGIME_NAMES)}.")
    if not isinstance(opts["probes"], int) or opts["probes"] < 1:
        raise InvalidArgument(f"check_op: probes must be a positive int; got {opts['probes']!r}.")
    with B.audit_threads(inputs):
        return _Audit(B, fn, inputs, reference, opts).run()
