"""``OpRaised``: the op under audit raised; ``check_op`` turns it into a finding instead of crashing."""

from __future__ import annotations

__all__ = ["OpRaised"]


class OpRaised(Exception):
    """``fn`` (or its backward) raised ``error`` during ``phase`` (``forward`` | ``backward``)."""

    def __init__(self, phase: str, error: BaseException, dtype: str | None = None, autograd_off: bool = False):
        super().__init__(f"{phase} raised {type(error).__name__}: {error}")
        self.phase = phase  # as the framework's user says it: "forward under paddle.no_grad()"
        self.error = error
        self.dtype = dtype
        self.autograd_off = autograd_off  # the forward with autograd off, as finite differences run it
