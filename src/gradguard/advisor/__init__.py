"""In-place memory advisor: which out-of-place ops can safely become in-place, and what that saves (measured).

``gradguard.advise(fn, *args)`` / ``gradguard advise script.py``. Needs PyTorch; imported lazily.
"""

from ._api import advise
from ._report import AdviceReport, Proposal, RejectedCandidate, UnsafeInplaceOp, format_bytes

__all__ = ["advise", "AdviceReport", "Proposal", "RejectedCandidate", "UnsafeInplaceOp", "format_bytes"]
