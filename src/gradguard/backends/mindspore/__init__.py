"""MindSpore backend: ``check_op`` for Cells with a custom ``bprop`` (PyNative and graph mode), and the guard
(saved-tensor hooks in PyNative + MsDispatchMode write log)."""

from .check import check_op
from .adapter import enrich_mindspore_error
from .session import GraphModeNotWatched, MindSporeGuardSession

__all__ = ["check_op", "MindSporeGuardSession", "enrich_mindspore_error", "GraphModeNotWatched"]
