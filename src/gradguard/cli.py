"""``gradguard run [options] script.py [args...]``: run a script exactly as ``python script.py`` would,
under the guard, and explain any gradient hazard it hits."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import traceback

from ._errors import GradientHazardError
from ._guard import guard
from ._overlay import COVERAGE_ENV, install_overlay
from ._rerun import DEFAULT_RERUN_TIMEOUT, RerunInterrupted, diagnose_by_rerun
from ._script import (call_users_excepthook, format_user_exception, load, program_target, report_path_problem, seconds,
                      trim_traceback, usage_error)
from ._version import __version__
from .core.findings import SAVED_TENSOR_KINDS
from .integrations.distributed import leave, rank_info, rank_path, report_on_termination, tag_findings
from .report.json import findings_to_json
from .report.text import printable, wrap_notice  # printable: a quoted source line must not drive the terminal

__all__ = ["main"]


def _sample_steps(text: str) -> int:
    """``--sample N``: an integer >= 1 (guard(sample_steps=N))."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (check one step in N); got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradguard",
        description="Make gradient correctness visible: run training code under gradguard's guard.",
    )
    parser.add_argument("--version", action="version", version=f"gradguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run a Python script under the guard (like `python script.py args...`)")
    run.add_argument("--json", metavar="FILE",
                     help="write the findings to FILE as JSON (a versioned document; its findings list may be empty)")
    run.add_argument("--html", metavar="FILE",
                     help="write a self-contained HTML report (findings and a picture of the autograd graph) to FILE")
    run.add_argument(
        "--fingerprint", choices=("auto", "full", "sample", "off"), default="auto",
        help="how saved tensors are fingerprinted to catch silent writes. auto (default): sample in the "
        "sentinel pass (every tensor up to 64 KiB hashed whole, larger ones sampled), full in forensic and "
        "bisect runs",
    )
    run.add_argument(
        "--mode", choices=("auto", "sentinel", "forensic", "bisect"), default="auto",
        help="auto (default): the cheap sentinel (versions, fingerprints, saver lines), and on a finding a re-run "
        "in forensic mode to name the writer (the script runs a second time, up to the failure: its side effects "
        "happen again; announced on stderr; --no-rerun turns it off); sentinel: no re-run; forensic: record every in-place write; "
        "bisect: also check fingerprints after every op (slow; pins writes made outside torch)",
    )
    run.add_argument("--no-track-writes", action="store_true", help="same as --mode sentinel")
    run.add_argument("--sample", type=_sample_steps, default=None, metavar="N",
                     help="check one training step in N (one backward pass and the forward before it); the others "
                     "run without gradguard's hooks, at plain speed. A write made on every step is caught within N "
                     "steps; one made on a single step is caught only if that step is checked")
    run.add_argument("--no-rerun", action="store_true",
                     help="never re-run the script to name the writer (the re-run repeats the script's side "
                     "effects: files it writes, network calls); the sentinel's finding is reported as is")
    run.add_argument("--rerun-timeout", type=seconds, default=DEFAULT_RERUN_TIMEOUT, metavar="SECONDS",
                     help=f"stop the forensic re-run after SECONDS (default: {DEFAULT_RERUN_TIMEOUT:g}); the first "
                     "run's finding is reported")
    run.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                     help="run a library module as a script, like `python -m MODULE ARGS`")
    run.add_argument("script", nargs="?", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    run.set_defaults(handler=run_script)
    from .advisor.cli import add_advise_parser
    from .fix.cli import add_fix_parser

    add_advise_parser(sub)
    add_fix_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_help(sys.stderr)
        return 2
    return options.handler(options)


def _json_text(findings, script: str) -> str:
    # Under torchrun: findings tagged with the rank, one file per rank (report.rank1.json, report.rank1.html).
    info = rank_info()
    tag_findings(findings, info)
    extra = {"rank": info.rank, "world_size": info.world_size} if info else {}
    return findings_to_json(findings, script=script, **extra)


def _replace_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a reader (or a process killed mid-write) never sees half."""
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


def _report_failed(flag: str, path: str, error: BaseException) -> None:
    # Checked writable before the run; a later failure (disk full, directory removed) costs the report, never the
    # script's exit code, and is said on stderr.
    sys.stderr.write(wrap_notice(f"could not write the {flag} report to {path!r} ({type(error).__name__}: "
                                 f"{error}); the run itself is unaffected"))


def _write_json(path: str | None, findings, script: str, options=None, exit_code: int | None = None) -> None:
    info = rank_info()
    if path:
        target = rank_path(path, info)
        try:
            _replace_file(target, _json_text(findings, script))
        except OSError as error:
            _report_failed("--json", target, error)
    html = getattr(options, "html", None)
    if html:
        from .report.html import render_html

        target = rank_path(html, info)
        try:
            _replace_file(target, render_html(findings, script=script, rank=info.rank if info else None,
                                              world_size=info.world_size if info else None, exit_code=exit_code))
        except OSError as error:
            _report_failed("--html", target, error)
        else:
            sys.stderr.write(wrap_notice(f"HTML report: {os.path.abspath(target)}"))


# NOTE [The JSON report is written as findings occur]
# A script may catch the hazard's error and leave by os._exit (a launcher, a watchdog), or be killed: no code of
# ours runs after that. So with --json the file is rewritten (whole, by rename) each time the guard records a
# finding, not only at the end; the end writes it once more with what the run's last moments added.
class _Recorded(list):
    """The guard's findings list, calling ``on_change(self)`` after each finding added."""

    def __init__(self, items, on_change):
        super().__init__(items)
        self._on_change = on_change

    def append(self, item) -> None:
        super().append(item)
        self._on_change(self)

    def extend(self, items) -> None:
        super().extend(items)
        self._on_change(self)


def _live_json(path: str, script: str):
    """The ``on_change`` that writes the JSON report of ``path``; it never raises into the guard's hooks."""
    def write(findings) -> None:
        try:
            _replace_file(rank_path(path, rank_info()), _json_text(list(findings), script))
        except Exception as error:  # called inside the framework's hooks: say it, never raise there
            _report_failed("--json", path, error)

    return write


class _GuardOnFrameworkImport:
    """``with``-block around the script: the guard is entered when the script's framework is imported (now,
    if one already is), so no framework is imported before the script asks for one. See the NOTE in
    ``gradguard.backends``."""

    def __init__(self, block, on_finding=None):
        self.block = block
        self.entered = False
        self._watch = None
        self._on_finding = on_finding

    def _enter(self, backend: str) -> None:
        if threading.current_thread() is not threading.main_thread():
            sys.stderr.write(wrap_notice(f"{backend} was first imported on thread "
                                         f"{threading.current_thread().name!r}; the guard watches the main thread "
                                         "only and is not active in this run"))
            return
        self.block.backend = backend
        try:
            self.block.__enter__()
        except Exception as error:  # called from inside the script's `import`: never fail the user's import
            reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            sys.stderr.write(wrap_notice(f"the guard could not start for {backend} ({reason}); the script runs "
                                         "unguarded"))
            return
        self.entered = True
        engine = getattr(getattr(self.block, "session", None), "engine", None)
        if self._on_finding is not None and type(getattr(engine, "findings", None)) is list:
            engine.findings = _Recorded(engine.findings, self._on_finding)
        if os.environ.get(COVERAGE_ENV):  # a `gradguard fix` run
            from .backends import choose

            framework = choose(backend)
            if "coverage" in framework.capabilities:
                framework.install_coverage_probe()

    def __enter__(self):
        from .backends import FrameworkImportWatch, detect_backend

        already = detect_backend()
        if already:
            self._enter(already)
        else:
            self._watch = FrameworkImportWatch(self._enter).start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._watch is not None:
            self._watch.stop()
        if self.entered:
            return self.block.__exit__(exc_type, exc, tb)
        return False


def _missing_framework_hint(error: BaseException) -> str:
    """One line after the user's traceback when the script's framework is not installed here."""
    from .backends import INSTALL, install_hint

    if isinstance(error, ModuleNotFoundError) and error.name in INSTALL:
        return install_hint(error.name) + "\n"
    return ""


def _guard_for(options):
    """The run's mode and the guard block configured for it."""
    mode = "sentinel" if options.no_track_writes else options.mode
    if mode == "auto" and rank_info() is not None:  # torchrun: a rank cannot be re-run alone; log writes now
        mode = "forensic"
    fingerprint = options.fingerprint
    if fingerprint == "auto":
        fingerprint = "sample" if mode in ("auto", "sentinel") else "full"
    guard_block = guard(fingerprint=fingerprint, track_writes=mode in ("forensic", "bisect"),
                        bisect=mode == "bisect", sample_steps=options.sample)
    return mode, guard_block


def _should_rerun(mode, info, finding, options) -> bool:
    # The sentinel names no writing op: a saved tensor changed with no write seen, or a module's forward changed
    # its caller's input (seen by the forward hook, which knows the call, not the line inside that wrote).
    unnamed = (finding.kind in SAVED_TENSOR_KINDS and not finding.modified_at) or finding.kind == "module_input_write"
    return mode == "auto" and info is None and unnamed and not options.no_rerun and not finding.facts.writer_unknowable


def _report_hazard(error, mode, options, program, args, cwd, guard_block) -> int:
    """Print a GradientHazardError's finding (improved by a re-run when possible); the exit status."""
    from .report.text import print_findings

    sys.stdout.flush()
    exit_code = 0
    info = rank_info()
    finding = error.finding
    if _should_rerun(mode, info, finding, options):
        try:
            better = diagnose_by_rerun(finding, program.command_words, args, options.fingerprint, cwd=cwd,
                                       timeout=options.rerun_timeout, stdin_source=program.stdin_source)
        except RerunInterrupted as stop:  # Ctrl-C / SIGTERM during the re-run: the first run's finding
            better, exit_code = None, 128 + stop.signum
        if better:
            first, others = better[0], better[1:]
            guard_block.findings = [first if f is finding else f for f in guard_block.findings] + others
            finding = first
    tag_findings([finding], info)
    if not call_users_excepthook(error):
        sys.stderr.write(_traceback_head(error))
    print_findings([finding], sys.stderr, type(error).__name__ + (f" on rank {info.rank}" if info else ""))
    return exit_code or 1


def run_script(options) -> int:
    install_overlay()

    target_args = program_target(options)
    if isinstance(target_args, str):
        return _usage_error(target_args)
    target, args, is_module = target_args
    cwd = os.getcwd()
    program = load(target, is_module)
    if isinstance(program, int):
        return program
    program.args = args
    info = rank_info()  # under torchrun, this rank's file is the one written
    problem = report_path_problem(options, program.input_files, args, lambda path: rank_path(path, info))
    if problem:
        return _usage_error(problem)
    # Reports go where the user asked from where they asked, even if the script changes directory.
    options.json, options.html = (os.path.abspath(p) if p else p for p in (options.json, options.html))

    mode, guard_block = _guard_for(options)
    exit_code = 0
    if rank_info() is not None:  # the SIGTERM handler must not import (NOTE [A SIGTERM during the report])
        from .report import html as _html, json as _json  # noqa: F401
    rank_report = report_on_termination(
        lambda code: _write_json(options.json, guard_block.findings, target, options, code), rank_info())
    globals_ = program.install_main(args)
    live = _live_json(options.json, target) if options.json else None
    try:
        with _GuardOnFrameworkImport(guard_block, on_finding=live):
            exec(program.code, globals_)
    except (SystemExit, KeyboardInterrupt):
        rank_report.write()
        raise
    except GradientHazardError as error:
        exit_code = _report_hazard(error, mode, options, program, args, cwd, guard_block)
    except BaseException as error:  # the user's own error: their traceback (or their excepthook), Python's exit code
        sys.stdout.flush()
        if not call_users_excepthook(error):
            sys.stderr.write(format_user_exception(error))
        sys.stderr.write(_missing_framework_hint(error))
        exit_code = 1
    rank_report.write(exit_code)
    sys.stdout.flush()
    return leave(exit_code, rank_info())


def _usage_error(message: str) -> int:
    """``gradguard run: error: ...`` with the usage line, exit status 2 (argparse's convention)."""
    parser = _parser()
    run = next(action for action in parser._subparsers._group_actions).choices["run"]
    return usage_error(run.format_usage(), run.prog, message)


def _traceback_head(error) -> str:
    """Where the error surfaced (the user's frames), without repeating the message the panel shows."""
    user = traceback.walk_tb(trim_traceback(error.__traceback__, drop_library=True))
    frames = traceback.format_list([traceback.FrameSummary(f.f_code.co_filename, line, f.f_code.co_name)
                                    for f, line in user])
    return "Traceback (most recent call last):\n" + printable("".join(frames))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
