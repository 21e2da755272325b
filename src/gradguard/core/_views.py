"""How a finding shows itself, without core knowing the renderers.

# NOTE [Findings do not import report]
# Data flows one way: findings are built in ``core`` and shown by ``report``. ``Finding.__str__`` and
# ``_repr_mimebundle_`` still need the renderers, so ``report`` registers them here when it is imported.
# A finding shown before anyone imported ``report`` loads the default renderer package by name, on first use
# (importing core, the engine or the events never loads a renderer); if that fails, it shows a one-line summary.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ._internal import log_fallback

__all__ = ["register_views", "text_view", "html_view"]

_text: Callable | None = None
_html: Callable | None = None


def register_views(text: Callable, html: Callable) -> None:
    """Called by ``gradguard.report``: ``text(finding) -> str`` and ``html(finding) -> str``."""
    global _text, _html
    _text, _html = text, html


_DEFAULT_RENDERERS = "gradguard.report"


def _ensure_registered() -> None:
    if _text is not None:
        return
    try:
        importlib.import_module(_DEFAULT_RENDERERS)  # registers through register_views
    except Exception as error:  # a broken renderer must not hide the finding itself
        log_fallback("views", "loading the default renderers", error)


def text_view(finding) -> str:
    _ensure_registered()
    if _text is None:
        return f"gradguard finding: {finding.kind} ({finding.headline or finding.rule})"
    return _text(finding)


def html_view(finding) -> str | None:
    _ensure_registered()
    return None if _html is None else _html(finding)
