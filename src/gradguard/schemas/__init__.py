"""JSON Schemas (draft 2020-12) of gradguard's JSON documents, shipped with the package.

One schema per document (the ``report`` field of the envelope): ``guard`` (``gradguard run --json``),
``check_op`` (``OpReport.to_json()``), ``advise`` (``gradguard advise --json``), ``fix`` (``gradguard fix
--json``). ``load_schema`` reads
one; validate with any JSON Schema validator, e.g. ``jsonschema.validate(document, load_schema("guard"))``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from .._errors import InvalidArgument

__all__ = ["REPORTS", "load_schema", "schema_path"]

REPORTS = ("guard", "check_op", "advise", "fix")


def schema_path(report: str):
    """The installed file of ``report``'s schema (an ``importlib.resources`` traversable)."""
    if report not in REPORTS:
        raise InvalidArgument(f"load_schema(report=...) must be one of {', '.join(map(repr, REPORTS))}; "
                              f"got {report!r}: the envelope's `report` field names the schema")
    return resources.files(__name__) / f"{report}.schema.json"


def load_schema(report: str) -> dict[str, Any]:
    """The JSON Schema of the document whose ``report`` field is ``report``."""
    return json.loads(schema_path(report).read_text(encoding="utf-8"))
