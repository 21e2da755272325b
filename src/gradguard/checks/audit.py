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
#
# NOTE [Finite differences as arbiter]
# With a reference, the reference's float64 VJP is the truth and finite differences estimate the same quantity less
# precisely, at 2 forward runs per probe (a third of check_op's time). They run on the given inputs always; in every
# other regime only when the op disagrees with the reference there, to tell a wrong op from a reference whose
# convention differs. gradient.reference is computed first and listed after gradient.numerical, the order the report
# ranks root causes in.
#
# NOTE [Effective precision]
# float64 inputs do not mean float64 math: a Triton kernel loads float64, computes in float32 and stores
# float64. The float64 run is repeated once on inputs jittered by 2^-40 (values no float32 can hold); if
# every output and gradient is still exactly a float32 (or float16/bfloat16) value, the op computes in that
# precision and every float64 check uses its tolerances (finite differences with a larger step). An op that does
# only part of its math in float32 (Liger-Kernel's and TransformerEngine's cross entropies: float64 in, the
# normaliser in float32) passes that test; its float64 outputs then miss part of the 2^-40 step that the same
# step made 2^28 times longer (which float32 resolves) shows, which is the second test (``_blind_to_float64_steps``;
# the op's forward only, so a wrong backward is never taken for lower precision).
# When the op cannot run in float64 at all (forward or backward rejects it), the checks run in the op's
# own dtype; with a reference, tolerances come from the reference's own error against its float64 run.
#
# Every tolerance and threshold the checks use is in ``tolerances.TOLERANCES``, with the reason for its value;
# NOTE [Tolerance floor] there is the absolute floor every gradient comparison adds.
"""

from __future__ import annotations

import sys
import time
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._errors import InvalidArgument
from . import numerical as num
from .composition import audit_composition
from .differences import Differences
from .mutation import audit_mutation
from .op_raised import OpRaised
from .arguments import check_vary, discover_arguments
from .isolate import can_fork, looks_compiled, run_forked
from .regimes import REGIME_NAMES, Regime, Spec, build_regimes, shrink_candidates
from .report import CheckResult, Failure, OpReport, verdict_order
from .tolerances import TOLERANCES, gradient_floor, written
from ..core.internal import log_fallback

__all__ = ["run_check_op", "check_options", "CHECK_GROUPS", "DEFAULT_OPTIONS"]

CHECK_GROUPS = ("gradient", "regime", "mutation", "aliasing", "composition")
DEFAULT_OPTIONS: dict[str, Any] = {
    "kwargs": None,  # keyword arguments passed to fn and reference
    "wrt": None,  # positions of the inputs to differentiate (default: see NOTE [Which inputs])
    "checks": CHECK_GROUPS,
    "regimes": REGIME_NAMES,
    "seed": 0,
    "probes": 3,  # random cotangents, and random tangents per input
    "full_jacobian_max": 32,  # inputs with at most this many elements get the full Jacobian
    "rtol": TOLERANCES["gradient.numerical.rtol"],  # finite-difference comparison, relative to the magnitude of the terms
    "reference_factor": TOLERANCES["reference.factor"],  # the op may be this many times less accurate than the reference
    "shrink": True,  # look for a smaller reproducing input for failures
    "name": None,  # name shown in the report
    "vary": None,  # {argument name: False | list of values}: NOTE [Argument regimes]
    "budget": None,  # seconds, or "quick": NOTE [Budget]
    "surrogate": None,  # a function whose gradient fn's backward declares to compute: NOTE [Surrogate gradients]
    "isolate": "auto",  # value regimes in a child process: True, False, "auto" (compiled ops): NOTE [Isolated regimes]
}
# NOTE [Budget]
# ``budget=`` bounds the audit's time: the given inputs always get the gradient suite; then the argument regimes
# (what no other tool explores), the other regimes, mutation, aliasing and composition run in that order while time
# is left, and whatever the budget did not reach is listed as skipped ("budget spent"), never as passed.
# ``budget="quick"`` is QUICK_FACTOR times what the given inputs' gradient suite took (about gradcheck's own cost on
# small inputs: a full Jacobian in float64).
QUICK_FACTOR = 1.5
# NOTE [Which inputs]
# Floating-point tensor inputs are differentiated. If some of them have requires_grad=True, only those
# are (so an input can be excluded by passing it with requires_grad=False next to ones with True);
# ``wrt=`` overrides both.
LARGE_INPUT_ELEMENTS = 1 << 20  # NOTE [Large inputs]
_LOW_FLOATS = TOLERANCES["gradient.precision"]  # the lower float dtypes cotangents are rounded to
_LINEARITY_ALPHA = 2.5


class _ReferenceRaised(Exception):
    """The reference (not the op) raised."""

    def __init__(self, raised: OpRaised):
        super().__init__(str(raised))
        self.raised = raised


class _NotApplicable(Exception):
    """A regime whose inputs the reference itself cannot handle."""


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
    eff: str | None = None  # precision the float64 run really has (NOTE [Effective precision])
    failures: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scales: tuple[float, float] | None = None  # max|u| of the first cotangent, max|f| of the outputs (``_floor``)


@dataclass
class _Suite:
    """One regime's gradient suite in progress: its inputs, the op's run and the reference's runs."""

    args: list[Any]
    regime: str
    spec: Spec
    run: _Run
    all64: bool  # the op's outputs and differentiated inputs are all float64: its run is the float64 run
    deferred: bool  # the op's float64 run is put off until a disagreement needs it (NOTE [Finite differences as arbiter])
    g_cmp: list  # the op's gradients to compare with the reference's (NOTE [Partial references])
    shared: list[int]  # the op's outputs the reference returns too
    lin_rd: Any = None  # the reference in the op's dtype
    lin_r64: Any = None  # the reference in float64
    g_rd: list | None = None
    g_r64: list | None = None


@dataclass
class _Sink:
    """Where one regime's checks put their failures and results."""

    run: _Run
    regime: str

    def fail(self, check, **kw) -> None:
        self.run.failures.append(Failure(check=check, regime=self.regime, **kw))

    def record(self, check, ok, detail="") -> None:
        self.run.checks.append(CheckResult(check, self.regime, "pass" if ok else "fail", detail))


def _reorder(lin, names: list[str]) -> None:
    """``lin``'s outputs in the order of ``names`` (the reference's names of the outputs it shares with fn)."""
    order = [lin.out_names.index(n) for n in names]
    lin.out_tensors = [lin.out_tensors[j] for j in order]
    lin.outputs = [lin.outputs[j] for j in order]
    lin.out_names = list(names)


