"""What the checks of ``check_op`` share: the op under audit (``Subject``), one regime's runs (``Run``, ``Suite``) and
how they are made (``OpRuns``: the op and the reference linearized in their dtype and in float64, with VJPs for random
cotangents), where a check puts its results (``Suite``, ``Outcome``), the two ways a regime ends early, and the float64
numerics every check uses (tolerant comparisons, finite-difference probes; numpy only).

# NOTE [Directional probes]
# A VJP ``g = J^T u`` is checked without building J: for a tangent ``w`` the scalar ``<u, J w>`` from
# central differences must equal ``<g, w>``. One finite-difference pair per tangent checks every
# cotangent at once, so K tangents x K cotangents give K^2 checks for 2K forward calls. Cotangents are
# random and non-unit, so a backward that squares (or ignores) its upstream gradient is caught, which
# ``torch.autograd.gradcheck``'s unit cotangents cannot do. Small inputs (<= ``full_jacobian_max``
# elements) use the basis tangents instead: that is the full Jacobian, and failures point at elements.
#
# The allowed errors are NOTE [Tolerances] in ``tolerances``, which holds every value they use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .._errors import InvalidArgument
from .adapter_base import OpRaised
from .regimes import Spec
from .report import CheckResult, Failure
from .tolerances import TOLERANCES, gradient_floor

if TYPE_CHECKING:
    from .audit import EffectivePrecision

__all__ = ["Subject", "Check", "scale", "Run", "Suite", "Outcome", "ReferenceRaised", "NotApplicable",
           "reorder", "OpRuns", "check_outputs", "reference_pairs", "Mismatch", "compare", "step_size", "EPS64",
           "Cotangents"]

EPS64 = float(np.finfo(np.float64).eps)


@dataclass
class Mismatch:
    """Outcome of a tolerant comparison; ``ok`` False means at least one element exceeded its tolerance."""

    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    index: tuple[int, ...] | None = None
    got: float | None = None
    expected: float | None = None


def compare(got: np.ndarray, expected: np.ndarray, allowed: np.ndarray | float) -> Mismatch:
    """Element-wise ``|got - expected| <= allowed``; non-finite values must match exactly (nan vs nan ok). ``max_rel``
    is relative to the largest expected magnitude (per element it explodes on elements that are zero by chance)."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        got = np.broadcast_to(got, expected.shape) if got.size == 1 else got.reshape(expected.shape)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=np.float64), expected.shape)
    if expected.size == 0:
        return Mismatch(ok=True)
    fin_e = np.isfinite(expected)
    all_finite = bool(fin_e.all()) and bool(np.isfinite(got).all())
    with np.errstate(invalid="ignore", over="ignore"):
        if all_finite:  # the usual case, without the masks below (which then change nothing)
            diff = np.abs(got - expected)
        else:
            fin_g = np.isfinite(got)
            diff = np.where(fin_e & fin_g, np.abs(got - expected), 0.0)
            same_nonfinite = (~fin_e) & (~fin_g) & ((np.isnan(got) & np.isnan(expected)) | (got == expected))
            bad_finite = fin_e != fin_g
            diff = np.where(bad_finite | ((~fin_e) & (~fin_g) & ~same_nonfinite), np.inf, diff)
        excess = diff - allowed
    scale = float(np.max(np.abs(expected if all_finite else np.where(fin_e, expected, 0.0))))
    max_abs = float(np.max(diff))
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if bool(np.all(diff <= allowed)):  # the usual case: where the worst element is matters only to a failure
        return Mismatch(ok=True, max_abs=max_abs, max_rel=max_rel)
    worst = int(np.argmax(np.where(np.isfinite(excess), excess, np.inf)))
    idx = tuple(int(i) for i in np.unravel_index(worst, expected.shape)) if expected.ndim else ()
    return Mismatch(ok=False, max_abs=max_abs, max_rel=max_rel, index=idx, got=float(got.reshape(-1)[worst]),
                    expected=float(expected.reshape(-1)[worst]))


