"""Argument checks and usage errors shared by ``gradguard run``, ``fix`` and ``advise``, made before anything runs:
a typo in a report path must cost no training run, and a report must never be written over the user's own files."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["seconds", "report_path_problem", "program_target", "load", "syntax_error", "usage_error"]


def seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def report_path_problem(options, files: list[str], args: list[str], rename=None) -> str | None:
    """Why one of the report files ``options.json`` and ``options.html`` (each through ``rename``) cannot be
    written, naming the argument, what it expects and what it was given; None when all can. A report never
    overwrites a file the program reads: its ``files`` (the script) and the files among its ``args``."""
    targets = [(f"--{name}", rename(path) if rename else path) for name in ("json", "html")
               if (path := getattr(options, name, None))]
    inputs = [*files, *(arg for arg in args if os.path.isfile(arg))]
    if len(targets) == 2 and os.path.abspath(targets[0][1]) == os.path.abspath(targets[1][1]):
        return (f"{targets[0][0]} and {targets[1][0]} name the same file {targets[0][1]!r}: each report needs its "
                "own file")
    for flag, path in targets:
        full = os.path.abspath(path)
        if os.path.isdir(full):
            return f"argument {flag}: expected a file name, got {path!r}, which is a directory"
        folder = os.path.dirname(full)
        if not os.path.isdir(folder):
            return (f"argument {flag}: expected a file in an existing directory, got {path!r} (the directory "
                    f"{folder!r} does not exist; create it or choose another path)")
        if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
            return f"argument {flag}: expected a writable file, got {path!r}, which is not writable"
        for source in inputs:
            if os.path.exists(full) and os.path.exists(source) and os.path.samefile(full, source):
                return (f"argument {flag}: expected a new report file, got {path!r}, which is the file being run "
                        "or one of its arguments; gradguard never writes a report over an input file (did you "
                        "swap the arguments?)")
    return None


def program_target(options) -> tuple[str, list[str], bool] | str:
    """(target, its arguments, is_module) from ``script [args]`` or ``-m MODULE [args]``, else the usage error."""
    if options.module is not None:
        if not options.module:
            return "argument -m: expected a module name"
        return options.module[0], options.module[1:], True
    if options.script is None:
        return "the following arguments are required: script (or -m MODULE)"
    return options.script, list(options.args), False


def syntax_error(error: SyntaxError, message: str | None = None) -> int:
    """Say on stderr that the program does not compile (Python's own words unless ``message``); exit status 1."""
    import traceback

    sys.stderr.write("".join(traceback.format_exception_only(type(error), error)) if message is None else message)
    return 1


def load(target: str, is_module: bool, syntax_message=None):
    """The loaded program, or the exit status after saying why it cannot start: Python's own words (the same
    "can't open file" as ``python``), or ``syntax_message(error)`` for a SyntaxError when given."""
    from ._script import ProgramError, load_program

    try:
        return load_program(target, is_module)
    except ProgramError as error:
        print(error, file=sys.stderr)
        return error.exit_code
    except SyntaxError as error:
        return syntax_error(error, syntax_message(error) if syntax_message else None)


def usage_error(usage: str, prog: str, message: str) -> int:
    """The ``usage`` line and ``PROG: error: MESSAGE`` on stderr, as argparse says a usage error; exit status 2."""
    from .report.text import wrap_notice

    sys.stderr.write(usage + wrap_notice(message, prefix=f"{prog}: error: "))
    return 2
