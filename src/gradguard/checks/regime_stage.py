"""The regime stage of ``check_op``: which regimes run and how (NOTE [Budget], NOTE [Same inputs, one run], NOTE
[Large inputs], NOTE [Isolated regimes]), one regime's gradient suite or layout check and what it adds to the audit;
the reproducer printed under a finding, and the ``op.raised`` finding for an op that crashed.

# NOTE [Isolated regimes]
# A regime derives inputs (another batch size, another feature dim, indices rewritten); a compiled kernel without
# bounds checks that gets inputs whose relations it assumes (MoE routing indices into the tokens) writes out of
# bounds and the process dies with SIGSEGV, taking the user's test run and the whole report with it. With
# ``isolate=True`` (or ``"auto"`` for an op that looks compiled: a ``torch.library`` op, or code that holds Triton
# kernels) every value regime runs in a forked child; what it found comes back pickled through a pipe, and a child
# killed by a signal becomes a failure of that regime naming the signal. Only on platforms with ``os.fork``.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import os
import pickle
import signal
import sys
import time
from typing import Any, Callable

import numpy as np

from ..core.internal import log_fallback
from .adapter_base import OpRaised
from .gradient_numerical import ForwardReference, GradientReference, LinearityCheck, NumericalCheck, PrecisionCheck
from .regimes import Regime, Spec, build_regimes, shrink_candidates
from .report import CheckResult, Failure
from .runs import (Check, Mismatch, NotApplicable, OpRuns, Outcome, ReferenceRaised, Run, Subject, compare,
                   scale)
from .tolerances import TOLERANCES

__all__ = ["RegimeStage", "LayoutCheck", "LARGE_INPUT_ELEMENTS", "budget_spent", "repro",
           "raised_finding", "can_fork", "looks_compiled", "run_forked"]

LARGE_INPUT_ELEMENTS = 1 << 20  # NOTE [Large inputs]


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin"


def looks_compiled(fn: Callable) -> bool:
    """A ``torch.library`` op, or a function whose module holds Triton kernels (NOTE [Isolated regimes])."""
    if type(fn).__module__.startswith("torch._ops"):
        return True
    owner = getattr(fn, "__self__", None)
    for obj in (fn, owner if isinstance(owner, type) else None):
        module = inspect.getmodule(obj) if obj is not None else None
        if module is not None and any(type(v).__module__.startswith("triton") for v in vars(module).values()):
            return True
    return False


def run_forked(work: Callable[[], Any]) -> tuple[str, Any]:
    """``work()`` in a forked child: ("ok", its result), ("raised", the exception), or ("crashed", a description)."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read)
            import faulthandler

            faulthandler.disable()  # the parent reports the crash; no second traceback on the user's stderr
            try:
                payload = pickle.dumps(("ok", work()))
            except BaseException as exc:  # noqa: BLE001 - sent to the parent, which decides
                try:
                    payload = pickle.dumps(("raised", exc))
                except Exception as unpicklable:  # the child's error, as text the parent can read
                    payload = pickle.dumps(("raised", RuntimeError(f"{type(exc).__name__}: {exc} "
                                                                   f"(not picklable: {unpicklable!r})")))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        except BaseException as error:  # noqa: BLE001 - the child must reach os._exit; the parent reports code 3
            log_fallback("checks.isolate", "sending the child's result", error)
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return "crashed", f"the process running it was killed by {name}"
    if not data:
        return "crashed", f"the process running it exited with status {os.WEXITSTATUS(status)} without a result"
    return pickle.loads(data)


