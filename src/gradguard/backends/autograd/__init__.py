"""HIPS autograd backend: ``check_op`` for functions of numpy arrays and custom primitives with a hand-written vjp
(no guard: see NOTE [A framework without a guard] in ``adapter``)."""

from .check import check_op

__all__ = ["check_op"]
