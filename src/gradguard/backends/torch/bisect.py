"""Bisect mode in one call: :func:`bisect` re-runs a function with ``TorchGuardSession(bisect=True)`` and returns
gradguard's findings. What bisect mode checks, and how it pins a write: :class:`Bisector` (writes.py)."""

from __future__ import annotations

from ..._errors import GradientHazardError
from .session import TorchGuardSession
from .writes import Bisector

__all__ = ["Bisector", "bisect"]


def bisect(fn, *args, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` in bisect mode and return gradguard's findings (it stops at the first).

    Use it to re-run code whose silent-write finding says "no write seen by gradguard".
    """
    session = TorchGuardSession(fingerprint="full", track_writes=True, bisect=True)
    session.enter()
    try:
        fn(*args, **kwargs)
    except GradientHazardError:
        pass
    finally:
        session.exit()
    return list(session.findings)
