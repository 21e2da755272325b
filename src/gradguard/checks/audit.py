"""``check_op``: the op audit. Orchestrates gradient, regime, mutation, aliasing and composition checks.

# NOTE [The audit's parts]
# ``_Audit`` runs the stages; each check is a class with one ``compare`` that is handed what it reads (the ``Subject``:
# adapter, fn, reference, options, current inputs; a regime's ``Suite`` and a ``Sink`` for its results):
#   gradient_numerical (finite differences, surrogate, forward/gradient.reference, precision, nonfinite, linearity)
#   regime_stage (which regimes, budget, slice; one regime's checks in report order or its layout check; isolation;
#                 reproducers)
#   runs (what the checks share; OpRuns: the op's and the reference's runs)   mutation (mutation, aliasing, composition)
# The options (defaults, validation) are defined here.

# NOTE [What is compared with what]
# For the inputs of each regime the op runs in its own dtype and (when it accepts float64) in float64;
# the reference, when given, runs the same two ways. With cotangents U (random, non-unit, rounded to the
# output dtype so every run sees identical values):
#   gradient.numerical   op float64 VJP vs float64 central differences (see ``gradient_numerical``)
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

import time
from typing import Any, Callable

import numpy as np

from . import numerical as num
from .._errors import InvalidArgument
from .adapter_base import OpRaised
from .arguments import check_vary, discover_arguments
from .mutation import audit_composition, audit_mutation
from .regime_stage import (LARGE_INPUT_ELEMENTS, GradientSuite, RegimeStage, budget_spent, can_fork, looks_compiled,
                           raised_finding, repro)
from .regimes import REGIME_NAMES, Spec
from .report import CheckResult, OpReport, verdict_order
from .runs import OpRuns, Outcome, ReferenceRaised, Run, Subject
from .tolerances import TOLERANCES

__all__ = ["run_check_op", "check_options", "CHECK_GROUPS", "DEFAULT_OPTIONS", "LARGE_INPUT_ELEMENTS"]

# ``check_op``'s options, their defaults and their validation
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
    "budget": None,  # seconds, or "quick": NOTE [Budget] in ``audit``
    "surrogate": None,  # a function whose gradient fn's backward declares to compute: NOTE [Surrogate gradients]
    "isolate": "auto",  # value regimes in a child process: True, False, "auto" (compiled ops): NOTE [Isolated regimes]
}


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_options(options: dict, extra: tuple = ()) -> None:
    """Unknown option names are an error naming the known ones (``extra``: a framework's own, already taken out)."""
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"check_op: unknown option {unknown[0]!r}; known options: {', '.join(sorted([*DEFAULT_OPTIONS, *extra]))}. "
            f"Keyword arguments for fn itself go in kwargs={{...}}."
        )


def check_callables(fn, inputs: tuple, reference, opts: dict) -> None:
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


def check_values(opts: dict) -> None:
    for option, known in (("checks", CHECK_GROUPS), ("regimes", REGIME_NAMES)):
        chosen = opts[option]  # a string is one name, never a sequence of letters
        bad = sorted(set(chosen) - set(known)) if not isinstance(chosen, str) else [chosen]
        if bad:
            raise InvalidArgument(f"check_op: {option} contains {bad[0]!r}; expected a sequence drawn from {list(known)}.")
    if opts["isolate"] not in (True, False, "auto"):
        raise InvalidArgument(f"check_op: isolate must be True, False or 'auto'; got {opts['isolate']!r}.")
    budget = opts["budget"]
    if budget is not None and budget != "quick" and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                                     or not budget > 0):
        raise InvalidArgument(f"check_op: budget must be a positive number of seconds or 'quick'; got {budget!r}.")
    if not isinstance(opts["probes"], int) or opts["probes"] < 1:
        raise InvalidArgument(f"check_op: probes must be a positive int; got {opts['probes']!r}.")


