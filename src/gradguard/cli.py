"""``gradguard run [options] script.py [args...]``: run a script exactly as ``python script.py`` would,
under the guard, and explain any gradient hazard it hits."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradguard",
        description="Make gradient correctness visible: run training code under gradguard's guard.",
    )
    from ._version import __version__

    parser.add_argument("--version", action="version", version=f"gradguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run a Python script under the guard (like `python script.py args...`)")
    run.add_argument("--json", metavar="FILE", help="write the findings to FILE as JSON (a list, possibly empty)")
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
        "in forensic mode to name the writer; sentinel: no re-run; forensic: record every in-place write; "
        "bisect: also check fingerprints after every op (slow; pins writes made outside torch)",
    )
    run.add_argument("--no-track-writes", action="store_true", help="same as --mode sentinel")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    from .advisor._cli import add_advise_parser

    add_advise_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command == "advise":
        from .advisor._cli import advise_script

        return advise_script(options)
    if options.command != "run":
        parser.print_help(sys.stderr)
        return 2
    return run_script(options)


def _write_json(path: str | None, findings, script: str, options=None, exit_code: int | None = None) -> None:
    # Under torchrun: findings tagged with the rank, one file per rank (report.rank1.json, report.rank1.html).
    from .integrations.distributed import rank_info, rank_path, tag_findings

    info = rank_info()
    tag_findings(findings, info)
    extra = {"rank": info.rank, "world_size": info.world_size} if info else {}
    if path:
        from .report._json import findings_to_json

        with open(rank_path(path, info), "w", encoding="utf-8") as handle:
            handle.write(findings_to_json(findings, script=script, **extra))
    html = getattr(options, "html", None)
    if html:
        from .report._html import render_html

        target = rank_path(html, info)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(render_html(findings, script=script, rank=info.rank if info else None,
                                     world_size=info.world_size if info else None, exit_code=exit_code))
        print(f"gradguard: HTML report: {os.path.abspath(target)}", file=sys.stderr)


def run_script(options) -> int:
    script = options.script
    if not os.path.isfile(script):
        # The same words and exit code as `python missing.py`.
        print(f"gradguard: can't open file {os.path.abspath(script)!r}: [Errno 2] No such file or directory",
              file=sys.stderr)
        return 2
    with open(script, "rb") as handle:
        source = handle.read()
    path = os.path.abspath(script)  # like `python script.py` since 3.9: code and __file__ use the absolute path
    try:
        code = compile(source, path, "exec")
    except SyntaxError as error:
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(error), error)))
        return 1

    from . import guard
    from ._errors import GradientHazardError
    from ._traceback import format_user_exception

    sys.argv = [script, *options.args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    mode = "sentinel" if options.no_track_writes else options.mode
    from .integrations.distributed import rank_info

    if mode == "auto" and rank_info() is not None:  # torchrun: a rank cannot be re-run alone; log writes now
        mode = "forensic"
    fingerprint = options.fingerprint
    if fingerprint == "auto":
        fingerprint = "sample" if mode in ("auto", "sentinel") else "full"
    guard_block = guard(fingerprint=fingerprint, track_writes=mode in ("forensic", "bisect"),
                        bisect=mode == "bisect")
    globals_ = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__, "__package__": None,
                "__spec__": None, "__loader__": None, "__cached__": None}
    exit_code = 0
    from .integrations.distributed import rank_info, report_on_termination

    report_on_termination(lambda: _write_json(options.json, guard_block.findings, script, options, 143), rank_info())
    try:
        with guard_block:
            exec(code, globals_)
    except SystemExit as stop:
        _write_json(options.json, guard_block.findings, script, options)
        raise stop
    except KeyboardInterrupt:
        _write_json(options.json, guard_block.findings, script, options)
        raise
    except GradientHazardError as error:
        from .report._rich import print_findings

        sys.stdout.flush()
        from .integrations.distributed import rank_info, tag_findings

        info = rank_info()
        finding = error.finding
        if mode == "auto" and info is None and finding.kind in ("inplace_modification", "silent_write") and (
            not finding.modified_at
        ):
            from ._rerun import diagnose_by_rerun

            better = diagnose_by_rerun(finding, script, list(options.args), options.fingerprint)
            if better is not None:
                guard_block.findings = [better if f is finding else f for f in guard_block.findings]
                finding = better
        tag_findings([finding], info)
        sys.stderr.write(_traceback_head(error))
        print_findings([finding], sys.stderr, type(error).__name__ + (f" on rank {info.rank}" if info else ""))
        exit_code = 1
    except BaseException as error:  # the user's own error: their traceback, Python's exit code
        sys.stdout.flush()
        sys.stderr.write(format_user_exception(error))
        exit_code = 1
    _write_json(options.json, guard_block.findings, script, options, exit_code)
    sys.stdout.flush()
    from .integrations.distributed import leave, rank_info

    return leave(exit_code, rank_info())


def _traceback_head(error) -> str:
    """Where the error surfaced (the user's frames), without repeating the message the panel shows."""
    import traceback

    from ._traceback import trim_traceback

    from .core._frames import LIBRARY_PATHS

    tb = trim_traceback(error.__traceback__)
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    user = [e for e in entries if not LIBRARY_PATHS.is_library(e.tb_frame.f_code.co_filename)]
    frames = traceback.format_list(
        [traceback.FrameSummary(e.tb_frame.f_code.co_filename, e.tb_lineno, e.tb_frame.f_code.co_name) for e in user]
    )
    return "Traceback (most recent call last):\n" + "".join(frames)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