def step_size(x: np.ndarray, rel: float = TOLERANCES["gradient.numerical.step"]) -> float:
    """Finite-difference step for one input: relative to its magnitude, at least ``rel``."""
    finite = x[np.isfinite(x)]
    mag = float(np.max(np.abs(finite))) if finite.size else 1.0
    return rel * max(1.0, mag)


def dot(us: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(u * v) for u, v in zip(us, vs)))


def absdot(us: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(sum(np.sum(np.abs(u) * np.abs(v)) for u, v in zip(us, vs)))


class Cotangents:
    """The K cotangents of a run stacked per output, so ``<u_k, v>`` and ``<|u_k|, |v|>`` come for every k at once.
    Each row is the product ``dot`` / ``absdot`` form for one k, summed the same way (numpy's pairwise sum along a
    contiguous row, outputs added in order to 0.0): the same numbers bit for bit, without the Python loop over k.
    ``fits``: whether values have the cotangents' sizes (if not, ``dot`` / ``absdot`` per k broadcast)."""

    def __init__(self, U: Sequence[Sequence[np.ndarray]]):
        self.K = len(U)
        n_out = len(U[0]) if U else 0
        self.rows = [np.stack([np.asarray(us[o]).reshape(-1) for us in U]) for o in range(n_out)]
        self.abs_rows = [np.abs(r) for r in self.rows]

    def fits(self, vs: Sequence[np.ndarray]) -> bool:
        return len(vs) == len(self.rows) and all(np.size(v) == r.shape[1] for v, r in zip(vs, self.rows))

    def dot(self, vs: Sequence[np.ndarray], absolute: bool = False) -> np.ndarray:
        """``[dot(u_k, vs) for k]`` (``absdot`` with ``absolute``) as an array."""
        acc = np.zeros(self.K)
        with np.errstate(invalid="ignore", over="ignore"):
            for r, v in zip(self.abs_rows if absolute else self.rows, vs):
                v = np.asarray(v)
                acc = acc + np.sum(r * (np.abs(v) if absolute else v).reshape(-1), axis=1)
        return acc

    def absdot(self, vs: Sequence[np.ndarray]) -> np.ndarray:
        return self.dot(vs, absolute=True)


@dataclass(eq=False)
class Subject:
    """What every check reads about the op under audit.

    # NOTE [The current regime's inputs]
    # ``args``, ``kwargs`` and ``wrt`` are the inputs being checked now: the regime stage sets them to a regime's
    # (the batch slice's args, an argument regime's kwargs, a subset's wrt) and puts the given ones back, so every
    # check reads them here instead of keeping a copy.
    """

    B: Any  # the framework's check adapter (NOTE [One audit engine] in ``adapter_base``)
    fn: Callable
    reference: Callable | None
    opts: dict
    args: list
    kwargs: dict
    wrt: list[int]
    names: list[str]
    defaults: dict
    input_scales: dict[int, tuple[Any, float]] = field(default_factory=dict)  # id -> (tensor, max|x|) for ``floor``

    def to64(self, args):
        return [self.B.to_float64(a) if self.B.is_tensor(a) and self.B.kind(a) == "float" else a for a in args]

    def dtype(self, i) -> str:
        return self.B.dtype_name(self.args[self.wrt[i]])

    def floor_scales(self, i, run) -> tuple[float, float, float, float]:
        """What ``tolerances.gradient_floor`` needs for the gradient of ``wrt[i]`` in ``run``: max|u| of the first
        cotangent, max|f| of the outputs, max|x| of that input, and the largest max|x| of the differentiated inputs."""
        if run.scales is None:  # the run's cotangent and output scales, once per run
            run.scales = (max((float(np.max(np.abs(x), initial=0.0)) for x in run.U[0]), default=1.0),
                          max((scale(o) for o in run.lin_d.outputs), default=1.0))
        xs = [self._input_scale(self.args[j]) for j in self.wrt]
        return (*run.scales, xs[i], max(xs, default=0.0))

    def floor(self, i, run, dt) -> float:
        """Absolute tolerance floor in gradient units (see NOTE [Tolerance floor] in ``tolerances``)."""
        return gradient_floor(self.B.eps(dt), *self.floor_scales(i, run))

    def _input_scale(self, t) -> float:
        held, x = self.input_scales.get(id(t), (None, None))
        if held is not t:  # once per input tensor
            x = scale(self.B.to_numpy(t)) if self.B.numel(t) else 1.0
            self.input_scales[id(t)] = (t, x)
        return x

    def where(self, i, m: Mismatch, got_label, exp_label) -> str:
        idx = ", ".join(map(str, m.index or ()))
        return f"{self.names[self.wrt[i]]}[{idx}]: {got_label} {m.got:.6g}, {exp_label} {m.expected:.6g}"


@dataclass(eq=False)
class Check:
    """One check of ``check_op`` (as torch.testing's ``Pair``): it reads the op under audit and has one ``compare``."""

    op: Subject

    def fail_input(self, s: Suite, check: str, i: int, m: Mismatch, labels: tuple[str, str], **texts) -> None:
        """``check`` fails for the gradient of input ``wrt[i]``: ``m`` compared (cotangent, element), the cotangent
        dropped from the worst index; ``labels`` name the two sides in ``where``."""
        m.index = m.index[1:] if m.index else m.index
        s.fail(check, input=self.op.names[self.op.wrt[i]], max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                  where=self.op.where(i, m, *labels), **texts)


def scale(a: np.ndarray) -> float:
    """max|a| over its finite values (``tiny`` when there are none or all are 0)."""
    a = np.asarray(a)
    fin = a[np.isfinite(a)]
    return float(np.max(np.abs(fin), initial=0.0)) or TOLERANCES["tiny"]


class ReferenceRaised(Exception):
    """The reference (not the op) raised."""

    def __init__(self, raised: OpRaised):
        super().__init__(str(raised))
        self.raised = raised


class NotApplicable(Exception):
    """A regime whose inputs the reference itself cannot handle."""


@dataclass
class Run:
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
    scales: tuple[float, float] | None = None  # max|u| of the first cotangent, max|f| of the outputs (``floor``)

    def precision_of(self, dt: str) -> str:
        """A float64 declared dtype computed in lower precision is judged at that precision."""
        return self.eff if dt == "float64" and self.eff not in (None, "float64") else dt


@dataclass
class Suite:
    """One regime's gradient suite in progress: its inputs, the op's run and the reference's runs; its checks put their
    failures and results in the run (``fail``, ``record``)."""

    args: list[Any]
    regime: str
    spec: Spec
    run: Run
    all64: bool  # the op's outputs and differentiated inputs are all float64: its run is the float64 run
    deferred: bool  # the op's float64 run is put off until a disagreement needs it (NOTE [Finite differences as arbiter])
    g_cmp: list  # the op's gradients to compare with the reference's (NOTE [Partial references])
    shared: list[int]  # the op's outputs the reference returns too
    lin_rd: Any = None  # the reference in the op's dtype
    lin_r64: Any = None  # the reference in float64
    g_rd: list | None = None
    g_r64: list | None = None

    def fail(self, check, **kw) -> None:
        self.run.failures.append(Failure(check=check, regime=self.regime, **kw))

    def record(self, check, ok, detail="") -> None:
        self.run.checks.append(CheckResult(check, self.regime, "pass" if ok else "fail", detail))


@dataclass
class Outcome:
    """The whole audit's findings, check results and notes, in the order the stages add them."""

    findings: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, findings=(), checks=(), notes=()) -> None:
        self.findings += findings
        self.checks += checks
        self.notes += notes


