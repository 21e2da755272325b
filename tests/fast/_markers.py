"""Source markers: a test names a line of its own file by ending that line with ``# <marker>``."""

from __future__ import annotations

import pathlib


class Markers:
    def __init__(self, file: str):
        self.lines = pathlib.Path(file).read_text().splitlines()

    def line(self, marker: str) -> int:
        """The 1-based number of the one line ending with ``# marker``."""
        hits = [i + 1 for i, text in enumerate(self.lines) if text.rstrip().endswith("# " + marker)]
        assert len(hits) == 1, marker
        return hits[0]
