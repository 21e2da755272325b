"""gradguard: make gradient correctness visible.

``with gradguard.guard():`` turns in-place hazards into precise diagnoses; ``gradguard.check_op`` audits
custom ops' gradients. Importing gradguard does not import any deep-learning framework.
"""

from ._errors import (
    BackwardTwiceError,
    GradguardError,
    GradientHazardError,
    InplaceModificationError,
    InternalError,
    InvalidArgument,
    SilentModificationError,
)
from ._guard import guard
from .core._findings import Finding

__version__ = "0.1.0"

__all__ = [
    "guard",
    "Finding",
    "GradguardError",
    "InvalidArgument",
    "GradientHazardError",
    "InplaceModificationError",
    "SilentModificationError",
    "BackwardTwiceError",
    "InternalError",
    "__version__",
]