def reorder(lin, names: list[str]) -> None:
    """``lin``'s outputs in the order of ``names`` (the reference's names of the outputs it shares with fn)."""
    order = [lin.out_names.index(n) for n in names]
    lin.out_tensors = [lin.out_tensors[j] for j in order]
    lin.outputs = [lin.outputs[j] for j in order]
    lin.out_names = list(names)


_LOW_FLOATS = TOLERANCES["gradient.precision"]  # the lower float dtypes cotangents are rounded to


def check_outputs(B, lin, who: str):
    if lin.out_tensors:
        return
    got = ", ".join(f"{n}: {B.describe(o)}{'' if B.requires_grad(o) else ' (does not require grad)'}" for n, o in lin.all_outputs) or "no tensor"
    raise InvalidArgument(
        f"check_op: {who} returned no differentiable tensor output (got {got}). check_op audits gradients, so "
        f"{who} must return at least one floating-point tensor computed from its inputs with autograd on; "
        f"did it detach its result or run under {B.no_grad_hint}?")


def reference_pairs(B, lin, lin_r) -> list[tuple[int, str]]:
    """(position among fn's differentiable outputs, the reference's name for it) for every output the reference
    returns (NOTE [Partial references]); a reference returning one tensor matches fn's first output."""
    ours = list(lin.out_names)
    theirs = {n: B.shape(o) for n, o in zip(lin_r.out_names, lin_r.out_tensors)}
    rename = {"output": "output[0]"} if "output" not in ours and "output[0]" in ours else {}
    unknown = sorted(n for n in theirs if rename.get(n, n) not in ours)
    if unknown or not theirs:
        raise InvalidArgument(
            f"check_op: reference returned differentiable outputs {sorted(theirs)} but fn returned {sorted(ours)}; "
            f"the reference must compute the same function as fn (the same outputs, or the first of them).")
    pairs = sorted((ours.index(rename.get(n, n)), n) for n in theirs)
    for j, n in pairs:
        if tuple(B.shape(lin.out_tensors[j])) != tuple(theirs[n]):
            raise InvalidArgument(
                f"check_op: reference returned {n} with shape {list(theirs[n])} but fn returned shape "
                f"{list(B.shape(lin.out_tensors[j]))}; the reference must compute the same function as fn "
                f"(same outputs, same shapes).")
    return pairs