class LayoutCheck(Check):
    """A layout regime's outputs and first-cotangent gradients against the given inputs' run."""

    def compare(self, regime: Regime, base: Run) -> tuple[list[Failure], list[CheckResult]]:
        op = self.op
        reshaped = regime.spec.reshaped
        try:
            lin = op.B.linearize(op.fn, regime.args, op.kwargs, op.wrt)
        except OpRaised:
            if reshaped:  # an op written for one rank may reject another: not a finding
                raise NotApplicable("fn does not accept the inputs in that shape")
            raise
        outs = {n: o for n, o in zip(lin.out_names, lin.outputs)}
        if reshaped:
            # NOTE [Same values, another shape]: the regime is only a test of the backward when fn's forward treats
            # the inserted dimension as a batch dimension (outputs equal once reshaped); otherwise fn gives that
            # shape another meaning (a rank-specific op) and the regime does not apply.
            outs = self._reshaped_like(outs, base)
            if outs is None:
                raise NotApplicable("fn gives the reshaped inputs another meaning (its outputs change, not only their shape)")
        found = []
        for what, got, expected, dt, floor in self._pairs(lin, outs, base, reshaped):
            if got is None:
                continue
            m = compare(got, expected, self._same_values_allowed(dt, base, expected) + floor)
            if not m.ok:
                found.append(self._failure(regime, what, m))
        return found, [CheckResult(f"regime.{regime.name}", regime.name, "fail" if found else "pass")]

    def _pairs(self, lin, outs: dict, base: Run, reshaped: bool) -> list[tuple]:
        """(what, the layout regime's value, the given run's, dtype, floor) for every output and gradient."""
        op = self.op
        g = lin.pullback([np.asarray(u).reshape(np.shape(o)) if np.size(u) == np.size(o) else u
                          for u, o in zip(base.U[0], lin.outputs)]) \
            if set(outs) == set(base.lin_d.out_names) else None
        if g is not None and reshaped:
            g = [np.asarray(gi).reshape(np.shape(base.g_d[0][i])) for i, gi in enumerate(g)]
        pairs = [(n, outs.get(n), o, dt, 0.0) for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes)]
        if g is not None:
            pairs += [(f"gradient of {op.names[op.wrt[i]]}", g[i], base.g_d[0][i], op.dtype(i),
                       op.floor(i, base, op.dtype(i))) for i in range(len(op.wrt))]
        return pairs

    @staticmethod
    def _failure(regime: Regime, what: str, m: Mismatch) -> Failure:
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

    def _same_values_allowed(self, dt: str, base: Run, expected) -> float:
        """What the same computation on the same values may differ by in another layout: ``regime.layout`` x max|value|."""
        dt = base.precision_of(dt)
        return TOLERANCES["regime.layout"].at(dt, self.op.B.eps(dt)) * scale(expected)

    def _reshaped_like(self, outs: dict, base: Run) -> dict | None:
        """The regime's outputs reshaped to the given run's, or None when their values differ."""
        shaped = {}
        for n, o, dt in zip(base.lin_d.out_names, base.lin_d.outputs, base.lin_d.out_dtypes):
            got = outs.get(n)
            if got is None or np.size(got) != np.size(o):
                return None
            got = np.asarray(got).reshape(np.shape(o))
            if not compare(got, o, self._same_values_allowed(dt, base, o)).ok:
                return None
            shaped[n] = got
        return shaped


def budget_spent(budget) -> str:
    return f"budget spent (budget={budget!r}); pass a larger budget, or none, to run it"


def repro(op: Subject, args, regime: Regime | None) -> str:
    """The inputs as source (or described, when too large) and the ``check_op`` call that reproduces a finding."""
    B = op.B
    lines = []
    for name, a in zip(op.names, args):
        if not B.is_tensor(a):
            lines.append(f"{name} = {a!r}")
        elif B.numel(a) <= 64:
            lines.append(f"{name} = {B.literal(a)}")
        else:
            v = B.to_numpy(a)
            lines.append(f"{name}: {B.describe(a)}, values in [{v.min():.4g}, {v.max():.4g}] "
                         f"(too large to print; the {regime.name if regime else 'given'} regime of your inputs, seed={op.opts['seed']})")
    if regime is not None and regime.spec.layout:
        lines.append(f"# then: {regime.description}")
    call = ", ".join(op.names)
    kw = ", ".join(f"{k}={v!r}" for k, v in op.kwargs.items())
    lines.append(f"gradguard.check_op(fn, {call}{', kwargs=dict(' + kw + ')' if kw else ''}{', reference=reference' if op.reference else ''})")
    return "\n".join(lines)


def raised_finding(op: Subject, exc: OpRaised, regime: str) -> Failure:
    err = exc.error
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = None if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
    return Failure(check="op.raised", regime=regime,
                   message=f"fn's {exc.phase} raised {type(err).__name__}: {str(err)[:300]}"
                           + (f" (inputs: {exc.dtype})" if exc.dtype else ""),
                   where=where,
                   why=("the op runs with autograd on but crashes with it off (evaluation loops, finite differences): "
                        "a branch for inputs that do not require grad." if exc.autograd_off else
                        f"the op fails on the inputs as given, so no gradient can be checked; every other check "
                        f"depends on a {exc.phase} that runs."),
                   fix=f"fix the {exc.phase} (the line above is where it raised), then re-run check_op.",
                   repro=repro(op, op.args, None))


