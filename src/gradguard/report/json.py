"""JSON rendering: one versioned envelope for every JSON document gradguard writes.

# NOTE [JSON envelope]
# Every JSON output (``gradguard run --json``, ``OpReport.to_json()``, ``gradguard advise --json``,
# ``gradguard fix --json``) is one
# object::
#
#     {"format_version": 2, "tool": "gradguard", "version": "0.1.0", "report": "guard",
#      ...report fields..., "findings": [...]}
#
# ``report`` says which document it is ("guard", "check_op", "advise", "fix") and which schema in
# ``gradguard/schemas/`` describes it; ``findings`` is always there, also when empty. Format 1 was a bare list
# of findings (``read_findings`` still reads it). The JSON is strict (RFC 8259): a non-finite float is
# written as the string "NaN", "Infinity" or "-Infinity", never as a bare NaN/Infinity token that
# ``json.loads`` in other languages rejects.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from .._version import __version__
from ..core.findings import Finding

__all__ = ["FORMAT_VERSION", "envelope", "dumps", "findings_to_json", "read_findings"]

FORMAT_VERSION = 2


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its string ("NaN", "Infinity", "-Infinity")."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    item = getattr(value, "item", None)  # NumPy / framework scalars: their Python number
    if callable(item) and getattr(value, "ndim", None) == 0:
        return _strict(item())
    return str(value)


def envelope(report: str, findings: Iterable[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The JSON document for ``report`` ("guard", "check_op", "advise", "fix"): header, ``fields``, then findings."""
    return {"format_version": FORMAT_VERSION, "tool": "gradguard", "version": __version__, "report": report,
            **fields, "findings": list(findings)}


def dumps(document: dict[str, Any], indent: int | None = 2, **kwargs: Any) -> str:
    """Strict JSON text of ``document`` (see the NOTE above on non-finite numbers)."""
    return json.dumps(_strict(document), indent=indent, allow_nan=False, **kwargs)


def findings_to_json(findings: Iterable[Finding], **extra: Any) -> str:
    """The guard's JSON document: the envelope with one object per finding (possibly none).

    ``extra`` (``script``, ``rank``, ``world_size``) goes in the envelope and, as in format 1, in each finding.
    """
    return dumps(envelope("guard", [{**f.to_dict(), **extra} for f in findings], **extra))


def read_findings(document: Any) -> list[dict[str, Any]]:
    """The findings of a parsed guard document, format 2 (the envelope) or format 1 (a bare list)."""
    if isinstance(document, list):
        return document
    if isinstance(document, dict) and isinstance(document.get("findings"), list):
        return document["findings"]
    raise ValueError(
        f"not a gradguard findings document: expected an object with a 'findings' list (format {FORMAT_VERSION}) "
        f"or a list (format 1), got {type(document).__name__}")
