"""Framework-neutral core: events, ledger, findings, diagnosis. Imports no deep-learning framework."""

from .facts import Facts
from .findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from .frames import LibraryPaths, caller_context, user_location
from .intents import ACTIONS, FixIntent

__all__ = ["ACTIONS", "Facts", "Finding", "FixIntent", "SaveSite", "SourceLocation", "TensorInfo", "WriteRecord",
           "LibraryPaths", "caller_context", "user_location"]