class RegimeStage:
    def __init__(self, op: Subject, out: Outcome, runs: OpRuns, isolate: bool, arguments, vary, elements: int):
        self.op = op
        self.out = out
        self.runs = runs
        self.isolate = isolate
        self.arguments = arguments
        self.vary = vary
        self.elements = elements  # differentiated, in the given inputs

    def suite(self, args, regime: str, spec: Spec, linearity: bool, seed_offset: int) -> Run:
        """One regime's gradient suite (the given inputs' too), in report order."""
        op = self.op
        s = self.runs.of_op(args, regime, spec, seed_offset)
        if op.reference is not None:
            self.runs.of_reference(s)
            ForwardReference(op).compare(s)
        # gradient.reference (run before gradient.numerical, listed after it: NOTE [Finite differences as arbiter])
        against_ref = GradientReference(op, self.runs).compare(s)
        NumericalCheck(op, self.runs).compare(s, against_ref[1])
        s.run.checks += against_ref[0]
        s.run.failures += against_ref[1]
        if op.reference is None and spec.precision and s.run.g_64 is not None and not s.all64:
            PrecisionCheck(op).compare(s)
        elif op.reference is None and spec.convention and s.run.g_64 is not None:
            PrecisionCheck(op).compare(s, nonfinite=True)
        if linearity:
            LinearityCheck(op).compare(s)
        return s.run

    def shrink(self, args, spec, failures, seed_offset) -> list[Any]:
        """The smallest variant of ``args`` on which the same checks still fail."""
        if not self.op.opts["shrink"]:
            return args
        wanted = {f.check for f in failures}
        for cand in shrink_candidates(self.op.B, args):
            try:
                run = self.suite(cand, "shrink", spec, linearity="gradient.cotangent_linearity" in wanted or "gradient.zero_cotangent" in wanted, seed_offset=seed_offset)
            except Exception as error:
                log_fallback("checks", "a shrink candidate's gradient suite", error)
                continue
            if wanted & {f.check for f in run.failures}:
                return cand
        return args

    def run(self, groups, unsupported, base, t0: float, deadline: float | None) -> None:
        if "regime" not in groups:
            return
        op, out = self.op, self.out
        full_args = op.args
        try:
            base = self._slice_for_regimes(base)
            selected = set(op.opts["regimes"])
            for name in sorted(selected & set(unsupported)):
                out.checks.append(CheckResult(f"regime.{name}", name, "skip", unsupported[name]))
            regimes, skipped = build_regimes(op.B, op.args, op.wrt, op.kwargs, self.arguments, self.vary,
                                             selected - set(unsupported), op.names)
            for name, why in skipped.items():
                out.checks.append(CheckResult(f"regime.{name}", name, "skip", why))
            if deadline is not None:  # NOTE [Budget]: the argument regimes first
                regimes = _budget_order(regimes)
            given_s = time.perf_counter() - t0
            progress = _Progress(op.opts["name"] or op.B.op_name(op.fn), len(regimes), given_s)
            ran: dict = {}  # NOTE [Same inputs, one run]
            for n, regime in enumerate(regimes, start=1):
                if deadline is not None and time.perf_counter() > deadline:
                    out.checks.append(CheckResult(f"regime.{regime.name}", regime.name, "skip",
                                                  f"{regime.description}: {budget_spent(op.opts['budget'])}"))
                    continue
                progress.step(n, regime.name)
                key = self._regime_key(regime)
                if key is not None and key in ran:
                    self._reuse_regime(regime, *ran[key])
                    continue
                n_checks, n_findings, n_notes = len(out.checks), len(out.findings), len(out.notes)
                self._one(regime, base, n)
                if key is not None:
                    ran[key] = (regime, out.checks[n_checks:], out.findings[n_findings:], out.notes[n_notes:])
            progress.done()
        finally:
            op.args = full_args

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
        B = self.op.B
        contiguous = getattr(B, "is_contiguous", None)
        parts = [(B.dtype_name(a), tuple(B.shape(a)), contiguous(a) if contiguous else None, B.fingerprint(a))
                 if B.is_tensor(a) else ("object", id(a)) for a in regime.args]
        return regime.spec, tuple(regime.wrt) if regime.wrt is not None else None, tuple(parts)

    def _reuse_regime(self, regime: Regime, first: Regime, checks: list[CheckResult], findings: list[Failure],
                      notes: list[str]) -> None:
        """``regime`` has ``first``'s inputs (NOTE [Same inputs, one run]): ``first``'s outcome under ``regime``'s name."""
        out = self.out

        def renamed(check: str) -> str:
            return f"regime.{regime.name}" if check == f"regime.{first.name}" else check

        for c in checks:
            detail = regime.description if c.detail == first.description else c.detail
            out.checks.append(dataclasses.replace(c, check=renamed(c.check), regime=regime.name, detail=detail))
        for f in findings:
            out.findings.append(dataclasses.replace(f, check=renamed(f.check), regime=regime.name,
                                                    message=f.message.replace(first.description, regime.description)))
        out.notes += [n.replace(f"regime.{first.name} ", f"regime.{regime.name} ") for n in notes]
        out.notes.append(f"regime.{regime.name} ({regime.description}) has the same inputs as regime.{first.name} "
                         f"({first.description}): not run again, its result is that run's")

    def _slice_for_regimes(self, base: Run) -> Run:
        """NOTE [Large inputs]: past LARGE_INPUT_ELEMENTS differentiated elements the regimes are derived from the
        first rows of the batch (the leading dimension the inputs share), checked first as inputs of their own,
        so a dozen regimes do not each hold float64 copies of the whole input. Returns the run the regimes are
        compared with (``op.args`` becomes the slice until the regimes are done)."""
        op, out = self.op, self.out
        B, args, n = op.B, op.args, self.elements
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
            run = self.suite(sliced, "batch_slice", Spec(), linearity=False, seed_offset=500)
        except (OpRaised, ReferenceRaised, NotApplicable) as exc:
            out.notes.append(f"the regimes run on the whole inputs: fn on their first {rows} rows raised ({exc})")
            return base
        out.notes += run.notes
        if run.failures:
            text = repro(op, sliced, None)
            for f in run.failures:
                f.repro = text
            given = {(f.check, f.input) for f in out.findings if f.regime == "given"}
            out.findings += [f for f in run.failures if (f.check, f.input) not in given]
        out.checks.append(CheckResult("regime.batch_slice", "batch_slice", "fail" if run.failures else "pass",
                                      f"first {rows} of {b} rows"))
        out.notes.append(f"{n} differentiated elements: the regimes run on the first {rows} of {b} rows (leading "
                         f"dimension) to bound memory and time")
        op.args = sliced
        return run

    def _one(self, regime: Regime, base: Run, n: int):
        """``regime`` against the given inputs' run ``base`` (``n``: its place, which seeds its cotangents)."""
        op = self.op
        saved = (op.kwargs, op.wrt)
        op.kwargs = regime.kwargs if regime.kwargs is not None else op.kwargs
        op.wrt = regime.wrt if regime.wrt is not None else op.wrt
        try:
            if self.isolate and not regime.spec.layout:
                self._forked(regime, base, n)
            else:
                self._inner(regime, base, n)
        finally:
            op.kwargs, op.wrt = saved

    def _forked(self, regime: Regime, base: Run, n: int) -> None:
        """NOTE [Isolated regimes]: the regime in a child process; a crash there is this regime's failure."""
        out = self.out
        counts = len(out.checks), len(out.findings), len(out.notes)

        def work():
            self._inner(regime, base, n)
            return out.findings[counts[1]:], out.checks[counts[0]:], out.notes[counts[2]:]

        status, result = run_forked(work)
        if status == "raised":
            raise result
        if status == "ok":
            out.add(*result)
            return
        check = f"regime.{regime.name}"
        out.findings.append(Failure(
            check=check, regime=regime.name,
            message=f"fn crashed the process on these inputs: {result} ({regime.description})",
            why="a compiled kernel read or wrote out of bounds on inputs whose shapes or indices differ from the given "
                "ones (it trusts relations between its inputs, or sizes, without checking them).",
            fix="check the shapes and index ranges the kernel relies on before launching it (raise a clear error).",
            repro=repro(self.op, regime.args, regime)))
        out.checks.append(CheckResult(check, regime.name, "fail", result))

    def _inner(self, regime: Regime, base: Run, n: int):
        check = f"regime.{regime.name}"
        try:
            if regime.spec.layout:
                found, checks = LayoutCheck(self.op).compare(regime, base)
                for f in found:
                    f.repro = repro(self.op, self.op.args, regime)
                self.out.add(found, checks)
                return
            run = self.suite(regime.args, regime.name, regime.spec, linearity=False, seed_offset=n)
        except (NotApplicable, ReferenceRaised) as exc:
            why = str(exc) if isinstance(exc, NotApplicable) else f"the reference raised on these inputs ({exc})"
            self.out.checks.append(CheckResult(check, regime.name, "skip", f"regime not applicable: {why}"))
            if regime.fallback is not None:
                self._inner(regime.fallback, base, n)
            return
        except OpRaised as exc:
            self._raised(regime, exc)
            return
        self._outcome(regime, run, n)

    def _raised(self, regime: Regime, exc: OpRaised) -> None:
        """fn raised on a regime's inputs: a skip, a failure (the reference handles them) or a warning."""
        out, op = self.out, self.op
        check = f"regime.{regime.name}"
        err = exc.error
        if regime.new_argument and exc.phase.startswith("forward"):
            # NOTE [Argument regimes]: an argument value the op does not support says nothing about its gradients
            out.checks.append(CheckResult(check, regime.name, "skip",
                                          f"fn rejects {regime.argument} ({type(err).__name__}: {str(err)[:120]})"))
            return
        if op.reference is not None:
            try:
                op.B.linearize(op.reference, regime.args, op.kwargs, op.wrt)
            except OpRaised:
                out.checks.append(CheckResult(check, regime.name, "skip",
                                              "regime not applicable: the reference raises on these inputs too"))
                return
            # NOTE [The reference runs, the op raises]: inputs the trusted implementation handles are inputs the op
            # is meant to handle (only a subset requiring grad, a size-1 feature dimension): a failure, with the
            # line it raised at. Without a reference the op may legitimately not support them: a warning.
            out.findings.append(dataclasses.replace(
                raised_finding(op, exc, regime.name), check=check,
                message=f"fn's {exc.phase} raised {type(err).__name__} on inputs the reference handles ({regime.description}): {str(err)[:200]}",
                why=f"the reference computes these inputs, the op's {exc.phase} crashes on them.",
                repro=repro(op, regime.args, regime)))
            out.checks.append(CheckResult(check, regime.name, "fail", type(err).__name__))
            return
        out.findings.append(Failure(check=check, regime=regime.name, severity="warning",
                                    message=f"fn's {exc.phase} raised {type(err).__name__} on these inputs ({regime.description}): {str(err)[:200]}",
                                    why="the op may not support this input (fine if documented) or crashes on it.",
                                    fix="if the op should support it, this is a bug; otherwise exclude the regime with regimes=[...]."))
        out.checks.append(CheckResult(check, regime.name, "warn", type(err).__name__))

    def _outcome(self, regime: Regime, run: Run, n: int) -> None:
        """A value regime's gradient suite ran: its failures, except those the given inputs already showed."""
        out = self.out
        check = f"regime.{regime.name}"
        out.notes += run.notes
        # A bug that already fails on the given inputs fails in most regimes too: report it once.
        given = {(f.check, f.input) for f in out.findings if f.regime == "given"}
        repeated = [f for f in run.failures if (f.check, f.input) in given]
        run.failures = [f for f in run.failures if (f.check, f.input) not in given]
        if repeated and not run.failures:
            out.checks.append(CheckResult(check, regime.name, "fail", "same failures as on the given inputs"))
            out.notes.append(f"{check} fails the same way as the given inputs ({', '.join(sorted({f.check for f in repeated}))}); not repeated")
            return
        if run.failures:
            small = self.shrink(regime.args, regime.spec, run.failures, n)
            text = repro(self.op, small, regime)
            for f in run.failures:
                f.message = f"[{f.check}] {f.message} ({regime.description})"
                if regime.argument:
                    f.message += f"; fails only with {regime.argument}"
                f.check = check
                f.repro = text
            out.findings += run.failures
        out.checks.append(CheckResult(check, regime.name, "fail" if run.failures else "pass", regime.description))


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
    turns = [r for turn in itertools.zip_longest(*by_arg.values()) for r in turn if r is not None]
    return turns + [r for r in regimes if r.arg_name is None]
