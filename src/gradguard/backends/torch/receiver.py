"""The loss a ``.backward()`` call runs on: the receiver's expression read from the user's line, and its value
read from the user's frame."""

from __future__ import annotations

import collections

from ...core.source_ast import backward_receiver as _backward_receiver
from ...core.source_ast import evaluate_reference

__all__ = ["_backward_receiver", "_lookup"]


def _lookup(expression: str, frame) -> object:
    return evaluate_reference(expression, collections.ChainMap(frame.f_locals, frame.f_globals))  # no copy
