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
                why = [text for at, text in reasons.get(path, ()) if start <= at < start + max(length, 1)]
                header = match.group(0)
                lines[index] = header + (" " + "; ".join(dict.fromkeys(why)) if why else "") + "\n"
            elif not line.endswith("\n"):
                lines[index] = line + "\n\\ No newline at end of file\n"
        chunks.append("".join(lines))
    return "".join(chunks)
