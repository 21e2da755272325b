"""MindSpore's own in-place error (raised where the guard's hooks did not see the save), explained."""

from __future__ import annotations

import re

from ..._errors import InplaceModificationError
from ...core.diagnosis import diagnose
from ...core.facts import Facts
from ...core.findings import Finding, SaveSite, TensorInfo
from .naming import current_mode
from .session import mindspore_fix

__all__ = ["enrich_mindspore_error"]

_VERSION = re.compile(r"One of the Tensor needed for gradient computation has been modified by an inplace operation, "
                      r"which is the (\d+) 's (input|output|custom saved tensor) of (\w+); and its version is (\d+) , "
                      r"expected version (\d+)")


def enrich_mindspore_error(error, session=None):
    """MindSpore's own version-check error (raised when hooks did not see the save) with a diagnosis."""
    match = _VERSION.search(str(error))
    if match is None or not isinstance(error, RuntimeError):
        return None
    index, what, op, now, expected = match.groups()
    finding = Finding(
        kind="inplace_modification", tensor=TensorInfo(shape=(), dtype="?", role="tensor"),
        saved_at=SaveSite(node=op, argument=f"{what}[{index}]"), versions={"saved": int(expected), "now": int(now)},
        backend="mindspore", facts=Facts(mode=current_mode(), mindspore_message=str(error).split("\n")[0]),
    )
    diagnose(finding)
    return InplaceModificationError(mindspore_fix(finding))
