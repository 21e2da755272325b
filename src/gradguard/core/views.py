"""How a finding shows itself, without core knowing the renderers.

# NOTE [Findings do not import report]
# Data flows one way: findings are built in ``core`` and shown by ``report``. ``Finding.__str__`` and
# ``_repr_mimebundle_`` still need the renderers, so ``report`` registers them here when it is imported, and the
# top-level package imports ``report`` (``gradguard/__init__.py``): core never names the renderers. If they
# failed to load, a finding shows a one-line summary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .findings import Finding

__all__ = ["register_views", "text_view", "html_view"]

_text: Callable[[Finding], str] | None = None
_html: Callable[[Finding], str | None] | None = None


def register_views(text: Callable[[Finding], str], html: Callable[[Finding], str | None]) -> None:
    """Called by ``gradguard.report``: ``text(finding) -> str`` and ``html(finding) -> str``."""
    global _text, _html
    _text, _html = text, html


def text_view(finding: Finding) -> str:
    if _text is None:
        return f"gradguard finding: {finding.kind} ({finding.headline or finding.rule})"
    return _text(finding)


def html_view(finding: Finding) -> str | None:
    return None if _html is None else _html(finding)
