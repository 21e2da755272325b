"""In-place memory advisor: which out-of-place ops can safely become in-place, and what that saves (measured).

``gradguard.advise(fn, *args)`` / ``gradguard advise script.py``. Needs PyTorch, imported on first use
(the CLI's argument parser imports this package without importing torch).
"""

_EXPORTS = {
    "advise": ".api",
    "AdviceReport": ".report",
    "Proposal": ".report",
    "RejectedCandidate": ".report",
    "UnsafeInplaceOp": ".report",
    "format_bytes": ".report",
    "RULES": ".pipeline",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gradguard.advisor' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)


__all__ = list(_EXPORTS)
