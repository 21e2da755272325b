"""``gradguard advise [options] script.py [args...]``: the advisor on a whole script.

The script is executed from scratch for every run (fresh globals, same RNG state). The recorded step ends
after ``--steps`` optimizer steps (``torch.optim.Optimizer.step`` returns): the next op stops the script.
Without an optimizer the whole script is the step.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

__all__ = ["add_advise_parser", "advise_script", "ScriptStep"]


def add_advise_parser(sub) -> None:
    p = sub.add_parser("advise", help="in-place memory advisor: which out-of-place ops can safely become "
                                      "in-place, and what they save at peak (measured)")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps recorded before the script is stopped "
                                                       "(default: 1)")
    p.add_argument("--json", metavar="FILE", help="write the report to FILE as JSON")
    p.add_argument("--repeats", type=int, default=3, help="timing repetitions (default: 3; 0 = no timing)")
    p.add_argument("--no-per-proposal", action="store_true",
                   help="verify the proposals together only (no per-proposal measurement)")
    p.add_argument("--no-allocator-check", action="store_true",
                   help="skip the CPU allocator cross-check (two extra runs under torch.profiler)")
    p.add_argument("script", help="the Python training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(handler=advise_script)


class ScriptStep:
    warmup = False
    restores_state = False  # every run executes the script from scratch

    def __init__(self, path: str, argv: list[str], steps: int):
        import torch

        self.path = os.path.abspath(path)
        with open(path, "rb") as handle:
            self.code = compile(handle.read(), self.path, "exec")
        self.argv = [path, *argv]
        self.steps = steps
        self.rng = torch.get_rng_state()
        self.py_rng = random.getstate()
        self._globals: dict | None = None

    def execute(self, mode):
        random.setstate(self.py_rng)
        mode.stop_after_optimizer_steps = self.steps
        sys.argv = list(self.argv)
        sys.path[0] = os.path.dirname(self.path)
        self._globals = {"__name__": "__main__", "__file__": self.path, "__builtins__": __builtins__,
                         "__package__": None, "__spec__": None, "__loader__": None, "__cached__": None}
        exec(self.code, self._globals)

    def cleanup(self, mode) -> None:
        if self._globals is not None:
            self._globals.clear()
            self._globals = None
        import gc

        gc.collect()


def advise_script(options) -> int:
    from .._script import report_path_problem, syntax_error, usage_error
    from .._errors import InvalidArgument
    from ..report.text import fit_lines, output_width, wrap_notice
    from .api import run_advisor

    if not os.path.isfile(options.script):
        print(f"gradguard: can't open file {os.path.abspath(options.script)!r}: [Errno 2] No such file or directory",
              file=sys.stderr)
        return 2
    if options.steps < 1:
        raise InvalidArgument(f"gradguard advise: '--steps' must be >= 1, got {options.steps}")
    if options.repeats < 0:
        raise InvalidArgument(f"gradguard advise: '--repeats' must be >= 0, got {options.repeats}")
    problem = report_path_problem(options, [options.script], options.args)
    if problem:
        return usage_error("usage: gradguard advise [options] script.py [args...]\n", "gradguard advise", problem)
    try:
        step = ScriptStep(options.script, options.args, options.steps)
    except SyntaxError as error:
        return syntax_error(error)
    saved_argv, saved_path0 = list(sys.argv), sys.path[0]
    try:
        report = run_advisor(step, per_proposal=not options.no_per_proposal, repeats=options.repeats,
                             allocator_check=not options.no_allocator_check)
    finally:
        sys.argv, sys.path[0] = saved_argv, saved_path0
    sys.stdout.write(fit_lines(report.render(), output_width(sys.stdout)) + "\n")
    if options.json:
        try:
            with open(options.json, "w", encoding="utf-8") as handle:
                handle.write(report.to_json())
        except OSError as error:  # checked writable before the runs: the report is lost, never the result
            sys.stderr.write(wrap_notice(f"could not write the --json report to {options.json!r} "
                                         f"({type(error).__name__}: {error})", prefix="gradguard advise: "))
    return 0
