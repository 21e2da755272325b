"""``gradguard fix``: turn the fix intents of findings into source edits, verified by re-running the script.

Loaded lazily: ``gradguard run`` builds its command-line parser from ``fix.cli`` without importing libcst.
"""

from __future__ import annotations

__all__ = ["EditNotApplicable", "FixOutcome", "apply_intent", "apply_intents", "repair"]

_EXPORTS = {"EditNotApplicable": "..core.edits", "apply_intent": "..core.edits", "apply_intents": "..core.edits",
           "FixOutcome": ".verify", "repair": ".verify"}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
