"""``gradguard fix``: turn the fix intents of findings into source edits, verified by re-running the script."""

from ._edits import EditNotApplicable, apply_intent, apply_intents
from ._verify import FixOutcome, repair

__all__ = ["EditNotApplicable", "FixOutcome", "apply_intent", "apply_intents", "repair"]
