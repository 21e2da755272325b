"""Renderers: one finding, many views (plain text, rich terminal, JSON, HTML)."""

from ._json import FORMAT_VERSION, dumps, envelope, findings_to_json, read_findings
from ._text import render_finding

__all__ = ["render_finding", "findings_to_json", "read_findings", "envelope", "dumps", "FORMAT_VERSION"]
