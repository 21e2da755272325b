"""The HIPS autograd adapter: ``check_op`` only (capabilities in ``backends.KNOWN``).

# NOTE [A framework without a guard]
# autograd differentiates plain numpy code: it has no saved-tensor hooks to watch what a backward reads, and numpy
# arrays have no version counter, so nothing a guard needs exists there. ``backends.KNOWN`` declares the backend
# without the "guard" capability; ``new_guard_session`` (what ``gradguard.guard()`` calls on the adapter
# ``backends.choose()`` returned, also for ``backend="auto"`` when autograd is the one framework imported) raises
# the resolver's own error for a missing capability, word for word, so the refusal reads the same whichever way it
# is reached. ``FrameworkImportWatch`` (``gradguard run``) watches only frameworks that have a guard.
"""

from __future__ import annotations

import numpy as np

from ..adapter import AdapterBase
from .check import check_op, is_array

__all__ = ["AutogradAdapter", "ADAPTER"]


class AutogradAdapter(AdapterBase):
    name = "autograd"
    module_name = "autograd"

    def is_tensor(self, obj) -> bool:
        return is_array(obj)

    def dtype_name(self, t) -> str:
        return str(np.asarray(t).dtype)

    def version(self, t) -> int | None:
        return None  # numpy arrays have no version counter

    def memory_range(self, t):
        return None  # only the guard names tensors by memory, and autograd has none

    def saved_tensors_hooks(self, pack, unpack):
        self._refuse_guard()

    def to_numpy(self, t):
        return np.array(t, copy=True)

    def from_numpy(self, a, *, requires_grad: bool = True):
        return np.array(a, copy=True)  # nothing marks a numpy array as requiring grad

    def vjp(self, fn, inputs, cotangents):
        from autograd.builtins import tuple as boxed_tuple
        from autograd.core import make_vjp

        def outputs_of(xs):
            outputs = fn(*xs)
            return outputs if isinstance(outputs, (tuple, list)) else (outputs,)

        pullback, _ = make_vjp(lambda xs: boxed_tuple(outputs_of(xs)), tuple(np.asarray(x) for x in inputs))
        return [None if g is None else np.asarray(g) for g in pullback(tuple(np.asarray(c) for c in cotangents))]

    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False):
        self._refuse_guard()

    def _refuse_guard(self):
        """NOTE [A framework without a guard]: the resolver's error for a backend without "guard"."""
        from .. import choose

        choose(self.name, needs="guard")
        raise AssertionError("backends.KNOWN gives autograd the guard capability, but it has no guard")

    check_op = staticmethod(check_op)


ADAPTER = AutogradAdapter()
