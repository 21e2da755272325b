"""Op audits: ``check_op`` checks a custom op's gradients, regimes, mutations, aliasing and composition.

One engine (``audit``) for every framework; framework-specific code lives in one adapter per framework
(``torch_ops.TorchBackend``, ``gradguard.backends.paddle.check``, ``gradguard.backends.mindspore.check``; see
NOTE [One audit engine] in ``adapter_base``); everything else works on float64 numpy arrays.
"""

from __future__ import annotations

from typing import Any, Callable

from .report import CheckResult, Failure, OpReport

__all__ = ["check_op", "OpReport", "Failure", "CheckResult"]

for _public in (OpReport, Failure, CheckResult):  # NOTE [Public names] (gradguard/__init__.py)
    _public.__module__ = __name__
del _public


def check_op(fn: Callable, *inputs: Any, reference: Callable | None = None, **options: Any) -> OpReport:
    """Audit ``fn``'s gradients on ``inputs``; returns an :class:`OpReport` (``.passed``, ``.failures``).

    ``fn`` is any callable returning tensors (``autograd.Function.apply``, a ``torch.library`` op, a
    Triton-backed function, a module). ``reference`` is a trusted implementation of the same function
    (same outputs and shapes); with it, values, conventions at kinks and low-precision error are judged
    against it. Options: ``kwargs`` (dict passed to fn and reference), ``wrt`` (input positions to
    differentiate), ``checks`` (subset of ``gradient``, ``regime``, ``mutation``, ``aliasing``,
    ``composition``), ``regimes``, ``vary`` ({argument: False or values to try}), ``budget`` (seconds or
    ``"quick"``), ``surrogate`` (a function whose gradient the backward declares), ``isolate`` (regimes in a child
    process), ``seed``, ``probes``, ``full_jacobian_max``, ``rtol``, ``reference_factor``, ``shrink``, ``name``.
    """
    from ..backends import choose

    return choose(options.pop("backend", "auto"), [fn, *inputs]).check_op(fn, *inputs, reference=reference, **options)
