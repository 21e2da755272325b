"""Framework-neutral core: events, ledger, findings, diagnosis. Imports no deep-learning framework."""

from ._findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ._frames import LibraryPaths, caller_context, user_location
from ._intents import ACTIONS, FixIntent

__all__ = [
    "ACTIONS",
    "Finding",
    "FixIntent",
    "SaveSite",
    "SourceLocation",
    "TensorInfo",
    "WriteRecord",
    "LibraryPaths",
    "caller_context",
    "user_location",
]
