"""Renderers: one finding, many views (plain text, rich terminal, JSON)."""

from ._json import findings_to_json
from ._text import render_finding

__all__ = ["render_finding", "findings_to_json"]