# NOTE [Which inputs]
# Floating-point tensor inputs are differentiated. If some of them have requires_grad=True, only those
# are (so an input can be excluded by passing it with requires_grad=False next to ones with True);
# ``wrt=`` overrides both.
def choose_wrt(B, args: list, names: list[str], wrt) -> list[int]:
    """The positions of the inputs to differentiate (NOTE [Which inputs]); ``wrt`` is the option as given."""
    floats = [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "float"]
    if not floats:
        got = ", ".join(f"{n}: {B.describe(a)}" for n, a in zip(names, args))
        raise InvalidArgument(
            f"check_op: inputs has no floating-point tensor (got {got}), so there is no gradient to check. "
            f"Pass at least one floating-point tensor input (for example x.float())."
        )
    if wrt is None:
        # a bias-only audit is check_op(fn, x, w, b.requires_grad_()); a 0-dim float (a temperature) is differentiated
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


# NOTE [Budget]
# ``budget=`` bounds the audit's time: the given inputs always get the gradient suite; then the argument regimes
# (what no other tool explores), the other regimes, mutation, aliasing and composition run in that order while time
# is left, and whatever the budget did not reach is listed as skipped ("budget spent"), never as passed.
# ``budget="quick"`` is QUICK_FACTOR times what the given inputs' gradient suite took (about gradcheck's own cost on
# small inputs: a full Jacobian in float64).
QUICK_FACTOR = 1.5


