"""Framework-neutral numerical gradient checking (numpy only) and the report the backends' ``check_op`` return.

# NOTE [What is compared]
# The op is treated as f: R^n -> R^m in float64. A random, non-unit cotangent c turns it into the scalar
# L(x) = sum_k <f_k(x), c_k>; the analytic side is the framework's vjp(c), the numeric side is a central
# difference of L. A cotangent of all ones (what ``f(x).sum()`` gives) hides bugs that permute or
# mis-scale the incoming gradient (a flip whose backward forgets to flip back passes with ones).
#   * small inputs (<= ``elementwise_limit`` elements in all): every element's partial derivative, so a
#     failure points at the worst element;
#   * always: ``probes`` random directions v, comparing (L(x+eps v) - L(x-eps v)) / 2eps with <vjp(c), v>:
#     2 forwards per probe whatever the input size.
#
# NOTE [Precision]
# In float64 with eps=1e-6 a correct gradient agrees to ~1e-10. A backward that computes in float32 and
# is cast back (MindSpore does this silently for a custom bprop) agrees only to ~1e-7: inside the usual
# tolerance (atol 1e-5, rtol 1e-3), so the "precision" check compares at float64 level separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["NumericResult", "check_gradients", "CheckFailure", "OpCheckReport", "random_cotangents"]

PRECISION_ATOL = 1e-8
PRECISION_RTOL = 1e-9


@dataclass
class NumericResult:
    """Analytic vs numeric gradients of one op at one point."""

    passed: bool
    precise: bool  # agrees at float64 level (PRECISION_ATOL/RTOL), not only within atol/rtol
    max_abs_err: float
    max_rel_err: float
    worst: dict[str, Any] | None  # {"input": i, "index": (..), "analytic": a, "numeric": n} or a probe
    evaluations: int  # forward calls made for the numeric side
    analytic: list[np.ndarray | None] = field(default_factory=list)
    numeric: list[np.ndarray | None] = field(default_factory=list)  # elementwise numeric gradients, when computed


def random_cotangents(shapes: Sequence[tuple[int, ...]], rng: np.random.Generator) -> list[np.ndarray]:
    """Random non-unit cotangents: normal values scaled away from 1 so permutations and scale bugs show."""
    return [rng.standard_normal(shape) * rng.uniform(0.5, 2.0) + 0.1 for shape in shapes]


def _weighted(outputs: Sequence[np.ndarray], cotangents: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(np.asarray(o, dtype=np.float64) * c) for o, c in zip(outputs, cotangents)))


def check_gradients(
    forward: Callable[[list[np.ndarray]], list[np.ndarray]],
    analytic: list[np.ndarray | None],
    inputs: Sequence[np.ndarray],
    cotangents: Sequence[np.ndarray],
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    probes: int = 3,
    elementwise_limit: int = 256,
    rng: np.random.Generator | None = None,
) -> NumericResult:
    """Compare ``analytic`` (the vjp of ``cotangents`` at ``inputs``) with central differences of ``forward``.

    ``forward`` maps float64 arrays to the op's outputs as arrays. A ``None`` analytic gradient means
    "the framework returned no gradient": it is compared as zeros (so a missing gradient shows as an error).
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    xs = [np.array(x, dtype=np.float64, copy=True) for x in inputs]
    grads = [np.zeros_like(x) if g is None else np.asarray(g, dtype=np.float64).reshape(x.shape)
             for g, x in zip(analytic, xs)]
    calls = 0

    def loss(arrays: list[np.ndarray]) -> float:
        nonlocal calls
        calls += 1
        return _weighted(forward(arrays), cotangents)

    max_abs = max_rel = 0.0
    worst: dict[str, Any] | None = None
    passed = precise = True
    numeric: list[np.ndarray | None] = [None] * len(xs)

    def compare(a: float, n: float, where: dict[str, Any], scale: float) -> None:
        nonlocal max_abs, max_rel, worst, passed, precise
        err = abs(a - n)
        rel = err / max(abs(n), 1e-12)
        if err > atol + rtol * abs(n):
            passed = False
        if err > PRECISION_ATOL * max(1.0, scale) + PRECISION_RTOL * abs(n):
            precise = False
        # an element beats a probe as "worst": it points at the exact entry
        if worst is None or ("probe" in worst) == ("probe" in where) and err > max_abs or (
                "probe" in worst and "probe" not in where):
            worst = {**where, "analytic": float(a), "numeric": float(n)}
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, rel)

    total = sum(x.size for x in xs)
    if total <= elementwise_limit:
        for i, x in enumerate(xs):
            num = np.zeros_like(x)
            flat = x.reshape(-1)
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                plus = loss(xs)
                flat[j] = old - eps
                minus = loss(xs)
                flat[j] = old
                num.reshape(-1)[j] = (plus - minus) / (2 * eps)
            numeric[i] = num
            scale = float(np.max(np.abs(num))) if num.size else 0.0
            for j, (a, n) in enumerate(zip(grads[i].reshape(-1), num.reshape(-1))):
                compare(a, n, {"input": i, "index": tuple(int(k) for k in np.unravel_index(j, x.shape))}, scale)
    for p in range(probes):
        directions = [rng.standard_normal(x.shape) for x in xs]
        plus = loss([x + eps * v for x, v in zip(xs, directions)])
        minus = loss([x - eps * v for x, v in zip(xs, directions)])
        n = (plus - minus) / (2 * eps)
        a = float(sum(np.sum(g * v) for g, v in zip(grads, directions)))
        scale = float(sum(np.sum(np.abs(g * v)) for g, v in zip(grads, directions)))
        compare(a, n, {"probe": p}, scale)
    return NumericResult(passed=passed, precise=precise, max_abs_err=max_abs, max_rel_err=max_rel, worst=worst,
                         evaluations=calls, analytic=grads, numeric=numeric)


@dataclass
class CheckFailure:
    """One failed check of ``check_op``: ``check`` names it (e.g. ``"gradient"``, ``"bprop_dtype"``)."""

    check: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


@dataclass
class OpCheckReport:
    """Result of a backend ``check_op``: which checks ran, which failed, and where (backend, mode)."""

    op: str
    backend: str
    modes: list[str]  # execution modes the checks ran in: "eager" | "pynative" | "graph"
    checks: list[str] = field(default_factory=list)  # names of the checks that ran
    failures: list[CheckFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_abs_err: float | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failed_checks(self) -> list[str]:
        return [f.check for f in self.failures]

    def __bool__(self) -> bool:
        return self.passed

    def raise_if_failed(self) -> "OpCheckReport":
        if self.failures:
            from .._errors import GradguardError

            raise GradguardError(str(self))
        return self

    def __str__(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        modes = ", ".join(self.modes)
        head = f"check_op({self.op}) [{self.backend}, {modes}]: {status}"
        if self.max_abs_err is not None:
            head += f" (max abs err {self.max_abs_err:.3e})"
        lines = [head, "  checks: " + ", ".join(self.checks)]
        for failure in self.failures:
            lines.append(f"  FAIL {failure}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)