class _Audit:
    def __init__(self, B, fn, args, reference, opts, probes_given: bool = False):
        self.B = B
        self.fn = fn
        self.reference = reference
        self.opts = opts
        self.kwargs = dict(opts["kwargs"] or {})
        self.args = list(args)
        self.names = B.parameter_names(fn, len(args))
        self.defaults = B.signature_defaults(fn)
        self.wrt = self._choose_wrt()
        self.arguments = discover_arguments(B, fn, self.args, self.kwargs)
        self.vary = check_vary(opts["vary"], self.arguments, B.op_name(fn))
        iso = opts["isolate"]
        self._isolate = can_fork() and (looks_compiled(fn) if iso == "auto" else bool(iso))
        if iso is True and not can_fork():
            self.notes.append("isolate=True: this platform has no os.fork, regimes run in this process")
        self.findings: list[Failure] = []
        self.checks: list[CheckResult] = []
        self.notes: list[str] = []
        self._repeatable = False  # the mutation audit saw a second backward through one graph agree
        self._elements = sum(B.numel(self.args[i]) for i in self.wrt)  # differentiated, in the given inputs
        if not probes_given:
            self._one_probe_for_large_inputs()
        self._eff: str | None = None
        self._given_has_64 = False  # fn ran in float64 on the given inputs
        # random cotangents per run. NOTE [Finite differences as arbiter]: against a reference's exact gradient one
        # random cotangent sees any wrong element (with probability 1), a second guards against an unlucky small one;
        # without a reference, finite differences need the third against their own noise
        self._probes = opts["probes"] if reference is None else max(1, opts["probes"] - 1)
        self._reference_repeatable = False  # the reference's backward gave one cotangent's gradient twice, bit for bit
        self._given_ref_outputs: list[np.ndarray] = []
        self._given_finite = True
        self._input_scales: dict[int, tuple[Any, float]] = {}  # id -> (tensor, max|x|) for ``_floor``

    def _one_probe_for_large_inputs(self) -> None:
        """NOTE [Large inputs]: every probe is a float64 cotangent, VJP and gradient of the input's size in every
        regime; past LARGE_INPUT_ELEMENTS differentiated elements (the full Jacobian is long out of reach there) one
        random cotangent and one random direction per regime still catch a wrong VJP, at about half the memory
        and time (16 MiB float32 input: 144x -> 99x its size at peak, 26 -> 12 s). ``probes=`` set by the
        caller is kept."""
        n = self._elements
        if n > LARGE_INPUT_ELEMENTS and self.opts["probes"] > 1:
            self.opts = {**self.opts, "probes": 1}
            self.notes.append(f"{n} differentiated elements: one random cotangent and one random direction per check "
                              f"(probes=1) to bound memory and time; pass probes=3 for more")

    # ---- validation --------------------------------------------------------------------------------
    def _choose_wrt(self) -> list[int]:
        B, args = self.B, self.args
        floats = [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "float"]
        if not floats:
            got = ", ".join(f"{n}: {B.describe(a)}" for n, a in zip(self.names, args))
            raise InvalidArgument(
                f"check_op: inputs has no floating-point tensor (got {got}), so there is no gradient to check. "
                f"Pass at least one floating-point tensor input (for example x.float())."
            )
        wrt = self.opts["wrt"]
        if wrt is None:
            # NOTE [Which inputs]: inputs marked requires_grad (when some are) are the ones differentiated, so a
            # bias-only audit is check_op(fn, x, w, b.requires_grad_()); 0-dim floats such as a temperature are
            # differentiated like any other unless excluded that way.
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
            f"did it detach its result or run under {self.B.no_grad_hint}?"
        )

    def _reference_pairs(self, lin, lin_r) -> list[tuple[int, str]]:
        """(position among fn's differentiable outputs, the reference's name for it) for every output the reference
        returns (NOTE [Partial references]); a reference returning one tensor matches fn's first output."""
        ours = list(lin.out_names)
        theirs = {n: self.B.shape(o) for n, o in zip(lin_r.out_names, lin_r.out_tensors)}
        rename = {"output": "output[0]"} if "output" not in ours and "output[0]" in ours else {}
        unknown = sorted(n for n in theirs if rename.get(n, n) not in ours)
        if unknown or not theirs:
            raise InvalidArgument(
                f"check_op: reference returned differentiable outputs {sorted(theirs)} but fn returned {sorted(ours)}; "
                f"the reference must compute the same function as fn (the same outputs, or the first of them).")
        pairs = sorted((ours.index(rename.get(n, n)), n) for n in theirs)
        for j, n in pairs:
            if tuple(self.B.shape(lin.out_tensors[j])) != tuple(theirs[n]):
                raise InvalidArgument(
                    f"check_op: reference returned {n} with shape {list(theirs[n])} but fn returned shape "
                    f"{list(self.B.shape(lin.out_tensors[j]))}; the reference must compute the same function as fn "
                    f"(same outputs, same shapes).")
        return pairs

    # ---- helpers -----------------------------------------------------------------------------------
    def _cotangents(self, lin, rng, probes: int) -> list[list[np.ndarray]]:
        U = []
        for _ in range(probes):
            us = []
            for out, dt in zip(lin.outputs, lin.out_dtypes):
                u = rng.standard_normal(out.shape)
                u = np.where(np.abs(np.abs(u) - 1.0) < 0.25, u * 1.7, u)  # keep away from +-1 (NOTE [Directional probes])
                us.append(self.B.round_to(np.asarray(u), dt) if dt in _LOW_FLOATS or dt == "float64" else u)
            U.append(us)
        return U

    def _vjps(self, fn, args, U, first, out_names=None) -> list[list[np.ndarray]]:
        """One VJP per cotangent, each on its own forward pass.

        # NOTE [One backward per graph]
        # A backward that mutates what it saved (Liger's cross entropy scales its saved gradient in place)
        # is only right the first time. That is reported once, by mutation.backward_not_repeatable; the
        # gradient checks must not be polluted by it, so every cotangent gets a fresh graph, until the mutation
        # audit has seen the op's backward give the same gradient twice through one graph (``_repeatable``), or
        # this graph itself gave the first cotangent's gradient again, bit for bit (``_repeats``: one extra
        # backward instead of a forward and a backward per further cotangent; the reference and the given
        # inputs, which run before the mutation audit, use it).
        """
        out = [first.pullback(U[0])]
        if fn is self.fn and self._repeatable:
            # an op whose backward the mutation audit found repeatable on the given inputs pulls every cotangent
            # back through one graph (fewer forward calls per regime); the reference is not audited for it
            return out + [first.pullback(u) for u in U[1:]]
        if fn is self.reference and self._reference_repeatable:
            # the trusted reference's backward repeated once: it is not checked again in every regime
            return out + [first.pullback(u) for u in U[1:]]
        if len(U) > 1 and self._repeats(first, U[0], out[0]):
            # this graph gave the same gradient, bit for bit, a second time: its backward left what it saved as it
            # was, so the other cotangents go through it too (one backward instead of a forward and a backward each)
            self._reference_repeatable = self._reference_repeatable or fn is self.reference
            return out + [first.pullback(u) for u in U[1:]]
        for u in U[1:]:
            lin = self.B.linearize(fn, args, self.kwargs, self.wrt)
            if out_names is not None:
                lin.out_tensors = [lin.out_tensors[lin.out_names.index(n)] for n in out_names]
            out.append(lin.pullback(u))
        return out

    @staticmethod
    def _repeats(lin, u, g) -> bool:
        """Whether a second pullback of ``u`` through ``lin``'s graph gives ``g`` again, bit for bit (NaN as NaN)."""
        try:
            again = lin.pullback(u)
        except OpRaised:
            return False
        return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(again, g))

    def _to64(self, args):
        return [self.B.to_float64(a) if self.B.is_tensor(a) and self.B.kind(a) == "float" else a for a in args]

    def _run64(self, fn, args, U, who, run_notes, out_names=None):
        """fn's float64 linearization and VJPs, or (None, None) with a note when fn cannot run in float64."""
        try:
            lin = self.B.linearize(fn, self._to64(args), self.kwargs, self.wrt)
            if any(dt != "float64" for dt in lin.out_dtypes):
                run_notes.append(f"{who} returned {', '.join(sorted(set(lin.out_dtypes)))} outputs for float64 inputs; float64 checks skipped")
                return None, None
            if out_names is not None:
                order = [lin.out_names.index(n) for n in out_names]
                lin.out_tensors = [lin.out_tensors[j] for j in order]
                lin.outputs = [lin.outputs[j] for j in order]
                lin.out_names = list(out_names)
            return lin, self._vjps(fn, self._to64(args), U, lin, out_names)
        except OpRaised as exc:
            run_notes.append(f"{who}'s {exc.phase} failed on float64 inputs ({type(exc.error).__name__}: {str(exc.error)[:120]}); "
                             f"checks run in the op's own dtype with tolerances from a float64 reference where one is given")
            return None, None

    def _effective_dtype(self, args, run: _Run) -> str:
        """The precision fn really computes in when fed float64 (see NOTE [Effective precision])."""
        if self._eff is not None:
            return self._eff
        self._eff = "float64"
        rng = np.random.default_rng(self.opts["seed"] + 7)
        jittered = list(self._to64(args))
        for i in self.wrt:
            v = self.B.to_numpy(jittered[i])
            jittered[i] = self.B.with_values(jittered[i], v * (1.0 + 2.0**-40 * rng.standard_normal(v.shape)) + 2.0**-60)
        try:
            lin = self.B.linearize(self.fn, jittered, self.kwargs, self.wrt)
            values = list(lin.outputs) + list(lin.pullback([np.asarray(u) for u in run.U[0]]))
        except OpRaised:
            return self._eff
        flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values]) if values else np.zeros(0)
        flat = flat[np.isfinite(flat) & (flat != 0)]
        if flat.size == 0:
            return self._eff
        for dt in ("bfloat16", "float16", "float32"):
            if np.array_equal(self.B.round_to(flat, dt), flat):
                self._eff = dt
                self.notes.append(
                    f"fn computes in {dt} on float64 inputs (every output and gradient of a float64 run is exactly a "
                    f"{dt} value, as with a Triton kernel that upcasts to float32 only): float64 checks use {dt} tolerances")
                break
        if self._eff == "float64" and self._blind_to_float64_steps(run, args, jittered, lin):
            self._eff = "float32"
            self.notes.append(
                "fn computes partly in float32 on float64 inputs (its float64 outputs do not follow a 2^-40 step of the "
                "inputs the way its own backward says they should, as with a kernel that loads float64 and does part "
                "of its math in float32): float64 checks use float32 tolerances")
        return self._eff

    def _blind_to_float64_steps(self, run: _Run, args, jittered, lin_jittered) -> bool:
        """Whether the float64 outputs miss part of a step no float32 can hold (NOTE [Effective precision]).

        The step from the given float64 inputs to the jittered ones is ~2^-40 relative; the same step made
        2^28 times longer (~2^-12, which float32 does resolve) is the yardstick: a float64 op moves its outputs
        along <u, f(x + s) - f(x)> in proportion, up to rounding (at the short step) and curvature (at the long
        one), both far below ``effective_precision.missed``; an op that rounds its inputs to float32 for part of its math does
        not see that part of the short step at all. Only the op's forward is used: a wrong backward (which the
        gradient checks report) must not pass for lower precision.
        """
        base = self._to64(args)
        stretch = 2.0**28
        longer = list(base)
        step = {}
        for i in self.wrt:
            x0 = self.B.to_numpy(base[i])
            step[i] = self.B.to_numpy(jittered[i]) - x0
            longer[i] = self.B.with_values(base[i], x0 + stretch * step[i])
        try:
            lin_long = self.B.linearize(self.fn, longer, self.kwargs, self.wrt)
        except OpRaised:
            return False
        outputs = [np.asarray(o, dtype=np.float64) for o in run.lin_64.outputs]
        short = [np.asarray(o, dtype=np.float64) - o0 for o0, o in zip(outputs, lin_jittered.outputs)]
        long = [np.asarray(o, dtype=np.float64) - o0 for o0, o in zip(outputs, lin_long.outputs)]
        if [np.shape(o) for o in long] != [np.shape(o) for o in outputs]:
            return False
        worst = 0.0
        ulp64 = TOLERANCES["effective_precision.rounding"].of(num.EPS64)
        for u in run.U:
            seen, predicted = num.dot(u, short), num.dot(u, long) / stretch
            scale = num.absdot(u, long) / stretch
            if not (np.isfinite(seen) and np.isfinite(predicted)) or scale < TOLERANCES["effective_precision.min_scale"]:
                return False
            rounding = ulp64 * (num.absdot(u, outputs) + num.absdot(u, lin_jittered.outputs))
            worst = max(worst, (abs(seen - predicted) - rounding) / scale)
        return worst > TOLERANCES["effective_precision.missed"]

    def floor_scales(self, i, run) -> tuple[float, float, float, float]:
        """What ``tolerances.gradient_floor`` needs for the gradient of ``wrt[i]`` in ``run``: max|u| of the first
        cotangent, max|f| of the outputs, max|x| of that input, and the largest max|x| of the differentiated inputs."""
        if run.scales is None:  # the run's cotangent and output scales, once per run
            run.scales = (max((float(np.max(np.abs(x), initial=0.0)) for x in run.U[0]), default=1.0),
                          max((_scale(o) for o in run.lin_d.outputs), default=1.0))
        u, f = run.scales
        xs = [self._input_scale(self.args[j]) for j in self.wrt]
        return u, f, xs[i], max(xs, default=0.0)

    def _floor(self, i, run, dt) -> float:
        """Absolute tolerance floor in gradient units (see NOTE [Tolerance floor] in ``tolerances``)."""
        return gradient_floor(self.B.eps(dt), *self.floor_scales(i, run))

    def _input_scale(self, t) -> float:
        held, x = self._input_scales.get(id(t), (None, None))
        if held is not t:  # once per input tensor
            x = _scale(self.B.to_numpy(t)) if self.B.numel(t) else 1.0
            self._input_scales[id(t)] = (t, x)
        return x

    def _where(self, i, m: num.Mismatch, got_label, exp_label) -> str:
        idx = ", ".join(map(str, m.index or ()))
        return f"{self.names[self.wrt[i]]}[{idx}]: {got_label} {m.got:.6g}, {exp_label} {m.expected:.6g}"

    def _dtype(self, i) -> str:
        return self.B.dtype_name(self.args[self.wrt[i]])

    # ---- the gradient suite ------------------------------------------------------------------------
    def gradient_suite(self, args, regime: str, spec: Spec, linearity: bool, seed_offset: int) -> _Run:
        s = self._op_runs(args, regime, spec, seed_offset)
        if self.reference is not None:
            self._reference_runs(s)
        sink = _Sink(s.run, regime)
        if self.reference is not None:
            self._forward_reference(s, sink)
        # gradient.reference (run before gradient.numerical, listed after it: NOTE [Finite differences as arbiter])
        against_ref = self._gradient_reference(s, sink)
        self._gradient_numerical(s, sink, against_ref[1])
        s.run.checks += against_ref[0]
        s.run.failures += against_ref[1]
        if self.reference is None and spec.precision and s.run.g_64 is not None and not s.all64:
            self._gradient_precision(s, sink)
        elif self.reference is None and spec.convention and s.run.g_64 is not None:
            self._gradient_nonfinite(s, sink)
        if linearity:
            self._linearity(s.run, args, regime, sink.fail, sink.record)
        return s.run

    def _op_runs(self, args, regime: str, spec: Spec, seed_offset: int) -> _Suite:
        """The op's runs on ``args``: in its dtype, and in float64 unless that is deferred (NOTE [Finite differences
        as arbiter])."""
        B, fn, ref = self.B, self.fn, self.reference
        rng = np.random.default_rng(self.opts["seed"] + seed_offset)
        lin_d = B.linearize(fn, args, self.kwargs, self.wrt)
        self._check_outputs(lin_d, "fn")
        U = self._cotangents(lin_d, rng, self._probes)
        g_d = self._vjps(fn, args, U, lin_d)
        run = _Run(lin_d=lin_d, U=U, g_d=g_d)
        all64 = all(dt == "float64" for dt in lin_d.out_dtypes) and all(self._dtype(i) == "float64" for i in range(len(self.wrt)))
        # NOTE [Finite differences as arbiter]: with a reference, outside the given inputs the op's float64 run only
        # serves finite differences and the kinks' subgradient test, which run only when the op disagrees with the
        # reference
        deferred = ref is not None and regime not in ("given", "shrink") and self._given_has_64 and not all64
        if all64:
            run.lin_64, run.g_64 = lin_d, g_d
        elif not deferred:
            run.lin_64, run.g_64 = self._run64(fn, args, U, "fn", run.notes)
        # NOTE [Memory]: from here on only the runs' numbers are needed, not their graphs and saved tensors
        for lin in (lin_d, run.lin_64):
            if lin is not None:
                lin.release()
        run.eff = self._effective_dtype(args, run) if run.lin_64 is not None else (self._eff if deferred else None)
        self._op_domain(run, regime)
        return _Suite(args=args, regime=regime, spec=spec, run=run, all64=all64, deferred=deferred, g_cmp=g_d,
                      shared=list(range(len(lin_d.out_names))))

    def _op_domain(self, run: _Run, regime: str) -> None:
        """What the given inputs' run says for the regimes; a regime where fn's float64 outputs are not finite and no
        reference says whether they should be: not applicable."""
        if regime == "given":
            self._given_has_64 = run.lin_64 is not None
        if regime == "given":
            self._given_finite = all(np.all(np.isfinite(o)) for o in (run.lin_64 or run.lin_d).outputs)
        elif self.reference is None and run.lin_64 is not None and self._given_finite and \
                not all(np.all(np.isfinite(o)) for o in run.lin_64.outputs):
            # NOTE [Outside the domain]: fn's own float64 outputs are NaN/inf here (log-probabilities x1000 are no
            # log-probabilities): backward and finite differences are both NaN, and without a reference nothing says
            # whether the op should have handled these inputs; with one, the reference decides (NOTE [Regime not
            # applicable])
            raise _NotApplicable("outside fn's domain: its float64 outputs are NaN/inf on these inputs, and there is no "
                                 "reference to say whether they should be finite")

    def _op64_late(self, s: _Suite) -> None:
        """The op's float64 run that ``deferred`` put off, made once when a disagreement needs it."""
        run = s.run
        if s.deferred and run.lin_64 is None:
            run.lin_64, run.g_64 = self._run64(self.fn, s.args, run.U, "fn", run.notes)
            if run.lin_64 is not None:
                run.lin_64.release()

    def _reference_runs(self, s: _Suite) -> None:
        """The reference's runs on the regime's inputs, into ``s``; the regime is not applicable where the reference
        itself returns NaN/inf (NOTE [Regime not applicable])."""
        try:
            self._reference_linearized(s)
        except OpRaised as exc:
            raise _ReferenceRaised(exc) from exc
        for lin in (s.lin_rd, s.lin_r64):
            if lin is not None:
                lin.release()
        if s.regime != "given":
            # NOTE [Regime not applicable]: inputs the reference itself cannot handle (every label ignored, a
            # log of 0) say nothing about the op: the regime is skipped, not failed.
            truth_vals = list((s.lin_r64 or s.lin_rd).outputs) + [g for gs in (s.g_r64 or s.g_rd) for g in gs]
            truth_vals += list(s.lin_rd.outputs) + [g for gs in s.g_rd for g in gs]  # overflow in the op's dtype too
            given_finite = all(np.all(np.isfinite(o)) for o in self._given_ref_outputs)
            if given_finite and not all(np.all(np.isfinite(v)) for v in truth_vals):
                raise _NotApplicable("the reference returns NaN/inf on these inputs (in float64 or in the op's dtype)")
        else:
            self._given_ref_outputs = list((s.lin_r64 or s.lin_rd).outputs)

    def _reference_linearized(self, s: _Suite) -> None:
        B, fn, ref, args, run = self.B, self.fn, self.reference, s.args, s.run
        lin_d, U = run.lin_d, run.U
        lin_rd = B.linearize(ref, args, self.kwargs, self.wrt)
        self._check_outputs(lin_rd, "reference")
        pairs = self._reference_pairs(lin_d, lin_rd)
        s.shared, native = [j for j, _ in pairs], [n for _, n in pairs]
        _reorder(lin_rd, native)
        U_r = [[us[j] for j in s.shared] for us in U]
        g_rd = self._vjps(ref, args, U_r, lin_rd, native)
        if len(s.shared) < len(lin_d.out_names):
            # NOTE [Partial references]: a reference that returns fewer outputs (a fused add+norm's reference
            # without the residual; or, with one input requiring grad, outputs that do not depend on it) is
            # compared on what it returns: the op's VJP with zero cotangents on the other outputs
            U_m = [[u if j in s.shared else np.zeros_like(u) for j, u in enumerate(us)] for us in U]
            s.g_cmp = self._vjps(fn, args, U_m, B.linearize(fn, args, self.kwargs, self.wrt))
        if s.all64 and run.eff not in (None, "float64"):
            # float64 declared, lower precision computed: the reference's own error in that precision
            # (inputs rounded, math in it) sets the tolerance, with its float64 run as the truth
            s.lin_r64, s.g_r64 = lin_rd, g_rd
            low_args = [B.from_numpy(B.to_numpy(a), a, run.eff) if i in self.wrt else a for i, a in enumerate(args)]
            lin_rd = B.linearize(ref, low_args, self.kwargs, self.wrt)
            _reorder(lin_rd, native)
            g_rd = self._vjps(ref, low_args, U_r, lin_rd, native)
        elif s.all64:
            s.lin_r64, s.g_r64 = lin_rd, g_rd
        else:
            s.lin_r64, s.g_r64 = self._run64(ref, args, U_r, "reference", run.notes, native)
        s.lin_rd, s.g_rd = lin_rd, g_rd

    def _forward_reference(self, s: _Suite, sink: _Sink) -> None:
        """``forward.reference``: the op's outputs against the reference's."""
        lin_d, lin_rd, lin_r64 = s.run.lin_d, s.lin_rd, s.lin_r64
        ok = True
        for k, o in enumerate(s.shared):
            name = lin_d.out_names[o]
            dt = self._precision_of(lin_d.out_dtypes[o], s.run)
            truth = lin_r64.outputs[k] if lin_r64 is not None else lin_rd.outputs[k]
            allowed, rule = self._derived_tol(lin_d.outputs[o], lin_rd.outputs[k], truth, dt, lin_r64 is not None, 0.0)
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

    def _gradient_reference(self, s: _Suite, sink: _Sink) -> tuple[list[CheckResult], list[Failure]]:
        """``gradient.reference``, taken out of the run's checks and failures (to be listed after gradient.numerical)."""
        run = s.run
        marks = len(run.checks), len(run.failures)
        if self.reference is not None:
            ok = True
            for i in range(len(self.wrt)):
                ok = self._gradient_reference_input(s, sink, i) and ok
            sink.record("gradient.reference", ok)
        against_ref = run.checks[marks[0]:], run.failures[marks[1]:]
        del run.checks[marks[0]:], run.failures[marks[1]:]
        return against_ref

    def _gradient_reference_input(self, s: _Suite, sink: _Sink, i: int) -> bool:
        run = s.run
        dt = self._precision_of(self._dtype(i), run)
        got = np.stack([g[i] for g in s.g_cmp])
        ref_d = np.stack([g[i] for g in s.g_rd])
        truth = np.stack([g[i] for g in s.g_r64]) if s.g_r64 is not None else ref_d
        allowed, rule = self._derived_tol(got, ref_d, truth, dt, s.g_r64 is not None, self._floor(i, run, dt))
        m = num.compare(got, truth, allowed)
        if m.ok and run.g_64 is not None and s.g_r64 is not None and not s.all64 and run.eff == "float64" \
                and s.g_cmp is run.g_d:
            got64 = np.stack([g[i] for g in run.g_64])
            scale = _scale(truth)
            rel64 = TOLERANCES["reference.float64_op"]
            m2 = num.compare(got64, truth, rel64 * scale + self._floor(i, run, "float64"))
            if not m2.ok:
                m, rule = m2, f"{rel64:g} x max|reference| (float64 op vs float64 reference)"
        if m.ok:
            return True
        # a padding row's zero gradient is a convention, not a kink: only the kinks regime has subgradients
        if s.regime == "kinks" and self._kink_subgradient(s, i, got, truth, allowed):
            return True
        m.index = m.index[1:] if m.index else m.index
        name = self.names[self.wrt[i]]
        sink.fail("gradient.reference", input=name,
                  message=f"gradient of {name} differs from the reference's",
                  max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=rule,
                  where=self._where(i, m, "op", "reference"),
                  why="the op's backward does not compute the reference's gradient (to the precision the "
                  "reference itself reaches in this dtype).",
                  fix="compare the backward formula with the reference's; the worst element is shown above.")
        return False

    def _kink_subgradient(self, s: _Suite, i: int, got, truth, allowed) -> bool:
        """Whether the op's gradient, which differs from the reference's in the kinks regime, is another valid
        subgradient there (NOTE [Kink conventions]); a note says so."""
        run = s.run
        self._op64_late(s)
        if run.lin_64 is not None and s.g_cmp is run.g_d and \
                self._within_subgradient(i, s.args, run, got, truth, allowed):
            name = self.names[self.wrt[i]]
            run.notes.append(f"gradient of {name} differs from the reference's only at kinks, where it is another "
                             f"valid subgradient (between the one-sided derivatives): accepted")
            return True
        return False

    def _gradient_numerical(self, s: _Suite, sink: _Sink, against_ref: list[Failure]) -> None:
        """``gradient.numerical`` (or ``gradient.surrogate``), or why it is skipped."""
        run, regime, ref = s.run, s.regime, self.reference
        numeric_dt = run.eff if run.lin_64 is not None or s.deferred else self._dtype(0)
        if self.opts["surrogate"] is not None:
            self._surrogate(s.args, run, regime, sink.fail, sink.record)
        elif not s.spec.numerical:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "finite differences not meaningful here"))
        elif ref is not None and regime != "given" and not against_ref:
            run.checks.append(CheckResult("gradient.numerical", regime, "skip", "the op agrees with the reference's "
                                          "float64 gradient (finite differences would repeat that, less precisely)"))
        else:
            self._op64_late(s)
            if run.lin_64 is not None or numeric_dt == "float32":
                self._numerical(s.args, run, regime, sink.fail, sink.record, s.g_r64, numeric_dt)
            else:
                run.checks.append(CheckResult("gradient.numerical", regime, "skip", f"fn does not run in float64 and {numeric_dt} is too coarse for finite differences"))

    def _gradient_precision(self, s: _Suite, sink: _Sink) -> None:
        """``gradient.precision`` without a reference: the op's dtype run against its own float64 run."""
        run = s.run
        ok = True
        for i in range(len(self.wrt)):
            dt = self._dtype(i)
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            rel = TOLERANCES["gradient.precision"].get(dt, TOLERANCES["gradient.precision.other"])
            m = num.compare(got, truth, rel * _scale(truth) + self._floor(i, run, dt))
            if not m.ok:
                ok = False
                m.index = m.index[1:] if m.index else m.index
                name = self.names[self.wrt[i]]
                sink.fail("gradient.precision", input=name,
                          message=f"gradient of {name} in {dt} is far from the op's own float64 gradient",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|float64 gradient|",
                          where=self._where(i, m, dt, "float64"),
                          why="overflow, cancellation or a missing upcast in low precision (the float64 run is "
                          "correct or was checked against finite differences).",
                          fix=f"accumulate in float32 (or subtract the row max / use a stable formula); pass reference= to "
                          f"judge {dt} error against a trusted implementation instead of a fixed tolerance.")
        sink.record("gradient.precision", ok)

    def _gradient_nonfinite(self, s: _Suite, sink: _Sink) -> None:
        """``gradient.nonfinite`` at kinks without a reference: finite where the float64 gradient is."""
        run = s.run
        ok = True
        for i in range(len(self.wrt)):
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            bad = ~np.isfinite(got) & np.isfinite(truth)
            if bad.any():
                ok = False
                name = self.names[self.wrt[i]]
                sink.fail("gradient.nonfinite", input=name, message=f"gradient of {name} is not finite ({int(bad.sum())} elements)",
                          why="a value at a kink or boundary makes the backward divide by zero or take log(0).",
                          fix="guard the special value in backward (torch.where) the way the forward does.")
        sink.record("gradient.nonfinite", ok)

    def _precision_of(self, dt: str, run: _Run) -> str:
        """A float64 declared dtype computed in lower precision is judged at that precision."""
        return run.eff if dt == "float64" and run.eff not in (None, "float64") else dt

    def _derived_tol(self, got, ref_d, truth, dt, have_truth, floor):
        scale = _scale(truth)
        eps = self.B.eps(dt)
        tol = TOLERANCES["reference"]
        if dt == "float64":
            return tol.at(dt, eps) * scale + floor, f"{tol.float64:g} x max|reference| (float64) + floor from input/output scales"
        if not have_truth or ref_d is truth:
            return tol.at(dt, eps) * scale + floor, f"{tol.ulps:g} ulp x max|reference| ({dt}; reference has no float64 run)"
        with np.errstate(invalid="ignore"):
            d = np.abs(ref_d - truth)
        ref_err = float(np.max(d[np.isfinite(d)], initial=0.0))
        factor = self.opts["reference_factor"]
        ulps = TOLERANCES["reference.ulps"]
        allowed = factor * ref_err + ulps.of(eps) * scale + floor
        return allowed, f"{factor:g} x reference's own {dt} error ({ref_err:.3g}) + {ulps.n:g} ulp x max|reference|"

    def _numerical(self, args, run: _Run, regime, fail, record, g_r64, dt: str):
        """``gradient.numerical``: see NOTE [Directional probes] and NOTE [Effective precision]."""
        base_args = self._to64(args) if run.lin_64 is not None else list(args)
        G_all = run.g_64 if run.lin_64 is not None else run.g_d
        lin = run.lin_64 if run.lin_64 is not None else run.lin_d
        fd = Differences(self.B, self.fn, self.kwargs, self.wrt, run.U, base_args, lin, dt, self.opts)
        ok = True
        for i in range(len(fd.xs)):
            ok = self._numerical_input(fd, i, G_all, run, regime, fail, g_r64, dt) and ok
        record("gradient.numerical", ok)

    def _numerical_input(self, fd: Differences, i: int, G_all, run: _Run, regime, fail, g_r64, dt: str) -> bool:
        """``gradient.numerical`` for input ``wrt[i]``: whether it passes (failing, it adds the failure)."""
        opts = self.opts
        x = fd.xs[i]
        h = num.step_size(x, fd.rel_step)
        name = self.names[self.wrt[i]]
        G = np.stack([g[i] for g in G_all]).reshape(len(run.U), -1)  # (K, n): 0-dim inputs too
        n = G.shape[1]
        # NOTE [Regimes use directions]: K random directions (2K forward calls) see any wrong element, so they
        # judge every input in every regime. The full Jacobian (2n calls) points at the wrong element: it is
        # computed only where directions found a disagreement, for small inputs, on the given inputs (or their
        # shrunk copy), without a reference (whose comparison points at the element already); its verdict then
        # stands, being the finer test. A correct op never pays the 2n calls.
        locate = n <= opts["full_jacobian_max"] and regime in ("given", "shrink") and self.reference is None
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
        self._numerical_failure(fd, i, m, full, mode, dt, fail)
        return False

    def _numerical_failure(self, fd: Differences, i: int, m: num.Mismatch, full: bool, mode: str, dt: str, fail) -> None:
        x = fd.xs[i]
        name = self.names[self.wrt[i]]
        if full:
            idx = np.unravel_index(m.index[1], x.shape) if m.index and x.ndim else ()
            m.index = tuple(int(t) for t in idx)
            where = self._where(i, m, f"backward ({dt})", "finite differences")
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

    def _without_padding_row(self, x, G, expected, allowed, m: num.Mismatch, name: str, run: _Run) -> num.Mismatch:
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

    def _reference_agrees_with_differences(self, i: int, G, g_r64, fd: Differences, run: _Run, dt: str) -> bool:
        """Whether the reference's float64 gradient is the op's: finite differences disagree with both."""
        R = np.stack([g[i] for g in g_r64]).reshape(G.shape[0], -1)
        rel = TOLERANCES["reference.vs_differences"].at(dt, fd.eps)
        return num.compare(G, R, rel * _scale(R) + self._floor(i, run, dt)).ok

    def _surrogate(self, args, run: _Run, regime, fail, record) -> None:
        """``gradient.surrogate``: a declared surrogate gradient (a straight-through estimator, LSQ's step-size gradient)
        replaces finite differences, which an intended surrogate fails by design.

        # NOTE [Surrogate gradients]
        # ``surrogate=`` is a function with fn's signature whose autograd gradient is the one fn's backward is meant to
        # compute (``lambda x: x`` for a rounding with a straight-through backward). Wherever finite differences would
        # judge the backward, the op's VJP is compared with the surrogate's float64 VJP for the same cotangents, at the
        # precision the op computes in; the forward is still compared with the reference, when there is one.
        """
        B = self.B
        use64 = run.lin_64 is not None
        base = self._to64(args) if use64 else list(args)
        try:
            lin = B.linearize(self.opts["surrogate"], base, self.kwargs, self.wrt)
        except OpRaised as exc:
            raise InvalidArgument(f"check_op: surrogate raised {type(exc.error).__name__} in its {exc.phase} "
                                  f"({str(exc.error)[:200]}); it must run on the inputs fn is checked on.") from exc
        pairs = self._reference_pairs(run.lin_64 or run.lin_d, lin)
        if len(pairs) != len(run.lin_d.out_names):
            raise InvalidArgument("check_op: surrogate must return the same differentiable outputs as fn.")
        order = [lin.out_names.index(n) for _, n in pairs]
        lin.out_tensors = [lin.out_tensors[j] for j in order]
        g_s = [lin.pullback(us) for us in run.U]
        lin.release()
        mine = run.g_64 if use64 else run.g_d
        ok = True
        for i in range(len(self.wrt)):
            dt = run.eff if use64 else self._dtype(i)
            got, truth = np.stack([g[i] for g in mine]), np.stack([g[i] for g in g_s])
            rel = TOLERANCES["gradient.surrogate"].at(dt, B.eps(dt))
            m = num.compare(got, truth, rel * _scale(truth) + self._floor(i, run, dt))
            if not m.ok:
                ok = False
                m.index = m.index[1:] if m.index else m.index
                name = self.names[self.wrt[i]]
                fail("gradient.surrogate", input=name, message=f"backward of {name} differs from the declared surrogate's gradient",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|surrogate gradient| ({dt})",
                     where=self._where(i, m, "backward", "surrogate"),
                     why="the backward does not compute the surrogate gradient it is declared to use.",
                     fix="compare the backward with the surrogate's formula; the worst element is shown above.")
        record("gradient.surrogate", ok)

    def _within_subgradient(self, i, args, run: _Run, got, truth, allowed, most: int = 64) -> bool:
        """Whether every element where the op's gradient differs from the reference's lies between the one-sided
        derivatives of <u, fn> along that element (NOTE [Kink conventions]).

        # NOTE [Kink conventions]
        # At a kink (relu at 0, clamp at its limits) any value between the left and the right derivative is a valid
        # gradient; a reference that picks 0 does not make the op's 1 a bug. Where the two differ, fn's float64 forward
        # is stepped by +-h on that element alone (2 calls per element, at most ``most`` elements) and the op's value
        # must lie between <u, f(x) - f(x - h e_j)> / h and <u, f(x + h e_j) - f(x)> / h for every cotangent u.
        """
        B = self.B
        with np.errstate(invalid="ignore"):
            bad = np.abs(got - truth) > allowed
        flat_bad = np.argwhere(bad.reshape(bad.shape[0], -1).any(axis=0)).reshape(-1)
        if flat_bad.size == 0 or flat_bad.size > most:
            return False
        base = self._to64(args)
        pos = self.wrt[i]
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
                    f = B.forward64(self.fn, moved, self.kwargs, names)
                except OpRaised:
                    return False
                sides.append(np.array([sign * num.dot(u, [a - b for a, b in zip(f, f0)]) / h for u in run.U]))
            lo, hi = np.minimum(*sides), np.maximum(*sides)
            slack = tol[:, j] + TOLERANCES["kink.slack"] * (np.abs(lo) + np.abs(hi))
            if not (np.all(np.isfinite(lo)) and np.all(g[:, j] >= lo - slack) and np.all(g[:, j] <= hi + slack)):
                return False
        return True

    def _padding_rows(self, x) -> tuple[int, ...]:
        positional = {n: a for n, a in zip(self.names, self.args) if n == "padding_idx"}
        p = {**self.defaults, **positional, **self.kwargs}.get("padding_idx")
        if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < x.shape[0]:
            return (p,)
        return ()

    def _linearity(self, run: _Run, args, regime, fail, record):
        use64 = run.lin_64 is not None
        base = run.g_64 if use64 else run.g_d
        u0 = run.U[0]
        args = self._to64(args) if use64 else args
        fresh = lambda: self.B.linearize(self.fn, args, self.kwargs, self.wrt)  # NOTE [One backward per graph]
        g_a = fresh().pullback([_LINEARITY_ALPHA * u for u in u0])
        g_z = fresh().pullback([np.zeros_like(u) for u in u0])
        ok_lin = ok_zero = ok_precise = True
        linear = TOLERANCES["gradient.cotangent_linearity"]
        for i in range(len(self.wrt)):
            name = self.names[self.wrt[i]]
            dt = run.eff if use64 else self._dtype(i)
            expected = _LINEARITY_ALPHA * base[0][i]
            scale = _scale(expected)
            tol = linear.at(dt, self.B.eps(dt))
            floor = _LINEARITY_ALPHA * self._floor(i, run, dt)
            m = num.compare(g_a[i], expected, tol * scale + floor)
            coarse = dt == "float64" and not m.ok and \
                num.compare(g_a[i], expected, linear.at("float32", self.B.eps("float32")) * scale + floor).ok
            if coarse:
                # linear to float32's precision, not float64's: a backward that rounds to float32 and casts back
                ok_precise = False
                fail("gradient.precision", input=name,
                     message=f"the float64 gradient of {name} is only float32-accurate (scaling the upstream gradient "
                             f"by {_LINEARITY_ALPHA:g} changes it by {m.max_rel:.1e} relative, float64 rounding allows "
                             f"{written(linear.float64)})",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{tol:g} x max|expected|",
                     where=self._where(i, m, f"g({_LINEARITY_ALPHA:g} u)", f"{_LINEARITY_ALPHA:g} g(u)"),
                     why="the backward computes in float32 (or casts grad_output or a saved tensor down) and casts the "
                     "result back: float64 inputs get float32-accurate gradients, which gradcheck's tolerances and "
                     "the dtype of the result both hide.",
                     fix="compute the backward in the input's dtype (remove the float32 casts).")
            elif not m.ok:
                ok_lin = False
                fail("gradient.cotangent_linearity", input=name,
                     message=f"gradient of {name} does not scale linearly with the upstream gradient",
                     max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{tol:g} x max|expected|",
                     where=self._where(i, m, f"g({_LINEARITY_ALPHA:g} u)", f"{_LINEARITY_ALPHA:g} g(u)"),
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
                     max_abs_err=mz.max_abs, where=self._where(i, mz, "g(0)", "expected"),
                     why="backward adds something that does not depend on grad_output.",
                     fix="every term of the gradient must be multiplied by grad_output.")
        record("gradient.cotangent_linearity", ok_lin)
        record("gradient.zero_cotangent", ok_zero)
        if not ok_precise:
            record("gradient.precision", False)

    # ---- layout regimes ----------------------------------------------------------------------------
    def layout_check(self, regime: Regime, base: _Run) -> tuple[list[Failure], list[CheckResult]]:
        B = self.B
        reshaped = regime.spec.reshaped
        try:
            lin = B.linearize(self.fn, regime.args, self.kwargs, self.wrt)
        except OpRaised:
            if reshaped:  # an op written for one rank may reject another: not a finding
                raise _NotApplicable("fn does not accept the inputs in that shape")
            raise
        check = f"regime.{regime.name}"
        outs = {n: o for n, o in zip(lin.out_names, lin.outputs)}
        if reshaped:
            # NOTE [Same values, another shape]: the regime is only a test of the backward when fn's forward treats
            # the inserted dimension as a batch dimension (outputs equal once reshaped); otherwise fn gives that
            # shape another meaning (a rank-specific op) and the regime does not apply.
            outs = self._reshaped_like(outs, base)
            if outs is None:
                raise _NotApplicable("fn gives the reshaped inputs another meaning (its outputs change, not only their shape)")
        found = []
        for what, got, expected, dt, floor in self._layout_pairs(lin, outs, base, reshaped):
            if got is None:
                continue
            m = num.compare(got, expected, self._same_values_allowed(dt, base, expected) + floor)
            if not m.ok:
                found.append(self._layout_failure(regime, what, m))
        return found, [CheckResult(check, regime.name, "fail" if found else "pass")]

    def _layout_pairs(self, lin, outs: dict, base: _Run, reshaped: bool) -> list[tuple]:
        """(what, the layout regime's value, the given run's, dtype, floor) for every output and gradient."""
        g = lin.pullback([self._shaped(base.U[0][j], lin.outputs[j]) for j in range(len(base.lin_d.out_names))]) \
            if set(outs) == set(base.lin_d.out_names) else None
        if g is not None and reshaped:
            g = [np.asarray(gi).reshape(np.shape(base.g_d[0][i])) for i, gi in enumerate(g)]
        pairs = [(n, outs.get(n), o, dt, 0.0) for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes)]
        if g is not None:
            pairs += [(f"gradient of {self.names[self.wrt[i]]}", g[i], base.g_d[0][i], self._dtype(i),
                       self._floor(i, base, self._dtype(i))) for i in range(len(self.wrt))]
        return pairs

    def _layout_failure(self, regime: Regime, what: str, m: num.Mismatch) -> Failure:
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

    def _same_values_allowed(self, dt: str, base: _Run, expected) -> float:
        """What the same computation on the same values may differ by in another layout: ``regime.layout`` x max|value|."""
        dt = self._precision_of(dt, base)
        return TOLERANCES["regime.layout"].at(dt, self.B.eps(dt)) * _scale(expected)

    @staticmethod
    def _shaped(u, like):
        return np.asarray(u).reshape(np.shape(like)) if np.size(u) == np.size(like) else u

    def _reshaped_like(self, outs: dict, base: _Run) -> dict | None:
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

    # ---- minimal reproducer ------------------------------------------------------------------------
    def repro(self, args, regime: Regime | None) -> str:
        B = self.B
        lines = []
        for name, a in zip(self.names, args):
            if not B.is_tensor(a):
                lines.append(f"{name} = {a!r}")
            elif B.numel(a) <= 64:
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
            except Exception as error:
                log_fallback("checks", "a shrink candidate's gradient suite", error)
                continue
            if wanted & {f.check for f in run.failures}:
                return cand
        return args

    # ---- the whole audit ---------------------------------------------------------------------------
    def run(self) -> OpReport:
        t0 = time.perf_counter()
        groups = set(self.opts["checks"])
        base = self._given_stage(groups)
        if base is None:
            return self._report(t0)

        # NOTE [What a backend cannot check]: an adapter lists the check groups and regimes its framework has no
        # means for (``unsupported``: name -> why); they are reported as skipped with that reason, never as passed.
        unsupported = getattr(self.B, "unsupported", {})
        for group in sorted(groups & set(unsupported)):
            self.checks.append(CheckResult(group, "given", "skip", unsupported[group]))
        groups -= set(unsupported)

        deadline = self._deadline(t0)
        if deadline is not None:  # NOTE [Budget]: the regimes first, the audits of the op's memory after them
            self._regime_stage(groups, unsupported, base, t0, deadline)
            if time.perf_counter() > deadline:
                for group in ("mutation", "aliasing", "composition"):
                    if group in groups:
                        self.checks.append(CheckResult(group, "given", "skip", self._spent()))
                return self._report(t0)
        self._memory_stage(groups, base)
        if deadline is None:
            self._regime_stage(groups, unsupported, base, t0, None)
        return self._report(t0)

    def _given_stage(self, groups: set) -> _Run | None:
        """The gradient suite on the given inputs; None when fn raised there (the finding is recorded)."""
        try:
            base = self.gradient_suite(self.args, "given", Spec(), linearity="gradient" in groups, seed_offset=0)
        except _ReferenceRaised as exc:
            err = exc.raised.error
            raise InvalidArgument(
                f"check_op: reference raised {type(err).__name__} in its {exc.raised.phase} on the given inputs "
                f"({str(err)[:200]}); the reference must run on the inputs fn is checked on."
            ) from err
        except OpRaised as exc:
            self.findings.append(self._raised_finding(exc, "given"))
            self.checks.append(CheckResult("op.raised", "given", "fail", exc.phase))
            return None
        self.notes += base.notes
        if "gradient" in groups:
            self.checks += base.checks
            if base.failures:
                small = self.shrink(self.args, None, Spec(), base.failures, 0)
                text = self.repro(small, None)
                for f in base.failures:
                    f.repro = text
                self.findings += base.failures
        return base

    def _memory_stage(self, groups: set, base: _Run) -> None:
        """The audits of what fn does to memory and in composition: mutation, aliasing, the framework's own checks,
        torch.library's opcheck, composition."""
        if "mutation" in groups or "aliasing" in groups:
            found, checks = audit_mutation(self.B, self.fn, self.args, self.kwargs, self.wrt, self.names, base.U[0])
            keep = lambda c: c.split(".")[0] in groups
            self.findings += [f for f in found if keep(f.check)]
            self.checks += [c for c in checks if keep(c.check)]
            self._repeatable = any(c.check == "mutation.backward_not_repeatable" and c.status == "pass" for c in checks)

        # framework-specific checks (Paddle's unchecked PyLayer saved tensors, MindSpore's bprop and graph mode)
        for framework_check in getattr(self.B, "framework_checks", ()):
            found, checks, notes = framework_check(self, base)
            self.findings += found
            self.checks += checks
            self.notes += notes

        if "mutation" in groups and self.B.opcheck:
            self._opcheck_stage()

        if "composition" in groups:
            found, checks = audit_composition(self.B, self.fn, self.args, self.kwargs, self.wrt, self.names,
                                              base.U[0], base.lin_d.out_names, self.notes)
            self.findings += found
            self.checks += checks

    def _opcheck_stage(self) -> None:
        from .opcheck import audit_opcheck, is_library_op

        if is_library_op(self.fn):
            found, checks, notes = audit_opcheck(self.B, self.fn, self.args, self.kwargs, self.wrt)
            if any(f.check == "opcheck.schema" for f in found):
                # the write bumped the version, but the schema calls the input read-only: not "declared"
                self.findings = [f for f in self.findings if f.check != "mutation.input_write"]
            self.findings += found
            self.checks += checks
            self.notes += notes

    def _deadline(self, t0: float) -> float | None:
        budget = self.opts["budget"]
        if budget is None:
            return None
        return t0 + (QUICK_FACTOR * (time.perf_counter() - t0) if budget == "quick" else float(budget))

    def _spent(self) -> str:
        return f"budget spent (budget={self.opts['budget']!r}); pass a larger budget, or none, to run it"

    def _regime_stage(self, groups, unsupported, base, t0: float, deadline: float | None) -> None:
        if "regime" not in groups:
            return
        full_args = self.args
        try:
            base = self._slice_for_regimes(base)
            selected = set(self.opts["regimes"])
            for name in sorted(selected & set(unsupported)):
                self.checks.append(CheckResult(f"regime.{name}", name, "skip", unsupported[name]))
            regimes, skipped = build_regimes(self.B, self.args, self.wrt, self.kwargs, self.arguments, self.vary,
                                             selected - set(unsupported), self.names)
            for name, why in skipped.items():
                self.checks.append(CheckResult(f"regime.{name}", name, "skip", why))
            if deadline is not None:  # NOTE [Budget]: the argument regimes first
                regimes = _budget_order(regimes)
            given_s = time.perf_counter() - t0
            progress = _Progress(self.opts["name"] or self.B.op_name(self.fn), len(regimes), given_s)
            ran: dict = {}  # NOTE [Same inputs, one run]
            for n, regime in enumerate(regimes, start=1):
                if deadline is not None and time.perf_counter() > deadline:
                    self.checks.append(CheckResult(f"regime.{regime.name}", regime.name, "skip",
                                                   f"{regime.description}: {self._spent()}"))
                    continue
                progress.step(n, regime.name)
                key = self._regime_key(regime)
                if key is not None and key in ran:
                    self._reuse_regime(regime, *ran[key])
                    continue
                n_checks, n_findings, n_notes = len(self.checks), len(self.findings), len(self.notes)
                self._run_regime(regime, base, n)
                if key is not None:
                    ran[key] = (regime, self.checks[n_checks:], self.findings[n_findings:], self.notes[n_notes:])
            progress.done()
        finally:
            self.args = full_args

    def _regime_key(self, regime: Regime):
        """What a value regime's run depends on besides its seed: spec, inputs (dtype, shape, layout, bytes) and which
        are differentiated; None for the regimes never merged (layout regimes, another ``kwargs``).

        # NOTE [Same inputs, one run]
        # Two regimes can build the same inputs: on a 1-D input the leading dimension is the last one, so
        # ``batch_size`` 10 -> 1 and ``feature_dim`` 10 -> 1 both keep x[:1]. The second is not run again: it
        # gets the first one's checks and findings under its own name, and a note says so. What that leaves
        # out is the second run's own random cotangents and directions on the same inputs.
        """
        if regime.spec.layout or regime.kwargs is not None:
            return None
        B = self.B
        contiguous = getattr(B, "is_contiguous", None)
        parts = []
        for a in regime.args:
            if B.is_tensor(a):
                parts.append((B.dtype_name(a), tuple(B.shape(a)), contiguous(a) if contiguous else None, B.fingerprint(a)))
            else:
                parts.append(("object", id(a)))
        return regime.spec, tuple(regime.wrt) if regime.wrt is not None else None, tuple(parts)

    def _reuse_regime(self, regime: Regime, first: Regime, checks: list[CheckResult], findings: list[Failure],
                      notes: list[str]) -> None:
        """``regime`` has ``first``'s inputs (NOTE [Same inputs, one run]): ``first``'s outcome under ``regime``'s name."""
        def renamed(check: str) -> str:
            return f"regime.{regime.name}" if check == f"regime.{first.name}" else check

        for c in checks:
            detail = regime.description if c.detail == first.description else c.detail
            self.checks.append(dataclasses.replace(c, check=renamed(c.check), regime=regime.name, detail=detail))
        for f in findings:
            self.findings.append(dataclasses.replace(f, check=renamed(f.check), regime=regime.name,
                                                     message=f.message.replace(first.description, regime.description)))
        self.notes += [n.replace(f"regime.{first.name} ", f"regime.{regime.name} ") for n in notes]
        self.notes.append(f"regime.{regime.name} ({regime.description}) has the same inputs as regime.{first.name} "
                          f"({first.description}): not run again, its result is that run's")

    def _slice_for_regimes(self, base: _Run) -> _Run:
        """NOTE [Large inputs]: past LARGE_INPUT_ELEMENTS differentiated elements the regimes are derived from the
        first rows of the batch (the leading dimension the inputs share), checked first as inputs of their own,
        so a dozen regimes do not each hold float64 copies of the whole input. Returns the run the regimes are
        compared with (``self.args`` becomes the slice until the regimes are done)."""
        B, args, n = self.B, self.args, self._elements
        first = next((i for i, a in enumerate(args) if B.is_tensor(a) and B.ndim(a) >= 1 and B.shape(a)[0] > 1), None)
        if n <= LARGE_INPUT_ELEMENTS or first is None:
            return base
        b = B.shape(args[first])[0]
        rows = max(1, int(LARGE_INPUT_ELEMENTS * b // n))
        if rows >= b:
            return base
        sliced = [B.from_numpy(B.to_numpy(a)[:rows], a) if B.is_tensor(a) and B.ndim(a) >= 1 and B.shape(a)[0] == b
                  else a for a in args]
        try:
            run = self.gradient_suite(sliced, "batch_slice", Spec(), linearity=False, seed_offset=500)
        except (OpRaised, _ReferenceRaised, _NotApplicable) as exc:
            self.notes.append(f"the regimes run on the whole inputs: fn on their first {rows} rows raised ({exc})")
            return base
        self.notes += run.notes
        if run.failures:
            text = self.repro(sliced, None)
            for f in run.failures:
                f.repro = text
            given = {(f.check, f.input) for f in self.findings if f.regime == "given"}
            self.findings += [f for f in run.failures if (f.check, f.input) not in given]
        self.checks.append(CheckResult("regime.batch_slice", "batch_slice", "fail" if run.failures else "pass",
                                       f"first {rows} of {b} rows"))
        self.notes.append(f"{n} differentiated elements: the regimes run on the first {rows} of {b} rows (leading "
                          f"dimension) to bound memory and time")
        self.args = sliced
        return run

    def _reference_raises(self, args) -> bool:
        try:
            self.B.linearize(self.reference, args, self.kwargs, self.wrt)
        except OpRaised:
            return True
        return False

    def _raised_finding(self, exc: OpRaised, regime: str) -> Failure:
        err = exc.error
        where = ""
        tb = err.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        return Failure(check="op.raised", regime=regime,
                       message=f"fn's {exc.phase} raised {type(err).__name__}: {str(err)[:300]}"
                               + (f" (inputs: {exc.dtype})" if exc.dtype else ""),
                       where=where or None,
                       why=("the op runs with autograd on but crashes with it off (evaluation loops, finite differences): "
                            "a branch for inputs that do not require grad." if exc.autograd_off else
                            f"the op fails on the inputs as given, so no gradient can be checked; every other check "
                            f"depends on a {exc.phase} that runs."),
                       fix=f"fix the {exc.phase} (the line above is where it raised), then re-run check_op.",
                       repro=self.repro(self.args, None))

    def _report(self, t0: float) -> OpReport:
        report = OpReport(
            op=self.opts["name"] or self.B.op_name(self.fn),
            backend=getattr(self.B, "label", self.B.name),
            inputs=[f"{n}: {self.B.describe(a)}{' (differentiated)' if i in self.wrt else ''}" for i, (n, a) in enumerate(zip(self.names, self.args))],
            reference=self.B.op_name(self.reference) if self.reference is not None else None,
            findings=verdict_order(self.findings),
            checks=self.checks,
            notes=_dedupe(self.notes),
            options={k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in self.opts.items() if k != "kwargs"} | {"kwargs": {k: repr(v) for k, v in self.kwargs.items()}},
        )
        self.B.reword(report)
        report.elapsed_s = time.perf_counter() - t0
        return report

    def _run_regime(self, regime: Regime, base: _Run, n: int):
        saved = (self.kwargs, self.wrt)
        self.kwargs = regime.kwargs if regime.kwargs is not None else self.kwargs
        self.wrt = regime.wrt if regime.wrt is not None else self.wrt
        try:
            if self._isolate and not regime.spec.layout:
                self._run_regime_forked(regime, base, n)
            else:
                self._run_regime_inner(regime, base, n)
        finally:
            self.kwargs, self.wrt = saved

    def _run_regime_forked(self, regime: Regime, base: _Run, n: int) -> None:
        """NOTE [Isolated regimes]: the regime in a child process; a crash there is this regime's failure."""
        counts = len(self.checks), len(self.findings), len(self.notes)

        def work():
            self._run_regime_inner(regime, base, n)
            return self.checks[counts[0]:], self.findings[counts[1]:], self.notes[counts[2]:]

        status, result = run_forked(work)
        if status == "raised":
            raise result
        if status == "ok":
            checks, findings, notes = result
            self.checks += checks
            self.findings += findings
            self.notes += notes
            return
        check = f"regime.{regime.name}"
        self.findings.append(Failure(
            check=check, regime=regime.name,
            message=f"fn crashed the process on these inputs: {result} ({regime.description})",
            why="a compiled kernel read or wrote out of bounds on inputs whose shapes or indices differ from the given "
                "ones (it trusts relations between its inputs, or sizes, without checking them).",
            fix="check the shapes and index ranges the kernel relies on before launching it (raise a clear error).",
            repro=self.repro(regime.args, regime)))
        self.checks.append(CheckResult(check, regime.name, "fail", result))

    def _run_regime_inner(self, regime: Regime, base: _Run, n: int):
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
        except (_NotApplicable, _ReferenceRaised) as exc:
            why = str(exc) if isinstance(exc, _NotApplicable) else f"the reference raised on these inputs ({exc})"
            self.checks.append(CheckResult(check, regime.name, "skip", f"regime not applicable: {why}"))
            if regime.fallback is not None:
                self._run_regime_inner(regime.fallback, base, n)
            return
        except OpRaised as exc:
            self._regime_raised(regime, exc)
            return
        self._regime_outcome(regime, run, n)

    def _regime_raised(self, regime: Regime, exc: OpRaised) -> None:
        """fn raised on a regime's inputs: a skip, a failure (the reference handles them) or a warning."""
        check = f"regime.{regime.name}"
        err = exc.error
        if regime.new_argument and exc.phase.startswith("forward"):
            # NOTE [Argument regimes]: an argument value the op does not support says nothing about its gradients
            self.checks.append(CheckResult(check, regime.name, "skip",
                                           f"fn rejects {regime.argument} ({type(err).__name__}: {str(err)[:120]})"))
            return
        if self.reference is not None and self._reference_raises(regime.args):
            self.checks.append(CheckResult(check, regime.name, "skip", "regime not applicable: the reference raises on these inputs too"))
            return
        if self.reference is not None:
            # NOTE [The reference runs, the op raises]: inputs the trusted implementation handles are inputs the op
            # is meant to handle (only a subset requiring grad, a size-1 feature dimension): a failure, with the
            # line it raised at. Without a reference the op may legitimately not support them: a warning.
            found = self._raised_finding(exc, regime.name)
            found.check = check
            found.message = f"fn's {exc.phase} raised {type(err).__name__} on inputs the reference handles ({regime.description}): {str(err)[:200]}"
            found.why = f"the reference computes these inputs, the op's {exc.phase} crashes on them."
            found.repro = self.repro(regime.args, regime)
            self.findings.append(found)
            self.checks.append(CheckResult(check, regime.name, "fail", type(err).__name__))
            return
        self.findings.append(Failure(check=check, regime=regime.name, severity="warning",
                                     message=f"fn's {exc.phase} raised {type(err).__name__} on these inputs ({regime.description}): {str(err)[:200]}",
                                     why="the op may not support this input (fine if documented) or crashes on it.",
                                     fix="if the op should support it, this is a bug; otherwise exclude the regime with regimes=[...]."))
        self.checks.append(CheckResult(check, regime.name, "warn", type(err).__name__))

    def _regime_outcome(self, regime: Regime, run: _Run, n: int) -> None:
        """A value regime's gradient suite ran: its failures, except those the given inputs already showed."""
        check = f"regime.{regime.name}"
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
                if regime.argument:
                    f.message += f"; fails only with {regime.argument}"
                f.check = check
                f.repro = text
            self.findings += run.failures
        self.checks.append(CheckResult(check, regime.name, "fail" if run.failures else "pass", regime.description))

class _Progress:
    """Progress of a long audit on stderr, only when stderr is a terminal (never in logs, CI or pipes).

    # NOTE [Cost before a long audit]
    # Each regime costs about what the given inputs' gradient suite cost; when that adds up to more than
    # LONG_AUDIT_S the audit says so once, with the estimate, before spending it.
    """

    LONG_AUDIT_S = 10.0

    def __init__(self, op: str, total: int, given_s: float):
        self.total = total
        self.on = bool(getattr(sys.stderr, "isatty", lambda: False)()) and total > 0
        estimate = given_s * total
        if self.on and estimate > self.LONG_AUDIT_S:
            print(f"gradguard.check_op: {op}: {total} regimes left, about {estimate:.0f} s "
                  f"(regimes=[...] or checks=('gradient',) makes it shorter)", file=sys.stderr)

    def step(self, n: int, name: str) -> None:
        if self.on:
            print(f"\r  check_op regime {n}/{self.total}: {name:<24}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.on:
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)


def _budget_order(regimes: list[Regime]) -> list[Regime]:
    """NOTE [Budget]: argument regimes first, one value of each argument in turn (negative dims first: the mapping of
    negative dims is where dim bugs hide), then the others in their usual order."""
    by_arg: dict[str, list[Regime]] = {}
    for r in regimes:
        if r.arg_name is not None:
            by_arg.setdefault(r.arg_name, []).append(r)
    for rs in by_arg.values():
        rs.sort(key=lambda r: r.name == "reduction_dim" and "-> " in r.description
                and not r.description.split("-> ")[-1].split("=")[-1].startswith("-"))
    turns = []
    while any(by_arg.values()):
        for rs in by_arg.values():
            if rs:
                turns.append(rs.pop(0))
    return turns + [r for r in regimes if r.arg_name is None]


def _scale(a: np.ndarray) -> float:
    a = np.asarray(a)
    fin = a[np.isfinite(a)]
    return float(np.max(np.abs(fin), initial=0.0)) or TOLERANCES["tiny"]


def _dedupe(items):
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def check_options(options: dict, extra: tuple = ()) -> None:
    """Unknown option names are an error naming the known ones (``extra``: a framework's own, already taken out)."""
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"check_op: unknown option {unknown[0]!r}; known options: {', '.join(sorted([*DEFAULT_OPTIONS, *extra]))}. "
            f"Keyword arguments for fn itself go in kwargs={{...}}."
        )


def _check_callables(fn, inputs: tuple, reference, opts: dict) -> None:
    if not callable(fn):
        raise InvalidArgument(
            f"check_op: fn must be callable (a function, autograd.Function.apply, a torch.library op or a module); got {_type_name(fn)}."
        )
    if reference is not None and not callable(reference):
        raise InvalidArgument(f"check_op: reference must be callable or None; got {_type_name(reference)}.")
    if opts["surrogate"] is not None and not callable(opts["surrogate"]):
        raise InvalidArgument(f"check_op: surrogate must be callable (a function with fn's signature whose gradient is the "
                              f"intended one) or None; got {_type_name(opts['surrogate'])}.")
    if not inputs:
        raise InvalidArgument("check_op: no inputs given; pass the op's tensor inputs after fn: check_op(fn, x, ...).")
    # Like gradcheck, non-tensor positional inputs (Python scalars, None, tuples ...) are passed through unchanged.
    if opts["kwargs"] is not None and not isinstance(opts["kwargs"], dict):
        raise InvalidArgument(f"check_op: kwargs must be a dict of keyword arguments for fn; got {_type_name(opts['kwargs'])}.")


def _outside(chosen, known) -> list:
    """The names in ``chosen`` that ``known`` does not have (a string is one name, never a sequence of letters)."""
    return sorted(set(chosen) - set(known)) if not isinstance(chosen, str) else [chosen]


def _check_values(opts: dict) -> None:
    bad_groups = _outside(opts["checks"], CHECK_GROUPS)
    if bad_groups:
        raise InvalidArgument(f"check_op: checks contains {bad_groups[0]!r}; expected a sequence drawn from {list(CHECK_GROUPS)}.")
    bad_regimes = _outside(opts["regimes"], REGIME_NAMES)
    if bad_regimes:
        raise InvalidArgument(f"check_op: regimes contains {bad_regimes[0]!r}; expected a sequence drawn from {list(REGIME_NAMES)}.")
    if opts["isolate"] not in (True, False, "auto"):
        raise InvalidArgument(f"check_op: isolate must be True, False or 'auto'; got {opts['isolate']!r}.")
    budget = opts["budget"]
    if budget is not None and budget != "quick" and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                                     or not budget > 0):
        raise InvalidArgument(f"check_op: budget must be a positive number of seconds or 'quick'; got {budget!r}.")
    if not isinstance(opts["probes"], int) or opts["probes"] < 1:
        raise InvalidArgument(f"check_op: probes must be a positive int; got {opts['probes']!r}.")


def run_check_op(B, fn: Callable, inputs: tuple, reference, options: dict) -> OpReport:
    check_options(options)
    opts = {**DEFAULT_OPTIONS, **options}
    _check_callables(fn, inputs, reference, opts)
    _check_values(opts)
    with B.audit_threads(inputs):
        return _Audit(B, fn, inputs, reference, opts, probes_given="probes" in options).run()