class _Audit:
    """The stages of one audit, in order: the given inputs, then the memory stage (mutation, aliasing, the framework's
    own checks, opcheck, composition) and the regime stage (the regimes first under a budget); then the report. The
    checks themselves are the classes ``GradientSuite`` runs and ``RegimeStage`` repeats per regime."""

    def __init__(self, B, fn, args, reference, opts, probes_given: bool = False):
        self.out = Outcome()
        kwargs = dict(opts["kwargs"] or {})
        args = list(args)
        names = B.parameter_names(fn, len(args))
        defaults = B.signature_defaults(fn)
        self.op = Subject(B, fn, reference, opts, args, kwargs, choose_wrt(B, args, names, opts["wrt"]), names, defaults)
        arguments = discover_arguments(B, fn, args, kwargs)
        vary = check_vary(opts["vary"], arguments, B.op_name(fn))
        iso = opts["isolate"]
        isolate = can_fork() and (looks_compiled(fn) if iso == "auto" else bool(iso))
        if iso is True and not can_fork():
            self.out.notes.append("isolate=True: this platform has no os.fork, regimes run in this process")
        elements = sum(B.numel(args[i]) for i in self.op.wrt)  # differentiated, in the given inputs
        if not probes_given:
            self._one_probe_for_large_inputs(elements)
        self.runs = OpRuns(self.op, EffectivePrecision(self.op, self.out.notes))  # its cotangents: probes= after the cut
        self.suite = GradientSuite(self.op, self.runs)
        self.regimes = RegimeStage(self.op, self.out, self.suite, isolate, arguments, vary, elements)

    # what ``framework_checks`` read of the audit: ``(audit, base_run)`` (NOTE [One audit engine] in ``adapter_base``):
    # the Subject's B, fn, args, kwargs, wrt, names, opts and floor_scales, and the findings so far
    findings = property(lambda self: self.out.findings)

    def __getattr__(self, name: str) -> Any:
        if name == "op":  # not set yet
            raise AttributeError(name)
        return getattr(self.op, name)

    def _one_probe_for_large_inputs(self, n: int) -> None:
        """NOTE [Large inputs]: every probe is a float64 cotangent, VJP and gradient of the input's size in every
        regime; past LARGE_INPUT_ELEMENTS differentiated elements (the full Jacobian is long out of reach there) one
        random cotangent and one random direction per regime still catch a wrong VJP, for less memory and time
        (``sin(x) * x``, every check group, 16 MiB float32 input: peak RSS above the interpreter's 77x -> 61x the
        input, 33 -> 18 s on a busy 2-core CPU, against 3 cotangents). Called before ``OpRuns`` is built, which
        reads ``probes`` for its cotangents. ``probes=`` set by the caller is kept."""
        if n > LARGE_INPUT_ELEMENTS and self.op.opts["probes"] > 1:
            self.op.opts = {**self.op.opts, "probes": 1}
            self.out.notes.append(f"{n} differentiated elements: one random cotangent and one random direction per check "
                                  f"(probes=1) to bound memory and time; pass probes=3 for more")

    def run(self) -> OpReport:
        t0 = time.perf_counter()
        groups = set(self.op.opts["checks"])
        base = self._given_stage(groups)
        if base is None:
            return self._report(t0)

        # NOTE [What a backend cannot check]: an adapter lists the check groups and regimes its framework has no
        # means for (``unsupported``: name -> why); they are reported as skipped with that reason, never as passed.
        unsupported = getattr(self.op.B, "unsupported", {})
        for group in sorted(groups & set(unsupported)):
            self.out.checks.append(CheckResult(group, "given", "skip", unsupported[group]))
        groups -= set(unsupported)

        budget = self.op.opts["budget"]
        deadline = None if budget is None else \
            t0 + (QUICK_FACTOR * (time.perf_counter() - t0) if budget == "quick" else float(budget))
        if deadline is not None:  # NOTE [Budget]: the regimes first, the audits of the op's memory after them
            self.regimes.run(groups, unsupported, base, t0, deadline)
            if time.perf_counter() > deadline:
                for group in ("mutation", "aliasing", "composition"):
                    if group in groups:
                        self.out.checks.append(CheckResult(group, "given", "skip", budget_spent(budget)))
                return self._report(t0)
        self._memory_stage(groups, base)
        if deadline is None:
            self.regimes.run(groups, unsupported, base, t0, None)
        return self._report(t0)

    def _given_stage(self, groups: set) -> Run | None:
        """The gradient suite on the given inputs; None when fn raised there (the finding is recorded)."""
        op, out = self.op, self.out
        try:
            base = self.suite.run(op.args, "given", Spec(), linearity="gradient" in groups, seed_offset=0)
        except ReferenceRaised as exc:
            err = exc.raised.error
            raise InvalidArgument(
                f"check_op: reference raised {type(err).__name__} in its {exc.raised.phase} on the given inputs "
                f"({str(err)[:200]}); the reference must run on the inputs fn is checked on."
            ) from err
        except OpRaised as exc:
            out.findings.append(raised_finding(op, exc, "given"))
            out.checks.append(CheckResult("op.raised", "given", "fail", exc.phase))
            return None
        out.notes += base.notes
        if "gradient" in groups:
            out.checks += base.checks
            if base.failures:
                small = self.suite.shrink(op.args, Spec(), base.failures, 0)
                text = repro(op, small, None)
                for f in base.failures:
                    f.repro = text
                out.findings += base.failures
        return base

    def _memory_stage(self, groups: set, base: Run) -> None:
        """The audits of what fn does to memory and in composition: mutation, aliasing, the framework's own checks,
        torch.library's opcheck, composition."""
        op, out = self.op, self.out
        if "mutation" in groups or "aliasing" in groups:
            found, checks = audit_mutation(op.B, op.fn, op.args, op.kwargs, op.wrt, op.names, base.U[0])
            keep = lambda c: c.split(".")[0] in groups
            out.findings += [f for f in found if keep(f.check)]
            out.checks += [c for c in checks if keep(c.check)]
            self.runs.repeatable = any(c.check == "mutation.backward_not_repeatable" and c.status == "pass" for c in checks)

        # framework-specific checks (Paddle's unchecked PyLayer saved tensors, MindSpore's bprop and graph mode)
        for framework_check in getattr(op.B, "framework_checks", ()):
            out.add(*framework_check(self, base))

        if "mutation" in groups and op.B.opcheck:
            from .torch_ops import audit_opcheck, is_library_op

            if is_library_op(op.fn):
                found, checks, notes = audit_opcheck(op.B, op.fn, op.args, op.kwargs, op.wrt)
                if any(f.check == "opcheck.schema" for f in found):
                    # the write bumped the version, but the schema calls the input read-only: not "declared"
                    out.findings = [f for f in out.findings if f.check != "mutation.input_write"]
                out.add(found, checks, notes)

        if "composition" in groups:
            out.add(*audit_composition(op.B, op.fn, op.args, op.kwargs, op.wrt, op.names, base.U[0],
                                       base.lin_d.out_names, out.notes))

    def _report(self, t0: float) -> OpReport:
        op, B = self.op, self.op.B
        report = OpReport(
            op=op.opts["name"] or B.op_name(op.fn),
            backend=getattr(B, "label", B.name),
            inputs=[f"{n}: {B.describe(a)}{' (differentiated)' if i in op.wrt else ''}" for i, (n, a) in enumerate(zip(op.names, op.args))],
            reference=B.op_name(op.reference) if op.reference is not None else None,
            findings=verdict_order(self.out.findings),
            checks=self.out.checks,
            notes=list(dict.fromkeys(self.out.notes)),  # each note once, in order
            options={k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in op.opts.items() if k != "kwargs"} | {"kwargs": {k: repr(v) for k, v in op.kwargs.items()}},
        )
        B.reword(report)
        report.elapsed_s = time.perf_counter() - t0
        return report


