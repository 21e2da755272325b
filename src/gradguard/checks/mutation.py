"""Mutation, aliasing and composition audits: what the op writes that it should not, what it returns that it shares,
and what it breaks downstream of producers whose backward reads their saved output.

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
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .numerical import compare
from .report import CheckResult, Failure
from .tolerances import TOLERANCES

__all__ = ["audit_mutation", "audit_composition"]


def _snapshot(B, fed) -> dict[int, tuple[int, int]]:
    return {i: (B.version(t), B.fingerprint(t)) for i, t in enumerate(fed) if B.is_tensor(t)}


def _diff(before, after, phase, names, B, fed, regime) -> list[Failure]:
    found = []
    for i, (ver0, fp0) in before.items():
        ver1, fp1 = after[i]
        if ver1 == ver0 and fp1 != fp0:
            found.append(Failure(
                check="mutation.silent_input_write", regime=regime, input=names[i],
                message=f"the op's {phase} changed the bytes of input {names[i]} ({B.describe(fed[i])}) without bumping its version ({ver0})",
                why="PyTorch cannot see this write: any earlier op that saved this tensor for its backward "
                "(exp, sigmoid, softmax, relu, tanh... save their outputs) now computes wrong gradients "
                "silently. Typical cause: a Triton/CUDA kernel that stores results (often gradients) into "
                "its input to save memory.",
                fix="write into a fresh buffer (or a clone of the input) in forward; if the in-place write is "
                "intended, call torch.autograd.graph.increment_version(x) (or ctx.mark_dirty(x)) right after the "
                "kernel so PyTorch raises instead of computing wrong gradients."))
        elif ver1 != ver0:
            found.append(Failure(
                check="mutation.input_write", regime=regime, input=names[i], severity="warning",
                message=f"the op's {phase} wrote input {names[i]} in place (version {ver0} -> {ver1})",
                why="a declared in-place write: PyTorch will raise if a saved tensor was overwritten, so this is "
                "safe but callers must not reuse the input's old values.",
                fix="nothing, if the op is documented as in-place."))
    return found


def audit_mutation(B, fn, args: Sequence[Any], kwargs: dict, wrt: Sequence[int], names: Sequence[str],
                   cotangent: Sequence[np.ndarray], regime: str = "given") -> tuple[list[Failure], list[CheckResult]]:
    findings: list[Failure] = []
    fed, leaves = B.prepare(args, wrt)
    before = _snapshot(B, fed)
    lin = B.linearize(fn, args, kwargs, wrt, prepared=(fed, leaves))
    after_fwd = _snapshot(B, fed)
    findings += _diff(before, after_fwd, "forward", names, B, fed, regime)
    findings += _alias_failures(B, lin, fed, names, regime)
    checks = [CheckResult("aliasing.output_aliases_input", regime,
                          "fail" if any(f.check.startswith("aliasing") for f in findings) else "pass")]
    cots = lin.cotangent_tensors(cotangent)
    cot_fp = [B.fingerprint(c) for c in cots]
    g1 = [B.to_numpy(g) for g in B.vjp_tensors(lin, cots)]
    findings += _diff(after_fwd, _snapshot(B, fed), "backward", names, B, fed, regime)
    findings += [Failure(
        check="mutation.grad_output_write", regime=regime, input=lin.out_names[k],
        message=f"backward wrote into the upstream gradient of {lin.out_names[k]} ({B.describe(c)})",
        why="autograd may hand the same gradient buffer to several functions (e.g. when an output is "
        "used twice); writing into it corrupts the other branches' gradients.",
        fix="compute into a new tensor (grad_output * x instead of grad_output.mul_(x)).")
        for k, (c, fp) in enumerate(zip(cots, cot_fp)) if B.fingerprint(c) != fp]
    findings += _repeat_failures(B, lin, cotangent, g1, names, wrt, regime)
    failed = {f.check for f in findings if f.severity == "failure"}
    for name in ("mutation.silent_input_write", "mutation.grad_output_write", "mutation.backward_not_repeatable"):
        checks.append(CheckResult(name, regime, "fail" if name in failed else "pass"))
    return findings, checks


def _alias_failures(B, lin, fed, names, regime) -> list[Failure]:
    """Outputs that share memory with an input without autograd knowing they are views."""
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
                check="aliasing.output_aliases_input", regime=regime, input=names[i],
                message=f"{out_name} ({B.describe(out)}) shares memory with input {names[i]}, and autograd does not know it is a view",
                why="writes to the output silently change the input (and vice versa); autograd's view "
                "tracking and version checks do not cover this alias.",
                fix="return a new tensor (out.clone()), or return a real view created with view/reshape ops so "
                "autograd tracks it."))
    return found


def _max_abs(a: np.ndarray) -> float:
    return float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0))


def _repeat_failures(B, lin, cotangent, g1, names, wrt, regime) -> list[Failure]:
    """A second backward with the same upstream gradient must succeed and agree with the first (``g1``)."""
    found = []
    try:
        g2 = lin.pullback(cotangent)
    except Exception as exc:  # e.g. PyTorch's own "modified by an inplace operation" on the second backward
        g2 = []
        found.append(Failure(
            check="mutation.backward_not_repeatable", regime=regime,
            message=f"a second backward through the same graph (retain_graph=True) raised {type(exc).__name__}: {str(exc)[:300]}",
            why="backward changed a tensor it saved (an in-place op on ctx.saved_tensors), so the graph cannot "
            "be differentiated twice (double backward, gradient penalties, retain_graph loops).",
            fix="keep saved tensors read-only in backward: compute into new tensors instead of in place."))
    for i, (a, b) in enumerate(zip(g1, g2)):
        eps = B.eps(B.dtype_name(lin.leaves[i]))
        m = compare(b, a, TOLERANCES["mutation.backward_not_repeatable"].of(eps) * _max_abs(a))
        if not m.ok:
            name = names[wrt[i]]
            found.append(Failure(
                check="mutation.backward_not_repeatable", regime=regime, input=name,
                message=f"a second backward with the same upstream gradient (retain_graph=True) gives a different gradient for {name}",
                max_abs_err=m.max_abs, max_rel_err=m.max_rel,
                where=f"{name}{list(m.index or ())}: first backward {m.expected:.6g}, second {m.got:.6g}",
                why="backward changed a tensor it saved (for example scaled the saved gradient in place by "
                "grad_output): every later backward through the same graph is wrong.",
                fix="keep saved tensors read-only in backward; compute grad_input = saved * grad_output into a "
                "new tensor."))
    return found


def _grad_through(B, fn, args, kwargs, i, producer, isolate, cotangent, out_names):
    leaf, y = B.call_producer(producer, args[i], isolate)
    fed = [B.clone(a) if B.is_tensor(a) else a for a in args]
    fed[i] = y
    y_version, y_fp = B.version(y), B.fingerprint(y)
    outs = dict(B.run_graph(fn, fed, kwargs))
    chosen = [outs[n] for n in out_names if n in outs]
    cots = [B.from_numpy(c, o) for c, o in zip(cotangent, chosen)]
    silent = B.version(y) == y_version and B.fingerprint(y) != y_fp
    grad = B.grad_of(chosen, leaf, cots)
    # the producer's saved output is y: unchanged through the op's forward and the whole backward, the producer
    # read what it saved, and the run with a private copy would compute the same gradient (NOTE [Composition])
    untouched = not silent and B.version(y) == y_version and B.fingerprint(y) == y_fp
    return grad, silent, untouched


def audit_composition(B, fn, args: Sequence[Any], kwargs: dict, wrt: Sequence[int], names: Sequence[str],
                      cotangent: Sequence[np.ndarray], out_names: Sequence[str], notes: list[str],
                      regime: str = "given") -> tuple[list[Failure], list[CheckResult]]:
    findings: list[Failure] = []
    checks: list[CheckResult] = []
    for pname, producer in B.producers().items():
        check = f"composition.{pname}"
        status = "pass"
        for i in wrt:
            if B.numel(args[i]) == 0:
                continue
            try:
                g_direct, silent, untouched = _grad_through(B, fn, args, kwargs, i, producer, False, cotangent, out_names)
                if untouched:
                    continue
                g_ref, _, _ = _grad_through(B, fn, args, kwargs, i, producer, True, cotangent, out_names)
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
