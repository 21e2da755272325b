"""Renderers: one finding, many views (plain text, rich terminal, JSON, HTML)."""

from ..core.findings import register_views
from .json import FORMAT_VERSION, dumps, envelope, findings_to_json, read_findings
from .text import render_finding

__all__ = ["render_finding", "findings_to_json", "read_findings", "envelope", "dumps", "FORMAT_VERSION"]


def _notebook_html(finding) -> str:
    from .html import notebook_html  # the HTML renderer loads on first use

    return notebook_html(finding)


register_views(text=render_finding, html=_notebook_html)
