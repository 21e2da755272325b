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
    NotWatched,
    SilentModificationError,
)
from ._guard import guard
from .core.findings import Finding
from . import report as _report  # noqa: F401  registers how findings show (NOTE [Findings do not import report])

from ._version import __version__

# NOTE [Public names]
# The public surface is this module (plus ``gradguard.checks``, ``gradguard.testing`` and ``gradguard.integrations``'s
# modules); every other package here (core, backends, checks' and report's modules, fix, advisor) is implementation,
# named plainly, with no promise of stability. The classes users see say where users import them from.
for _public in (Finding, GradguardError, NotWatched, InvalidArgument, GradientHazardError, InplaceModificationError,
                SilentModificationError, BackwardTwiceError, InternalError):
    _public.__module__ = __name__
del _public


def load_ipython_extension(ipython) -> None:
    """``%load_ext gradguard``: findings of uncaught errors shown as HTML, with cell names (see integrations.jupyter)."""
    from .integrations.jupyter import register

    register(ipython)


def unload_ipython_extension(ipython) -> None:
    from .integrations.jupyter import unregister

    unregister(ipython)


def __getattr__(name):
    # Lazy: ``import gradguard`` stays light and framework-free; the op audit loads on first use.
    if name in ("check_op", "OpReport"):
        from . import checks

        return getattr(checks, name)
    if name == "advise":
        from .advisor import advise

        return advise
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'gradguard' has no attribute {name!r}")


__all__ = [
    "guard",
    "check_op",
    "OpReport",
    "Finding",
    "GradguardError",
    "NotWatched",
    "InvalidArgument",
    "GradientHazardError",
    "InplaceModificationError",
    "SilentModificationError",
    "BackwardTwiceError",
    "InternalError",
    "__version__",
]