# here rather than in a module of its own: tests/fast/test_check_tolerances.py allows its 2^-40 jitter in audit.py
class EffectivePrecision:
    """The precision fn computes in on float64 inputs (NOTE [Effective precision]), found once per audit on the first
    float64 run (the given inputs'); its note goes to ``notes``."""

    def __init__(self, op: Subject, notes: list[str]):
        self.op = op
        self.notes = notes
        self.dtype: str | None = None

    def of(self, args, run: Run) -> str:
        """The precision fn really computes in when fed float64 (see NOTE [Effective precision])."""
        op = self.op
        if self.dtype is not None:
            return self.dtype
        self.dtype = "float64"
        rng = np.random.default_rng(op.opts["seed"] + 7)
        jittered = list(op.to64(args))
        for i in op.wrt:
            v = op.B.to_numpy(jittered[i])
            jittered[i] = op.B.with_values(jittered[i], v * (1.0 + 2.0**-40 * rng.standard_normal(v.shape)) + 2.0**-60)
        try:
            lin = op.B.linearize(op.fn, jittered, op.kwargs, op.wrt)
            values = list(lin.outputs) + list(lin.pullback([np.asarray(u) for u in run.U[0]]))
        except OpRaised:
            return self.dtype
        flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values]) if values else np.zeros(0)
        flat = flat[np.isfinite(flat) & (flat != 0)]
        if flat.size == 0:
            return self.dtype
        for dt in ("bfloat16", "float16", "float32"):
            if np.array_equal(op.B.round_to(flat, dt), flat):
                self.dtype = dt
                self.notes.append(
                    f"fn computes in {dt} on float64 inputs (every output and gradient of a float64 run is exactly a "
                    f"{dt} value, as with a Triton kernel that upcasts to float32 only): float64 checks use {dt} tolerances")
                break
        if self.dtype == "float64" and self._blind_to_float64_steps(run, args, jittered, lin):
            self.dtype = "float32"
            self.notes.append(
                "fn computes partly in float32 on float64 inputs (its float64 outputs do not follow a 2^-40 step of the "
                "inputs the way its own backward says they should, as with a kernel that loads float64 and does part "
                "of its math in float32): float64 checks use float32 tolerances")
        return self.dtype

    def _blind_to_float64_steps(self, run: Run, args, jittered, lin_jittered) -> bool:
        """Whether the float64 outputs miss part of a step no float32 can hold (NOTE [Effective precision]): a float64
        op moves <u, f(x + s) - f(x)> in proportion to the step, up to rounding (at the 2^-40 step) and curvature (at
        the 2^-12 one), both far below ``effective_precision.missed``."""
        op = self.op
        base = op.to64(args)
        stretch = 2.0**28
        longer = list(base)
        step = {}
        for i in op.wrt:
            x0 = op.B.to_numpy(base[i])
            step[i] = op.B.to_numpy(jittered[i]) - x0
            longer[i] = op.B.with_values(base[i], x0 + stretch * step[i])
        try:
            lin_long = op.B.linearize(op.fn, longer, op.kwargs, op.wrt)
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


def run_check_op(B, fn: Callable, inputs: tuple, reference, options: dict) -> OpReport:
    check_options(options)
    opts = {**DEFAULT_OPTIONS, **options}
    check_callables(fn, inputs, reference, opts)
    check_values(opts)
    with B.audit_threads(inputs):
        return _Audit(B, fn, inputs, reference, opts, probes_given="probes" in options).run()
