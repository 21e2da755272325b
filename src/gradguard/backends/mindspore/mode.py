"""The mode MindSpore runs in now: ``"graph"`` (GRAPH_MODE) or ``"pynative"``."""

from __future__ import annotations

import mindspore as ms

__all__ = ["current_mode"]


def current_mode() -> str:
    return "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"
