"""Run a program with some of its source files replaced in memory: how ``gradguard fix`` verifies an edit.

# NOTE [Verifying an edit without touching the user's files]
# ``gradguard fix`` must run the edited program exactly as the original runs (same path, same ``__file__``,
# same working directory, same sibling imports) while the files on disk stay as the user wrote them until
# ``--apply``. So the edited sources travel in a JSON file named by ``GRADGUARD_SOURCE_OVERLAY``
# ({absolute path: source}); ``gradguard run`` reads it at start-up: the script itself is compiled from
# its overlay text, imported modules load through a finder that compiles theirs, and linecache holds the
# edited lines so findings and tracebacks quote the code that ran. The variable is inherited by the forensic
# re-run, which therefore runs the same edited program.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import linecache
import os
import sys

__all__ = ["OVERLAY_ENV", "COVERAGE_ENV", "overlay_source", "install_overlay", "read_coverage"]

OVERLAY_ENV = "GRADGUARD_SOURCE_OVERLAY"
# Where a `gradguard fix` run records which optimizer parameters each backward reaches (backends/torch/_coverage)
COVERAGE_ENV = "GRADGUARD_GRADIENT_COVERAGE"
_SOURCES: dict[str, str] = {}


def overlay_source(path: str) -> str | None:
    """The edited source of ``path`` for this run, or None when it runs as written on disk."""
    return _SOURCES.get(os.path.realpath(path))


class _OverlayLoader(importlib.machinery.SourceFileLoader):
    def get_source(self, fullname):
        return overlay_source(self.path)

    def get_code(self, fullname):
        return compile(overlay_source(self.path), self.path, "exec", dont_inherit=True)


class _OverlayFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or overlay_source(spec.origin) is None:
            return None
        spec.loader = _OverlayLoader(fullname, spec.origin)
        return spec


def install_overlay() -> None:
    """Read ``GRADGUARD_SOURCE_OVERLAY`` (if set) and make its sources the ones that run; idempotent."""
    path = os.environ.get(OVERLAY_ENV)
    if not path or _SOURCES:
        return
    with open(path, encoding="utf-8") as handle:
        sources = json.load(handle)
    for file, text in sources.items():
        real = os.path.realpath(file)
        _SOURCES[real] = text
        lines = text.splitlines(keepends=True)
        # mtime None: linecache.checkcache keeps the entry (it cannot compare it with the file on disk)
        for name in {file, real}:
            linecache.cache[name] = (len(text), None, lines, name)
    sys.meta_path.insert(0, _OverlayFinder())


def read_coverage(path: str) -> list[dict] | None:
    """Per backward of a run, the optimizer parameters it ``used`` and ``reached`` (sets), and its call ``site``
    (backends/torch/coverage.py); None when the run recorded none."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [{name: set(keys) if isinstance(keys, list) else keys for name, keys in entry.items()}
                    for entry in json.load(handle)]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
