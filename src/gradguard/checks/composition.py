"""Composition test: the op downstream of producers whose backward reads their saved output.

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

__all__ = ["audit_composition"]


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
            scale = float(np.max(np.abs(g_ref[np.isfinite(g_ref)]), initial=0.0))
            m = compare(g_direct, g_ref, TOLERANCES["composition"].of(eps) * scale)
            if m.ok:
                continue
            status = "fail"
            cause = (
                f"the op's forward wrote into {pname}'s output (bytes changed, version unchanged), which {pname} "
                f"saved for its backward"
                if silent
                else f"running the op on {pname}'s output directly changes {pname}'s gradient"
            )
            findings.append(
                Failure(
                    check=check,
                    regime=regime,
                    input=names[i],
                    message=f"gradient through {pname}({names[i]}) -> op is wrong: {cause}",
                    max_abs_err=m.max_abs,
                    max_rel_err=m.max_rel,
                    where=f"d/d a{list(m.index or ())} of op({pname}(a)): {m.got:.6g}, with a private copy {m.expected:.6g}",
                    why="an op that overwrites its input corrupts whatever saved that tensor; losses still match, "
                    "gradients are silently wrong.",
                    fix="do not write into the input in forward (allocate the output/gradient buffer, or clone); "
                    f"until then callers can pass {names[i]}.clone().",
                    repro=f"a = {names[i]}.detach().requires_grad_()\nop({pname}(a), ...).backward(u)   # vs op({pname}(a).clone(), ...)",
                )
            )
            break
        checks.append(CheckResult(check, regime, status))
    return findings, checks
