"""Shared by the example scripts: run check_op on a correct and a buggy op and print what gradguard says."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "src"))

import gradguard  # noqa: E402


def show(title: str, fn, *inputs, **options):
    from rich.console import Console

    console = Console()  # the width it is given: COLUMNS, else the terminal, else 80
    console.rule(title)
    report = gradguard.check_op(fn, *inputs, **options)
    console.print(report)
    return report
