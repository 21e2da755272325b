"""Forensics on demand: when the cheap sentinel fires without seeing the writer, re-run the script with
the write log (and, for silent writes, bisection) to name it.

# NOTE [Sentinel first, forensics on failure]
# Recording every in-place write costs a dispatch-mode call per op (2-7x on loop-heavy models), while the
# sentinel (saved-tensor hooks: versions, fingerprints, saver lines) costs little. Healthy runs only pay for
# the sentinel; a failing run is re-run up to its failure in a child process, with stdout/stderr discarded,
# and the child's finding (same kind, same saver) replaces the sentinel's. Scripts must be deterministic
# for this to work (seeded); when the re-run does not reproduce the finding, the sentinel's stands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from .core._findings import Finding
from .report._json import read_findings

__all__ = ["diagnose_by_rerun", "RERUN_ENV"]

RERUN_ENV = "GRADGUARD_RERUN"


def _modes_for(finding: Finding) -> list[str]:
    return ["forensic", "bisect"] if finding.kind == "silent_write" else ["forensic"]


def diagnose_by_rerun(finding: Finding, script: str, args: list[str], fingerprint: str) -> Finding | None:
    """The same finding with its writers named, from a re-run of the script; None if not reproduced."""
    if os.environ.get(RERUN_ENV):
        return None
    for mode in _modes_for(finding):
        with tempfile.TemporaryDirectory(prefix="gradguard-rerun-") as tmp:
            out = os.path.join(tmp, "findings.json")
            command = [sys.executable, "-m", "gradguard", "run", "--mode", mode, "--fingerprint", fingerprint,
                       "--json", out, script, *args]
            try:
                subprocess.run(command, env={**os.environ, RERUN_ENV: "1"}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                with open(out, encoding="utf-8") as handle:
                    found = read_findings(json.load(handle))
            except (OSError, ValueError):
                continue
        for data in found:
            if data.get("kind") == finding.kind and (data.get("saved_at") or {}).get("op") == finding.saved_at.op:
                if data.get("modified_at"):
                    better = Finding.from_dict(data)
                    better.notes.append(
                        f"the write was found by re-running the script with `gradguard run --mode {mode}` "
                        "(healthy runs pay only for the cheap sentinel)"
                    )
                    return better
    return None
