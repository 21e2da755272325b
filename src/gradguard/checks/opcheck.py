"""``torch.library.opcheck`` folded into ``check_op``'s report for ops made with ``torch.library``.

# NOTE [opcheck]
# For a ``torch.library.custom_op`` (or any ``torch.ops`` overload) the schema says which inputs the op
# mutates and that outputs are new tensors; a fake (meta) kernel says the output shapes. ``check_op``'s
# mutation audit sees bytes, not declarations: a write into an input the schema calls read-only bumps
# the version (so it looks "declared"), yet torch.compile and functionalization trust the schema and
# compute wrong results. ``opcheck``'s schema, autograd-registration and fake-tensor tests catch that;
# each failing test becomes one ``opcheck.<test>`` finding. The dynamic AOT test is left out (it
# compiles, seconds per op); gradients are check_op's own business.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .report import CheckResult, Failure

__all__ = ["is_library_op", "audit_opcheck", "OPCHECK_TESTS"]

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")

_WHY = {
    "test_schema": "the op's behaviour contradicts its schema (an input written that the schema declares "
    "read-only, or an output that aliases an input): torch.compile, functionalization and autograd trust the "
    "schema and silently compute wrong results.",
    "test_autograd_registration": "the autograd formula is not registered through torch.library.register_autograd; "
    "other registrations can make gradients depend on the dispatch path.",
    "test_faketensor": "the fake (meta) kernel is missing or disagrees with the real one on shapes/dtypes: "
    "torch.compile and export trace wrong metadata.",
}
_FIX = {
    "test_schema": "declare every mutated input in mutates_args=(...) (or stop writing it), and return new tensors.",
    "test_autograd_registration": "register the backward with op.register_autograd(backward, setup_context=...).",
    "test_faketensor": "register a fake kernel with @op.register_fake that returns tensors of the real outputs' shapes and dtypes.",
}


def is_library_op(fn: Any) -> bool:
    from torch._library.custom_ops import CustomOpDef

    return isinstance(fn, (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def audit_opcheck(B, fn, args: Sequence[Any], kwargs: dict, wrt: Sequence[int]) -> tuple[list[Failure], list[CheckResult], list[str]]:
    fed, _ = B.prepare(args, wrt)
    try:
        results = torch.library.opcheck(fn, tuple(fed), dict(kwargs), test_utils=OPCHECK_TESTS, raise_exception=False)
    except Exception as exc:  # opcheck itself could not run (e.g. an op torch.library cannot introspect)
        return [], [CheckResult("opcheck", "given", "skip", f"torch.library.opcheck could not run: {type(exc).__name__}")], [
            f"torch.library.opcheck could not run on this op ({type(exc).__name__}: {str(exc)[:160]}); schema and fake-tensor checks skipped"]
    findings, checks = [], []
    for test in OPCHECK_TESTS:
        outcome = results.get(test, "SUCCESS")
        name = f"opcheck.{test.removeprefix('test_')}"
        if outcome == "SUCCESS":
            checks.append(CheckResult(name, "given", "pass"))
            continue
        first = str(outcome).strip().splitlines()[0] if str(outcome).strip() else type(outcome).__name__
        findings.append(Failure(check=name, regime="given", message=f"torch.library.opcheck {test} failed: {first[:300]}",
                                why=_WHY[test], fix=_FIX[test]))
        checks.append(CheckResult(name, "given", "fail"))
    return findings, checks, []
