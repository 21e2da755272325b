"""Argument checks shared by ``gradguard run``, ``fix`` and ``advise``, made before anything runs: a typo in a
report path must cost no training run, and a report must never be written over the user's own files."""

from __future__ import annotations

import argparse
import os

__all__ = ["seconds", "report_path_problem"]


def seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def report_path_problem(targets: list[tuple[str, str]], inputs: list[str]) -> str | None:
    """Why one of the report files ``targets`` ((flag, path) pairs) cannot be written, naming the argument, what
    it expects and what it was given; None when all can. ``inputs`` are the files the program reads (the script
    and the files named among its arguments): a report never overwrites one."""
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
