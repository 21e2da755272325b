"""The unified diff ``gradguard fix`` prints: what ``git apply`` / ``patch -p1`` take, one reason per hunk.

The reason goes after the hunk's second ``@@`` (the "section heading" slot of a unified diff, which both
tools ignore), so the diff stays applicable and each hunk says why it is there.
"""

from __future__ import annotations

import difflib
import os
import re

__all__ = ["unified_diff"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _display(path: str, cwd: str) -> str:
    relative = os.path.relpath(path, cwd)
    return path if relative.startswith("..") else relative


def _one_per_reason(texts: list[str]) -> list[str]:
    """``label: why`` texts with one label per why: a move whose origin and destination are in one hunk is named
    once, by its origin ("line 17 (moved after line 18)"), not also as "line 17 moved here"."""
    chosen: dict[str, str] = {}
    for text in texts:
        label, _, why = text.partition(": ")
        if why not in chosen or chosen[why].endswith("moved here"):
            chosen[why] = label
    return [f"{label}: {why}" for why, label in chosen.items()]


def unified_diff(original: dict[str, str], edited: dict[str, str], reasons: dict[str, list[tuple[int, str]]],
                 cwd: str) -> str:
    """The diff of every edited file; ``reasons[path]`` lists (original line, reason) for the hunk headers."""
    chunks: list[str] = []
    for path in sorted(edited):
        before, after = original[path], edited[path]
        if before == after:
            continue
        name = _display(path, cwd)
        lines = list(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                          f"a/{name}", f"b/{name}", n=3))
        for index, line in enumerate(lines):
            match = _HUNK.match(line)
            if match:
                start = int(match.group(1))
                length = int(match.group(2)) if match.group(2) is not None else 1
                why = _one_per_reason([text for at, text in reasons.get(path, ()) if start <= at < start + max(length, 1)])
                header = match.group(0)
                lines[index] = header + (" " + "; ".join(why) if why else "") + "\n"
            elif not line.endswith("\n"):
                lines[index] = line + "\n\\ No newline at end of file\n"
        chunks.append("".join(lines))
    return "".join(chunks)
