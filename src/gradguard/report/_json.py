"""JSON rendering. The format is versioned (``format_version``) and documented in the README."""

from __future__ import annotations

import json
from typing import Iterable

from ..core._findings import JSON_FORMAT_VERSION, Finding

__all__ = ["findings_to_json"]


def findings_to_json(findings: Iterable[Finding], **extra) -> str:
    """A JSON list with one object per finding; each carries ``format_version`` and ``extra`` fields."""
    assert JSON_FORMAT_VERSION >= 1
    return json.dumps([{**f.to_dict(), **extra} for f in findings], indent=2, default=str)
