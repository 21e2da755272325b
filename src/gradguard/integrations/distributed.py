"""torchrun / DDP support for ``gradguard run``: which rank this process is, per-rank report files, and a
prompt exit when a rank fails.

Framework-free: reads only the environment variables torchrun (and ``torch.distributed.launch``, SLURM
wrappers that mimic it) set: ``RANK`` and ``WORLD_SIZE``.

# NOTE [No hang when one rank fails]
# When one rank raises (say in backward), the others are typically blocked in a collective (DDP's gradient
# all-reduce, the buffer broadcast of the next forward) waiting for it. Two things make them stop promptly:
#   1. the failing rank leaves with ``os._exit`` right after writing its report: a normal interpreter
#      shutdown runs process-group destructors and atexit handlers that can themselves wait on peers;
#   2. its exit closes its gloo/NCCL connections, so the peers' pending collective fails at once
#      ("Connection closed by peer") instead of waiting for the 30-minute collective timeout; and torchrun's
#      elastic agent, seeing a worker exit non-zero, stops the remaining workers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass

__all__ = ["RankInfo", "rank_info", "rank_path", "tag_findings", "leave", "report_on_termination", "RankReport"]

_log = logging.getLogger("gradguard.integrations.distributed")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        _log.warning("gradguard: environment variable %s=%r is not an integer; not treated as a torchrun rank",
                     name, value)
        return None


def rank_info() -> RankInfo | None:
    """This process's place in a torchrun job, or None when it is not launched as one."""
    rank = _int("RANK")
    world = _int("WORLD_SIZE")
    return None if rank is None or world is None else RankInfo(rank=rank, world_size=world)


def rank_path(path: str, info: RankInfo | None) -> str:
    """``report.json`` -> ``report.rank1.json`` under torchrun (one file per rank); unchanged otherwise."""
    if info is None:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{info.rank}{ext}"


def tag_findings(findings, info: RankInfo | None) -> None:
    """Record the rank in each finding (``finding.facts.rank``, ``finding.facts.world_size``)."""
    if info is None:
        return
    for finding in findings:
        facts = finding.facts
        if facts.rank is None:
            facts.rank = info.rank
        if facts.world_size is None:
            facts.world_size = info.world_size


def leave(exit_code: int, info: RankInfo | None) -> int:
    """Return ``exit_code``; under torchrun a failing rank exits right away (see the NOTE above)."""
    if info is None or exit_code == 0:
        return exit_code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(exit_code)


class RankReport:
    """This rank's report, written exactly once: by the normal end of ``gradguard run`` or, if the elastic agent
    stops the rank first, by the SIGTERM handler.

    # NOTE [A SIGTERM during the report]
    # When one rank fails, torchrun sends SIGTERM to the others. A rank whose collective failed because its peer
    # left is often already writing its own report when the signal lands (CI saw the JSON written and the HTML
    # missing). So the normal path blocks SIGTERM while it writes; a signal that arrives meanwhile stays
    # pending, and its handler, run after the write, sees the report done and only exits. The report modules
    # are imported when the handler is installed, so the handler never imports a module that an interrupted
    # import left half-initialised.
    """

    def __init__(self, write, info: RankInfo | None):
        self._write = write  # write(exit_code)
        self._info = info
        self.written = False

    def write(self, exit_code: int | None = None) -> None:
        """Write the report now (once), with SIGTERM held back until it is on disk."""
        if self.written:
            return
        blocked = self._info is not None and _block_sigterm(True)
        try:
            self._write(exit_code)
            self.written = True
        finally:
            if blocked:
                _block_sigterm(False)

    def _on_sigterm(self, signum, frame):
        try:
            if not self.written:
                self._write(128 + signum)
                self.written = True
        except BaseException as error:  # the rank exits anyway; say why its report is missing or partial
            _log.error("gradguard: rank %d stopped by SIGTERM could not write its report (%s: %s)",
                       self._info.rank, type(error).__name__, error, exc_info=True)
        finally:  # installed only under torchrun, so ``leave`` exits
            leave(128 + signum, self._info)


def _block_sigterm(block: bool) -> bool:
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK, {signal.SIGTERM})
        return True
    except (AttributeError, ValueError, OSError):  # no pthread_sigmask on this platform
        return False


def report_on_termination(write, info: RankInfo | None) -> RankReport:
    """The rank's report, as a :class:`RankReport`. Under torchrun, also write it when the elastic agent stops
    this rank (SIGTERM, sent to the other ranks when one fails), then exit as a SIGTERM would. Python runs the
    handler as soon as the main thread is back in Python code: a rank whose collective failed because its peer
    left gets there at once."""
    report = RankReport(write, info)
    if info is None:
        return report
    try:
        signal.signal(signal.SIGTERM, report._on_sigterm)
    except ValueError:  # not the main thread: Python allows signal handlers only there
        _log.info("gradguard: not in the main thread; a rank stopped by SIGTERM will not write its report")
    return report