class OpRuns:
    """The op's and the reference's runs on a regime's inputs, and what the given inputs' runs taught the later ones:
    whether a graph may serve several cotangents (NOTE [One backward per graph]), whether fn runs in float64, the
    reference's outputs there (NOTE [Regime not applicable]) and the precision fn really computes in."""

    def __init__(self, op: Subject, precision: EffectivePrecision):
        self.op = op
        self.precision = precision  # found on the given inputs' float64 run, used by every later one
        # random cotangents per run. NOTE [Finite differences as arbiter]: against a reference's exact gradient one
        # random cotangent sees any wrong element (with probability 1), a second guards against an unlucky small one;
        # without a reference, finite differences need the third against their own noise
        self.probes = op.opts["probes"] if op.reference is None else max(1, op.opts["probes"] - 1)
        self.repeatable = False  # the mutation audit saw a second backward through one graph agree
        self.reference_repeatable = False  # the reference's backward gave one cotangent's gradient twice, bit for bit
        self.given_has_64 = False  # fn ran in float64 on the given inputs
        self.given_ref_outputs: list[np.ndarray] = []
        self.given_finite = True

    def _cotangents(self, lin, rng, probes: int) -> list[list[np.ndarray]]:
        return [[self._cotangent(rng, out, dt) for out, dt in zip(lin.outputs, lin.out_dtypes)] for _ in range(probes)]

    def _cotangent(self, rng, out, dt: str) -> np.ndarray:
        u = rng.standard_normal(out.shape)
        u = np.where(np.abs(np.abs(u) - 1.0) < 0.25, u * 1.7, u)  # keep away from +-1 (NOTE [Directional probes])
        return self.op.B.round_to(np.asarray(u), dt) if dt in _LOW_FLOATS or dt == "float64" else u

    def _vjps(self, fn, args, U, first, out_names=None) -> list[list[np.ndarray]]:
        """One VJP per cotangent, each on its own forward pass.

        # NOTE [One backward per graph]
        # A backward that mutates what it saved (Liger's cross entropy scales its saved gradient in place)
        # is only right the first time. That is reported once, by mutation.backward_not_repeatable; the
        # gradient checks must not be polluted by it, so every cotangent gets a fresh graph, until the mutation
        # audit has seen the op's backward give the same gradient twice through one graph (``repeatable``), or
        # this graph itself gave the first cotangent's gradient again, bit for bit (``_repeats``: one extra
        # backward instead of a forward and a backward per further cotangent; the reference and the given
        # inputs, which run before the mutation audit, use it).
        """
        op = self.op
        out = [first.pullback(U[0])]
        # the reference's backward is trusted once repeatable (it is not checked again in every regime)
        one_graph = (fn is op.fn and self.repeatable) or (fn is op.reference and self.reference_repeatable)
        if not one_graph and len(U) > 1 and self._repeats(first, U[0], out[0]):
            self.reference_repeatable = self.reference_repeatable or fn is op.reference
            one_graph = True
        if one_graph:
            return out + [first.pullback(u) for u in U[1:]]
        for u in U[1:]:
            lin = op.B.linearize(fn, args, op.kwargs, op.wrt)
            if out_names is not None:  # names too: MindSpore's pull matches cotangents to outputs by name
                reorder(lin, out_names)
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

    def _run64(self, fn, args, U, who, run_notes, out_names=None):
        """fn's float64 linearization and VJPs, or (None, None) with a note when fn cannot run in float64."""
        op = self.op
        try:
            lin = op.B.linearize(fn, op.to64(args), op.kwargs, op.wrt)
            if any(dt != "float64" for dt in lin.out_dtypes):
                run_notes.append(f"{who} returned {', '.join(sorted(set(lin.out_dtypes)))} outputs for float64 inputs; float64 checks skipped")
                return None, None
            if out_names is not None:
                reorder(lin, out_names)
            return lin, self._vjps(fn, op.to64(args), U, lin, out_names)
        except OpRaised as exc:
            run_notes.append(f"{who}'s {exc.phase} failed on float64 inputs ({type(exc.error).__name__}: {str(exc.error)[:120]}); "
                             f"checks run in the op's own dtype with tolerances from a float64 reference where one is given")
            return None, None

    def of_op(self, args, regime: str, spec: Spec, seed_offset: int) -> Suite:
        """The op's runs on ``args``: in its dtype, and in float64 unless that is deferred (NOTE [Finite differences
        as arbiter])."""
        op = self.op
        B, fn, ref = op.B, op.fn, op.reference
        rng = np.random.default_rng(op.opts["seed"] + seed_offset)
        lin_d = B.linearize(fn, args, op.kwargs, op.wrt)
        check_outputs(B, lin_d, "fn")
        U = self._cotangents(lin_d, rng, self.probes)
        g_d = self._vjps(fn, args, U, lin_d)
        run = Run(lin_d=lin_d, U=U, g_d=g_d)
        all64 = all(dt == "float64" for dt in lin_d.out_dtypes) and all(op.dtype(i) == "float64" for i in range(len(op.wrt)))
        # NOTE [Finite differences as arbiter]: with a reference, outside the given inputs the op's float64 run only
        # serves finite differences and the kinks' subgradient test, which run only when the op disagrees with the
        # reference
        deferred = ref is not None and regime not in ("given", "shrink") and self.given_has_64 and not all64
        if all64:
            run.lin_64, run.g_64 = lin_d, g_d
        elif not deferred:
            run.lin_64, run.g_64 = self._run64(fn, args, U, "fn", run.notes)
        # NOTE [Memory]: from here on only the runs' numbers are needed, not their graphs and saved tensors
        for lin in (lin_d, run.lin_64):
            if lin is not None:
                lin.release()
        run.eff = self.precision.of(args, run) if run.lin_64 is not None else (self.precision.dtype if deferred else None)
        self._op_domain(run, regime)
        return Suite(args=args, regime=regime, spec=spec, run=run, all64=all64, deferred=deferred, g_cmp=g_d,
                     shared=list(range(len(lin_d.out_names))))

    def _op_domain(self, run: Run, regime: str) -> None:
        """What the given inputs' run says for the regimes; a regime where fn's float64 outputs are not finite and no
        reference says whether they should be: not applicable."""
        if regime == "given":
            self.given_has_64 = run.lin_64 is not None
            self.given_finite = all(np.all(np.isfinite(o)) for o in (run.lin_64 or run.lin_d).outputs)
        elif self.op.reference is None and run.lin_64 is not None and self.given_finite and \
                not all(np.all(np.isfinite(o)) for o in run.lin_64.outputs):
            # NOTE [Outside the domain]: fn's own float64 outputs are NaN/inf here (log-probabilities x1000 are no
            # log-probabilities): backward and finite differences are both NaN, and without a reference nothing says
            # whether the op should have handled these inputs; with one, the reference decides (NOTE [Regime not
            # applicable])
            raise NotApplicable("outside fn's domain: its float64 outputs are NaN/inf on these inputs, and there is no "
                                "reference to say whether they should be finite")

    def op64_late(self, s: Suite) -> None:
        """The op's float64 run that ``deferred`` put off, made once when a disagreement needs it."""
        run = s.run
        if s.deferred and run.lin_64 is None:
            run.lin_64, run.g_64 = self._run64(self.op.fn, s.args, run.U, "fn", run.notes)
            if run.lin_64 is not None:
                run.lin_64.release()

    def of_reference(self, s: Suite) -> None:
        """The reference's runs on the regime's inputs, into ``s``; the regime is not applicable where the reference
        itself returns NaN/inf (NOTE [Regime not applicable])."""
        try:
            self._reference_linearized(s)
        except OpRaised as exc:
            raise ReferenceRaised(exc) from exc
        for lin in (s.lin_rd, s.lin_r64):
            if lin is not None:
                lin.release()
        if s.regime != "given":
            # NOTE [Regime not applicable]: inputs the reference itself cannot handle (every label ignored, a
            # log of 0) say nothing about the op: the regime is skipped, not failed.
            truth_vals = list((s.lin_r64 or s.lin_rd).outputs) + [g for gs in (s.g_r64 or s.g_rd) for g in gs]
            truth_vals += list(s.lin_rd.outputs) + [g for gs in s.g_rd for g in gs]  # overflow in the op's dtype too
            given_finite = all(np.all(np.isfinite(o)) for o in self.given_ref_outputs)
            if given_finite and not all(np.all(np.isfinite(v)) for v in truth_vals):
                raise NotApplicable("the reference returns NaN/inf on these inputs (in float64 or in the op's dtype)")
        else:
            self.given_ref_outputs = list((s.lin_r64 or s.lin_rd).outputs)

    def _reference_linearized(self, s: Suite) -> None:
        op = self.op
        B, fn, ref, args, run = op.B, op.fn, op.reference, s.args, s.run
        lin_d, U = run.lin_d, run.U
        lin_rd = B.linearize(ref, args, op.kwargs, op.wrt)
        check_outputs(B, lin_rd, "reference")
        pairs = reference_pairs(B, lin_d, lin_rd)
        s.shared, native = [j for j, _ in pairs], [n for _, n in pairs]
        reorder(lin_rd, native)
        U_r = [[us[j] for j in s.shared] for us in U]
        g_rd = self._vjps(ref, args, U_r, lin_rd, native)
        if len(s.shared) < len(lin_d.out_names):
            # NOTE [Partial references]: a reference that returns fewer outputs (a fused add+norm's reference
            # without the residual; or, with one input requiring grad, outputs that do not depend on it) is
            # compared on what it returns: the op's VJP with zero cotangents on the other outputs
            U_m = [[u if j in s.shared else np.zeros_like(u) for j, u in enumerate(us)] for us in U]
            s.g_cmp = self._vjps(fn, args, U_m, B.linearize(fn, args, op.kwargs, op.wrt))
        if s.all64 and run.eff not in (None, "float64"):
            # float64 declared, lower precision computed: the reference's own error in that precision sets the tolerance
            s.lin_r64, s.g_r64 = lin_rd, g_rd
            low_args = [B.from_numpy(B.to_numpy(a), a, run.eff) if i in op.wrt else a for i, a in enumerate(args)]
            lin_rd = B.linearize(ref, low_args, op.kwargs, op.wrt)
            reorder(lin_rd, native)
            g_rd = self._vjps(ref, low_args, U_r, lin_rd, native)
        elif s.all64:
            s.lin_r64, s.g_r64 = lin_rd, g_rd
        else:
            s.lin_r64, s.g_r64 = self._run64(ref, args, U_r, "reference", run.notes, native)
        s.lin_rd, s.g_rd = lin_rd, g_rd
