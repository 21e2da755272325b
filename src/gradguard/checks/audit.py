"""``check_op``: the op audit. Orchestrates gradient, regime, mutation, aliasing and composition checks, and makes the
last three (NOTE [Silent writes], NOTE [Composition]).

# NOTE [The audit's parts]
# ``_Audit`` runs the stages; each check is a class with one ``compare`` that is handed what it reads (the ``Subject``:
# adapter, fn, reference, options, current inputs; a regime's ``Suite``, which takes its results):
#   gradient_numerical (finite differences, surrogate, forward/gradient.reference, precision, nonfinite, linearity)
#   regime_stage (which regimes, budget, slice; one regime's checks in report order or its layout check; isolation;
#                 reproducers)
#   runs (what the checks share, numerics; OpRuns: the op's and the reference's runs)
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
from typing import Any, Callable, Sequence

import numpy as np

from .._errors import InvalidArgument
from .adapter_base import OpRaised
from .regime_stage import (LARGE_INPUT_ELEMENTS, RegimeStage, budget_spent, can_fork, looks_compiled, raised_finding,
                           repro)
from .regimes import REGIME_NAMES, Spec, check_vary, discover_arguments
from .report import CheckResult, Failure, OpReport, verdict_order
from .runs import EPS64, OpRuns, Outcome, ReferenceRaised, Run, Subject, absdot, compare, dot
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
            f"Keyword arguments for fn itself go in kwargs={{...}}.")


def check_callables(fn, inputs: tuple, reference, opts: dict) -> None:
    for name, value, expected in (
            ("fn", fn, "callable (a function, autograd.Function.apply, a torch.library op or a module)"),
            ("reference", reference, "callable or None"),
            ("surrogate", opts["surrogate"], "callable (a function with fn's signature whose gradient is the intended "
                                             "one) or None")):
        if not callable(value) and (value is not None or name == "fn"):
            raise InvalidArgument(f"check_op: {name} must be {expected}; got {_type_name(value)}.")
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
            f"Pass at least one floating-point tensor input (for example x.float()).")
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
                f"floating-point inputs are at {floats}.")
    return wrt


# NOTE [Budget]
# ``budget=`` bounds the audit's time: the given inputs always get the gradient suite; then the argument regimes
# (what no other tool explores), the other regimes, mutation, aliasing and composition run in that order while time
# is left, and whatever the budget did not reach is listed as skipped ("budget spent"), never as passed.
# ``budget="quick"`` is QUICK_FACTOR times what the given inputs' gradient suite took (about gradcheck's own cost on
# small inputs: a full Jacobian in float64).
QUICK_FACTOR = 1.5


# NOTE [Silent writes]
# PyTorch's in-place checks rely on version counters, which only PyTorch ops bump. A Triton/CUDA kernel
# (or a ``.data`` write) that stores into an input changes its bytes and leaves its version alone, so
# any op that saved that tensor computes wrong gradients without an error. The audit fingerprints every
# tensor input (bytes and version) before forward, after forward and after backward:
#   bytes changed, version not  -> ``mutation.silent_input_write`` (failure)
#   version changed              -> ``mutation.input_write`` (warning: declared, autograd can see it)
# Backward gets a random cotangent twice with ``retain_graph``: the two gradients must agree
# (``mutation.backward_not_repeatable``, e.g. a backward that scales its saved tensor in place), and the
# cotangent's own bytes must not change (``mutation.grad_output_write``: autograd may hand the same
# buffer to other branches).
#
# NOTE [Composition]
# An op that is correct in isolation can still break the graph around it: if its forward writes into
# its input (a gradient stored "in place" to save memory, as Liger-Kernel's cross entropy does), the
# producer of that input loses the output it saved for backward. For each producer (exp, sigmoid,
# softmax, relu) the producer's input gradient is computed twice: once with the op fed the producer's
# output directly, once fed a private copy of it (the reference path: the same op, so any difference
# is the producer's corrupted saved output, not the op's own gradient, which other checks judge).
# The private-copy run is skipped when the producer's output kept its bytes and version through the op's forward
# and the whole backward: the producer then read what it saved, so both runs compute the same gradient (for an
# op whose backward is deterministic; run-to-run noise of a nondeterministic backward is not compared).
def _snapshot(B, fed) -> dict[int, tuple[int, int]]:
    return {i: (B.version(t), B.fingerprint(t)) for i, t in enumerate(fed) if B.is_tensor(t)}


def _diff(op: Subject, fed, before, after, phase) -> list[Failure]:
    names = op.names
    found = []
    for i, (ver0, fp0) in before.items():
        ver1, fp1 = after[i]
        if ver1 == ver0 and fp1 != fp0:
            found.append(Failure(
                check="mutation.silent_input_write", regime="given", input=names[i],
                message=f"the op's {phase} changed the bytes of input {names[i]} ({op.B.describe(fed[i])}) without "
                        f"bumping its version ({ver0})",
                why="PyTorch cannot see this write: any earlier op that saved this tensor for its backward "
                "(exp, sigmoid, softmax, relu, tanh... save their outputs) now computes wrong gradients "
                "silently. Typical cause: a Triton/CUDA kernel that stores results (often gradients) into "
                "its input to save memory.",
                fix="write into a fresh buffer (or a clone of the input) in forward; if the in-place write is "
                "intended, call torch.autograd.graph.increment_version(x) (or ctx.mark_dirty(x)) right after the "
                "kernel so PyTorch raises instead of computing wrong gradients."))
        elif ver1 != ver0:
            found.append(Failure(
                check="mutation.input_write", regime="given", input=names[i], severity="warning",
                message=f"the op's {phase} wrote input {names[i]} in place (version {ver0} -> {ver1})",
                why="a declared in-place write: PyTorch will raise if a saved tensor was overwritten, so this is "
                "safe but callers must not reuse the input's old values.",
                fix="nothing, if the op is documented as in-place."))
    return found


def audit_mutation(op: Subject, cotangent: Sequence[np.ndarray]) -> tuple[list[Failure], list[CheckResult]]:
    B, regime = op.B, "given"
    findings: list[Failure] = []
    fed, leaves = B.prepare(op.args, op.wrt)
    before = _snapshot(B, fed)
    lin = B.linearize(op.fn, op.args, op.kwargs, op.wrt, prepared=(fed, leaves))
    after_fwd = _snapshot(B, fed)
    findings += _diff(op, fed, before, after_fwd, "forward")
    findings += _alias_failures(op, lin, fed)
    checks = [CheckResult("aliasing.output_aliases_input", regime,
                          "fail" if any(f.check.startswith("aliasing") for f in findings) else "pass")]
    cots = lin.cotangent_tensors(cotangent)
    cot_fp = [B.fingerprint(c) for c in cots]
    g1 = [B.to_numpy(g) for g in B.vjp_tensors(lin, cots)]
    findings += _diff(op, fed, after_fwd, _snapshot(B, fed), "backward")
    findings += [Failure(
        check="mutation.grad_output_write", regime=regime, input=lin.out_names[k],
        message=f"backward wrote into the upstream gradient of {lin.out_names[k]} ({B.describe(c)})",
        why="autograd may hand the same gradient buffer to several functions (e.g. when an output is "
        "used twice); writing into it corrupts the other branches' gradients.",
        fix="compute into a new tensor (grad_output * x instead of grad_output.mul_(x)).")
        for k, (c, fp) in enumerate(zip(cots, cot_fp)) if B.fingerprint(c) != fp]
    findings += _repeat_failures(op, lin, cotangent, g1)
    failed = {f.check for f in findings if f.severity == "failure"}
    checks += [CheckResult(name, regime, "fail" if name in failed else "pass") for name in
               ("mutation.silent_input_write", "mutation.grad_output_write", "mutation.backward_not_repeatable")]
    return findings, checks


def _alias_failures(op: Subject, lin, fed) -> list[Failure]:
    """Outputs that share memory with an input without autograd knowing they are views."""
    B, names = op.B, op.names
    found = []
    spans = {i: B.memory_span(t) for i, t in enumerate(fed) if B.is_tensor(t)}
    for out_name, out in lin.all_outputs:
        span = B.memory_span(out)
        if span is None:
            continue
        for i, s in spans.items():
            if s is None or not (span[0] < s[1] and s[0] < span[1]) or B.autograd_view_of(out, fed[i]):
                continue
            found.append(Failure(
                check="aliasing.output_aliases_input", regime="given", input=names[i],
                message=f"{out_name} ({B.describe(out)}) shares memory with input {names[i]}, and autograd does not know it is a view",
                why="writes to the output silently change the input (and vice versa); autograd's view "
                "tracking and version checks do not cover this alias.",
                fix="return a new tensor (out.clone()), or return a real view created with view/reshape ops so "
                "autograd tracks it."))
    return found


def _max_abs(a: np.ndarray) -> float:
    return float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0))


def _repeat_failures(op: Subject, lin, cotangent, g1) -> list[Failure]:
    """A second backward with the same upstream gradient must succeed and agree with the first (``g1``)."""
    found = []
    try:
        g2 = lin.pullback(cotangent)
    except Exception as exc:  # e.g. PyTorch's own "modified by an inplace operation" on the second backward
        g2 = []
        found.append(Failure(
            check="mutation.backward_not_repeatable", regime="given",
            message=f"a second backward through the same graph (retain_graph=True) raised {type(exc).__name__}: {str(exc)[:300]}",
            why="backward changed a tensor it saved (an in-place op on ctx.saved_tensors), so the graph cannot "
            "be differentiated twice (double backward, gradient penalties, retain_graph loops).",
            fix="keep saved tensors read-only in backward: compute into new tensors instead of in place."))
    for i, (a, b) in enumerate(zip(g1, g2)):
        eps = op.B.eps(op.B.dtype_name(lin.leaves[i]))
        m = compare(b, a, TOLERANCES["mutation.backward_not_repeatable"].of(eps) * _max_abs(a))
        if not m.ok:
            name = op.names[op.wrt[i]]
            found.append(Failure(
                check="mutation.backward_not_repeatable", regime="given", input=name,
                message=f"a second backward with the same upstream gradient (retain_graph=True) gives a different gradient for {name}",
                max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                where=f"{name}{list(m.index or ())}: first backward {m.expected:.6g}, second {m.got:.6g}",
                why="backward changed a tensor it saved (for example scaled the saved gradient in place by "
                "grad_output): every later backward through the same graph is wrong.",
                fix="keep saved tensors read-only in backward; compute grad_input = saved * grad_output into a "
                "new tensor."))
    return found


def _grad_through(op: Subject, i, producer, isolate, cotangent, out_names):
    B = op.B
    leaf, y = B.call_producer(producer, op.args[i], isolate)
    fed = [B.clone(a) if B.is_tensor(a) else a for a in op.args]
    fed[i] = y
    y_version, y_fp = B.version(y), B.fingerprint(y)
    outs = dict(B.run_graph(op.fn, fed, op.kwargs))
    chosen = [outs[n] for n in out_names if n in outs]
    cots = [B.from_numpy(c, o) for c, o in zip(cotangent, chosen)]
    silent = B.version(y) == y_version and B.fingerprint(y) != y_fp
    grad = B.grad_of(chosen, leaf, cots)
    # the producer's saved output is y: unchanged through the op's forward and the whole backward, the producer
    # read what it saved, and the run with a private copy would compute the same gradient (NOTE [Composition])
    untouched = not silent and B.version(y) == y_version and B.fingerprint(y) == y_fp
    return grad, silent, untouched


def audit_composition(op: Subject, base: Run, notes: list[str]) -> tuple[list[Failure], list[CheckResult]]:
    B, args, names, regime = op.B, op.args, op.names, "given"
    cotangent, out_names = base.U[0], base.lin_d.out_names
    findings: list[Failure] = []
    checks: list[CheckResult] = []
    for pname, producer in B.producers().items():
        check = f"composition.{pname}"
        status = "pass"
        for i in op.wrt:
            if B.numel(args[i]) == 0:
                continue
            try:
                g_direct, silent, untouched = _grad_through(op, i, producer, False, cotangent, out_names)
                if untouched:
                    continue
                g_ref, _, _ = _grad_through(op, i, producer, True, cotangent, out_names)
            except Exception as exc:  # the op may reject the producer's value range (e.g. relu's zeros)
                notes.append(f"{check} on {names[i]} skipped: fn raised {type(exc).__name__}: {exc}")
                continue
            eps = B.eps(B.dtype_name(args[i]))
            m = compare(g_direct, g_ref, TOLERANCES["composition"].of(eps) * _max_abs(g_ref))
            if m.ok:
                continue
            status = "fail"
            cause = (f"the op's forward wrote into {pname}'s output (bytes changed, version unchanged), which {pname} "
                     f"saved for its backward" if silent
                     else f"running the op on {pname}'s output directly changes {pname}'s gradient")
            findings.append(Failure(
                check=check, regime=regime, input=names[i],
                message=f"gradient through {pname}({names[i]}) -> op is wrong: {cause}",
                max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                where=f"d/d a{list(m.index or ())} of op({pname}(a)): {m.got:.6g}, with a private copy {m.expected:.6g}",
                why="an op that overwrites its input corrupts whatever saved that tensor; losses still match, "
                "gradients are silently wrong.",
                fix="do not write into the input in forward (allocate the output/gradient buffer, or clone); "
                f"until then callers can pass {names[i]}.clone().",
                repro=f"a = {names[i]}.detach().requires_grad_()\nop({pname}(a), ...).backward(u)   # vs op({pname}(a).clone(), ...)"))
            break
        checks.append(CheckResult(check, regime, status))
    return findings, checks


class _Audit:
    """The stages of one audit, in order: the given inputs, then the memory stage (mutation, aliasing, the framework's
    own checks, opcheck, composition) and the regime stage (the regimes first under a budget); then the report. The
    checks themselves are the classes ``RegimeStage.suite`` runs, on the given inputs and per regime."""

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
        self.regimes = RegimeStage(self.op, self.out, self.runs, isolate, arguments, vary, elements)

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
            base = self.regimes.suite(op.args, "given", Spec(), linearity="gradient" in groups, seed_offset=0)
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
                small = self.regimes.shrink(op.args, Spec(), base.failures, 0)
                text = repro(op, small, None)
                for f in base.failures:
                    f.repro = text
                out.findings += base.failures
        return base

    def _memory_stage(self, groups: set, base: Run) -> None:
        """What fn does to memory and to its producers: mutation, aliasing, framework checks, opcheck, composition."""
        op, out = self.op, self.out
        if "mutation" in groups or "aliasing" in groups:
            found, checks = audit_mutation(op, base.U[0])
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
                found, checks, notes = audit_opcheck(op)
                if any(f.check == "opcheck.schema" for f in found):
                    # the write bumped the version, but the schema calls the input read-only: not "declared"
                    out.findings = [f for f in out.findings if f.check != "mutation.input_write"]
                out.add(found, checks, notes)

        if "composition" in groups:
            out.add(*audit_composition(op, base, out.notes))

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
            options={k: (list(v) if isinstance(v, (tuple, set)) else v) for k, v in op.opts.items() if k != "kwargs"} | {"kwargs": {k: repr(v) for k, v in op.kwargs.items()}})
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
        for i in op.wrt:
            x0 = op.B.to_numpy(base[i])
            longer[i] = op.B.with_values(base[i], x0 + stretch * (op.B.to_numpy(jittered[i]) - x0))
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
        ulp64 = TOLERANCES["effective_precision.rounding"].of(EPS64)
        for u in run.U:
            seen, predicted = dot(u, short), dot(u, long) / stretch
            scale = absdot(u, long) / stretch
            if not (np.isfinite(seen) and np.isfinite(predicted)) or scale < TOLERANCES["effective_precision.min_scale"]:
                return False
            rounding = ulp64 * (absdot(u, outputs) + absdot(u, lin_jittered.outputs))
            worst = max(worst, (abs(seen - predicted) - rounding) / scale)
        return worst > TOLERANCES["effective_precision.missed"]


def run_check_op(B, fn: Callable, inputs: tuple, reference, options: dict) -> OpReport:
    check_options(options)
    opts = {**DEFAULT_OPTIONS, **options}
    check_callables(fn, inputs, reference, opts)
    check_values(opts)
    with B.audit_threads(inputs):
        return _Audit(B, fn, inputs, reference, opts, probes_given="probes" in options).run()
