"""Forensics on demand: when the cheap sentinel fires without seeing the writer, re-run the script with
the write log (and, for silent writes, bisection) to name it.

# NOTE [Sentinel first, forensics on failure]
# Recording every in-place write costs a dispatch-mode call per op (2-7x on loop-heavy models), while the
# sentinel (saved-tensor hooks: versions, fingerprints, saver lines) costs little. Healthy runs only pay for
# the sentinel; a failing run is re-run up to its failure in a child process, with stdout/stderr discarded,
# and the child's finding (same kind, same saver) replaces the sentinel's. Scripts must be deterministic
# for this to work (seeded); when the re-run does not reproduce the finding, the sentinel's stands.
#
# NOTE [What the re-run does to the user's world]
# The re-run executes the script a second time: its side effects (files written, network calls, ...) happen
# twice. So it is announced on stderr before it starts (one line, naming `--no-rerun`), bounded in time
# (`--rerun-timeout`, default DEFAULT_RERUN_TIMEOUT s), and started from the directory the first run started
# in (the script may have `chdir`ed since). Its stdin is empty (/dev/null): the first run may have consumed the
# user's stdin, and a re-run must never wait on the terminal; a script that needs stdin to reach the hazard is
# not reproduced, and the first run's finding stands with a note saying why. The child runs in its own session
# so the terminal's Ctrl-C reaches only gradguard, which kills the child (also on SIGTERM) and reports the
# first run's finding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from .core.findings import Finding
from .report.json import read_findings
from .report.text import wrap_notice

__all__ = ["diagnose_by_rerun", "in_diagnosing_rerun", "RERUN_ENV", "DEFAULT_RERUN_TIMEOUT", "RerunInterrupted"]

RERUN_ENV = "GRADGUARD_RERUN"
DEFAULT_RERUN_TIMEOUT = 600.0


def in_diagnosing_rerun() -> bool:
    """True inside the re-run ``gradguard run`` starts to name a writer (NOTE [The re-run looks for one finding])."""
    return bool(os.environ.get(RERUN_ENV))


class RerunInterrupted(Exception):
    """SIGINT or SIGTERM arrived during the re-run; the child is already killed."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _run_child(command: list[str], cwd: str, timeout: float, stdin_source: bytes | None = None) -> bool:
    """Run the re-run child; True when it finished within ``timeout``. Kills it on timeout, SIGINT, SIGTERM.
    Its stdin is empty, or ``stdin_source`` for a program read from stdin (``gradguard run -``: python reads all
    of stdin as the source, so the script itself then reads an empty stdin, as here)."""
    with tempfile.TemporaryFile() as source:
        if stdin_source is not None:
            source.write(stdin_source)
            source.seek(0)
        child = subprocess.Popen(command, cwd=cwd, env={**os.environ, RERUN_ENV: "1"},
                                 stdin=subprocess.DEVNULL if stdin_source is None else source,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def on_signal(signum, _frame):
        raise RerunInterrupted(signum)

    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[signum] = signal.signal(signum, on_signal)
            except ValueError:  # not the main thread: the default handlers stay
                pass
        try:
            child.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    except KeyboardInterrupt as error:
        raise RerunInterrupted(signal.SIGINT) from error
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# NOTE [The re-run looks for one finding]
# The re-run exists to name the writer of the first run's finding. A check that only the write log has (a module
# writing its caller's input) may fire earlier in it: the child records such a finding and goes on, so the
# finding sought is still reached, and the parent reports the extra one after it.


def diagnose_by_rerun(finding: Finding, program: list[str], args: list[str], fingerprint: str, *, cwd: str,
                      timeout: float = DEFAULT_RERUN_TIMEOUT,
                      stdin_source: bytes | None = None) -> list[Finding] | None:
    """The same finding with its writers named, from a re-run of ``program`` (``[script]`` or ``["-m", mod]``)
    started in ``cwd``, followed by the other stale tensors that re-run found already overwritten (PyTorch stops
    at the first; NOTE [All hazards in one error]); None if not reproduced (then a note on ``finding`` says why)."""
    if in_diagnosing_rerun():
        return None
    shown = " ".join(program)
    sys.stderr.write(wrap_notice(f"re-running {shown} with write tracking to name the writer (its side effects "
                                 f"happen again; at most {timeout:g} s; --no-rerun skips this)"))
    sys.stderr.flush()
    for mode in ["forensic", "bisect"] if finding.kind in ("silent_write", "unchecked_write") else ["forensic"]:
        with tempfile.TemporaryDirectory(prefix="gradguard-rerun-") as tmp:
            out = os.path.join(tmp, "findings.json")
            command = [sys.executable, "-m", "gradguard", "run", "--mode", mode, "--fingerprint", fingerprint,
                       "--json", out, *program, *args]
            if not _run_child(command, cwd, timeout, stdin_source):
                note = (f"the re-run to name the writer was stopped after {timeout:g} s (--rerun-timeout); "
                        "this is the first run's finding")
                sys.stderr.write(wrap_notice(note))
                finding.notes.append(note)
                return None
            try:
                with open(out, encoding="utf-8") as handle:
                    found = read_findings(json.load(handle))
            except (OSError, ValueError):
                found = []
        for data in found:
            if (data.get("kind") == finding.kind and (data.get("saved_at") or {}).get("op") == finding.saved_at.op
                    and data.get("modified_at")):
                better = Finding.from_dict(data)
                better.notes.append(f"the write was found by re-running the script with `gradguard run --mode {mode}` "
                                    "(healthy runs pay only for the cheap sentinel)")
                others = [Finding.from_dict(d) for d in found if d is not data and d.get("modified_at")]
                return [better, *others]
    finding.notes.append("the re-run did not reproduce this finding (is the script seeded and deterministic? "
                         "the re-run reads an empty stdin); run `gradguard run --mode forensic` to name the writer")
    return None
