"""``gradguard fix [--apply] [--json FILE] script.py [args...]``: verified repairs of the hazards a run hits.

The unified diff it prints is what ``git apply`` / ``patch -p1`` take, one reason per hunk: the reason goes after
the hunk's second ``@@`` (the "section heading" slot of a unified diff, which both tools ignore), so the diff stays
applicable and each hunk says why it is there.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

__all__ = ["add_fix_parser", "fix_script", "unified_diff", "verified_fix_text"]

DEFAULT_RUN_TIMEOUT = 900.0
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def add_fix_parser(sub) -> None:
    from .._script import seconds

    fix = sub.add_parser(
        "fix", help="repair the hazards a script hits: each edit is verified by re-running the script",
        description="Run the script under the guard; for each finding, edit a copy of your source as the diagnosis "
        "says, re-run it, and keep the edit only if the hazard is gone. Prints a unified diff (git apply / "
        "patch -p1 take it); exit 0 when the script runs clean, 1 when a finding stays unfixed, 2 on usage errors.")
    fix.add_argument("--apply", action="store_true", help="write the verified edits into your files")
    fix.add_argument("--backup", action="store_true", help="with --apply: keep each original as FILE.orig")
    fix.add_argument("--json", metavar="FILE", help="write the edits, their reasons and what stays unfixed to FILE")
    fix.add_argument("--html", metavar="FILE",
                     help="write an HTML report: each finding with the verified edit that removes it (or why none)")
    fix.add_argument("--max-rounds", type=int, default=6, metavar="N",
                     help="at most N hazards repaired one after another (default: 6)")
    fix.add_argument("--timeout", type=seconds, default=DEFAULT_RUN_TIMEOUT, metavar="SECONDS",
                     help=f"stop one run of the script after SECONDS (default: {DEFAULT_RUN_TIMEOUT:g})")
    fix.add_argument("--mode", choices=("auto", "sentinel", "forensic"), default="auto",
                     help="the guard mode of each run (as in gradguard run); forensic also sees a module writing "
                          "into its caller's input")
    fix.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                     help="fix a module run as a script, like `python -m MODULE ARGS`")
    fix.add_argument("script", nargs="?", help="the Python script to run")
    fix.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    fix.set_defaults(handler=fix_script)


def _usage(message: str) -> int:
    from .._script import usage_error

    return usage_error("usage: gradguard fix [--apply] [--backup] [--json FILE] [--html FILE] script.py [args...]\n",
                       "gradguard fix", message)


def _original_line(base: str, original: str, line: int) -> int:
    """Line ``line`` of ``base`` (an edited source) as a line of ``original``."""
    matcher = difflib.SequenceMatcher(None, original.splitlines(), base.splitlines(), autojunk=False)
    for tag, o1, o2, b1, b2 in matcher.get_opcodes():
        if b1 < line <= b2 or (b1 == b2 == line - 1):
            return o1 + (line - b1) if tag == "equal" else o1 + 1
    return line


def _span(lines: list[int]) -> str:
    return f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"


def _reasons(outcome) -> dict[str, list[tuple[int, str]]]:
    """(line in the original file, reason) for every edit, for the hunk headers. Statements one repair moves to
    the same place for the same reason (a zero_grad, backward, step block) share one entry."""
    reasons: dict[str, list[tuple[int, str]]] = {}
    for edit in outcome.accepted:
        alternative = edit.reason[len("; ".join(dict.fromkeys(i.reason for i in edit.intents if i.reason))):]
        lines: dict[tuple, list[int]] = {}  # (path, reason, destination or None) -> original lines
        whys: dict[tuple, str] = {}
        for index, intent in enumerate(edit.intents):
            path = os.path.realpath(intent.file)
            base, original = edit.base.get(path, outcome.original[path]), outcome.original[path]
            after = None
            if intent.action == "move_statement" and intent.detail.get("after_line"):
                after = _original_line(base, original, intent.detail["after_line"])
            key = (path, intent.reason or intent.action, after)
            lines.setdefault(key, []).append(_original_line(base, original, intent.line))
            why = (intent.reason or intent.action) + (alternative if index == len(edit.intents) - 1 else "")
            # a later round's reasons name lines of the source as the earlier edits left it
            whys[key] = re.sub(r"\bline (\d+)", lambda m: f"line {_original_line(base, original, int(m.group(1)))}", why)
        for key, moved in lines.items():
            path, _reason, after = key
            moved.sort()
            why = whys[key]
            label = f"{_span(moved)} (moved after line {after})" if after is not None else _span(moved)
            reasons.setdefault(path, []).append((moved[0], f"{label}: {why}"))
            if after is not None:
                reasons[path].append((after, f"{_span(moved)} moved here: {why}"))
    for entries in reasons.values():
        entries.sort()
    return reasons


def _one_per_reason(texts: list[str]) -> list[str]:
    """``label: why`` texts with one label per why: a move whose origin and destination are in one hunk is named
    once, by its origin ("line 17 (moved after line 18)"), not also as "line 17 moved here"."""
    chosen: dict[str, str] = {}
    for text in texts:
        label, _, why = text.partition(": ")
        if why not in chosen or chosen[why].endswith("moved here"):
            chosen[why] = label
    return [f"{label}: {why}" for why, label in chosen.items()]


def unified_diff(original: dict[str, str], edited: dict[str, str], reasons: dict[str, list[tuple[int, str]]],
                 cwd: str) -> str:
    """The diff of every edited file; ``reasons[path]`` lists (original line, reason) for the hunk headers."""
    chunks: list[str] = []
    for path in sorted(edited):
        before, after = original[path], edited[path]
        if before == after:
            continue
        relative = os.path.relpath(path, cwd)
        name = path if relative.startswith("..") else relative
        lines = list(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                          f"a/{name}", f"b/{name}", n=3))
        for index, line in enumerate(lines):
            match = _HUNK.match(line)
            if match:
                start = int(match.group(1))
                length = int(match.group(2)) if match.group(2) is not None else 1
                why = _one_per_reason([text for at, text in reasons.get(path, ()) if start <= at < start + max(length, 1)])
                header = match.group(0)
                lines[index] = header + (" " + "; ".join(why) if why else "") + "\n"
            elif not line.endswith("\n"):
                lines[index] = line + "\n\\ No newline at end of file\n"
        chunks.append("".join(lines))
    return "".join(chunks)


def _summary(finding: dict) -> str:
    if not finding:
        return "the run"
    headline = " ".join(str(finding.get("headline") or finding.get("kind") or "a finding").split())
    return f"{headline} [{finding.get('rule') or finding.get('kind')}]"


def _document(script, first, outcome, diff) -> str:
    """The ``--json`` document: gradguard's envelope (``report: "fix"``, schema ``fix.schema.json``); its
    ``findings`` are the findings met, each once, the repaired ones first."""
    from ..report.json import dumps, envelope

    def summary(finding: dict) -> dict:
        return {"rule": finding.get("rule"), "kind": finding.get("kind"), "headline": finding.get("headline")}

    met = [e.finding for e in outcome.accepted if e.finding] + [u.finding for u in outcome.unfixed if u.finding]
    return dumps(envelope(
        "fix", met, script=script, clean=outcome.clean, runs=outcome.runs, exit_code_before=first.exit_code,
        edits=[{"finding": summary(e.finding), "reason": e.reason, "intents": [i.to_dict() for i in e.intents],
                "alternatives": [a.to_dict() for a in e.alternatives]} for e in outcome.accepted],
        unfixed=[{**summary(u.finding), "why": u.why} for u in outcome.unfixed],
        diff=diff), indent=1)


def _fit(diff: str, width: int) -> str:
    """The diff with each hunk heading cut to ``width`` columns (``...``): the heading is free text that
    ``git apply`` and ``patch`` ignore, and each reason is also printed in full (``verified: ...``) and in
    ``--json``. Changed lines are the user's own and stay as they are."""
    return "".join(line if not line.startswith("@@") or len(line.rstrip("\n")) <= width
                   else line[:max(width - 3, line.index("@@", 2) + 2)].rstrip() + "...\n"
                   for line in diff.splitlines(keepends=True))


def _write_html(path: str, script: str, outcome, cwd: str) -> None:
    """The HTML report of the findings met, each with the diff of the edit that removed it."""
    from ..core.findings import Finding
    from ..report.html import render_html

    findings = []
    for index, edit in enumerate(outcome.accepted):
        after = outcome.accepted[index + 1].base if index + 1 < len(outcome.accepted) else outcome.edited
        before = {p: edit.base.get(p, outcome.original[p]) for p in outcome.original}
        finding = Finding.from_dict(edit.finding)
        finding.facts.verified_fix = unified_diff(before, {p: after.get(p, before[p]) for p in before}, {}, cwd)
        findings.append(finding)
    for item in outcome.unfixed:
        if item.finding:
            finding = Finding.from_dict(item.finding)
            finding.notes.append(f"gradguard fix: not fixed: {item.why}")
            findings.append(finding)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_html(findings, script=script))


def _target(options) -> tuple[str, list[str], bool] | str:
    """(target, args, is_module) from the arguments, or the usage error that stops the fix."""
    from .._script import program_target

    parsed = program_target(options)
    if isinstance(parsed, str):
        return parsed
    if options.max_rounds < 1:
        return f"argument --max-rounds: expected a positive number of rounds, got {options.max_rounds}"
    if options.backup and not options.apply:
        return "argument --backup: only meaningful with --apply"
    if parsed[0] == "-" and not parsed[2]:
        return "expected a script file to edit, got '-' (stdin): save the program to a file first"
    return parsed


def _show(first, outcome, cwd: str, say) -> str:
    """Print the first run's findings, the diff (returned) and what each edit did."""
    from ..report.text import print_findings, stated_width

    if first.findings:  # what the diff repairs, as `gradguard run` shows it
        from ..core.findings import Finding

        print_findings([Finding.from_dict(data) for data in first.findings], sys.stderr, "the first run's finding")
    diff = unified_diff(outcome.original, outcome.edited, _reasons(outcome), cwd)
    # Headings are cut to a terminal's (or COLUMNS') width only: a diff piped into a file keeps its reasons.
    width = stated_width(sys.stdout)
    sys.stdout.write(diff if width is None else _fit(diff, width))
    sys.stdout.flush()
    for edit in outcome.accepted:
        say(f"verified: {edit.reason} (removes: {_summary(edit.finding)})")
    for item in outcome.unfixed:
        say(f"not fixed: {_summary(item.finding)}: {item.why}")
    return diff


def _write_reports(options, target: str, first, outcome, diff: str, cwd: str, say) -> None:
    if options.json:
        try:
            with open(options.json, "w", encoding="utf-8") as handle:
                handle.write(_document(target, first, outcome, diff))
        except OSError as error:  # checked writable before the runs: the report is lost, never the outcome
            say(f"could not write the --json report to {options.json!r} ({type(error).__name__}: {error})")
    if options.html:
        try:
            _write_html(options.html, target, outcome, cwd)
        except OSError as error:
            say(f"could not write the --html report to {options.html!r} ({type(error).__name__}: {error})")
        else:
            say(f"HTML report: {os.path.abspath(options.html)}")


def _apply(outcome, backup: bool, cwd: str, say) -> None:
    for path, text in outcome.edited.items():
        if backup:
            with open(path + ".orig", "w", encoding="utf-8") as handle:
                handle.write(outcome.original[path])
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    say(f"applied to {', '.join(os.path.relpath(p, cwd) for p in sorted(outcome.edited))}")


def fix_script(options) -> int:
    try:
        import libcst  # noqa: F401  (edits are made on a concrete syntax tree)
    except ImportError:
        print("gradguard fix: needs libcst to edit your source; install it with `pip install libcst`",
              file=sys.stderr)
        return 2
    from .verify import repair

    parsed = _target(options)
    if isinstance(parsed, str):
        return _usage(parsed)
    target, args, is_module = parsed
    command = (["-m"] if is_module else []) + [target, *args]
    from .._script import load, report_path_problem

    program = load(target, is_module, lambda error: f"gradguard fix: {target} does not parse ({error.msg}, "
                                                    f"line {error.lineno})\n")
    if isinstance(program, int):
        return program
    problem = report_path_problem(options, program.input_files, args)
    if problem:
        return _usage(problem)
    cwd = os.getcwd()
    from ..report.text import wrap_notice

    def say(text: str) -> None:
        sys.stderr.write(wrap_notice(text, prefix="gradguard fix: "))
        sys.stderr.flush()

    say(f"running {' '.join(command)} under the guard; each candidate edit is verified by running it again "
        f"(its side effects, such as files it writes, happen again on every run)")
    first, outcome = repair(command, cwd, timeout=options.timeout, max_rounds=options.max_rounds,
                            mode=options.mode, say=say)
    if not first.findings and not outcome.unfixed:
        if first.exit_code == 0:
            say("no gradient hazard found: nothing to fix")
            return 0
        say(f"the script exits {first.exit_code} with an error of its own, not a gradient hazard; nothing to fix")
        return 1
    diff = _show(first, outcome, cwd, say)
    _write_reports(options, target, first, outcome, diff, cwd, say)
    if options.apply and outcome.accepted:
        _apply(outcome, options.backup, cwd, say)
    if outcome.clean:
        say(f"the script now runs clean ({outcome.runs} runs)")
        return 0
    return 1


def verified_fix_text(nodeid: str, rootdir: str, timeout: float) -> str:
    """The report section (``pytest --gradguard-fix``) for a test that failed at a hazard: the verified diff and its
    reasons, or why no edit verified. Never raises for a failed repair: the test's own failure is what the user
    came for."""
    from .verify import repair

    first, outcome = repair(["-m", "pytest", "-q", nodeid, "--rootdir", rootdir], rootdir, timeout=timeout)
    lines = []
    if outcome.accepted:
        state = ("this test then passes with no finding" if outcome.clean
                 else "it removes the hazards below; others remain")
        lines.append(f"verified edit ({state}; {outcome.runs} runs of this test; `git apply` takes it):")
        lines.append(unified_diff(outcome.original, outcome.edited, _reasons(outcome), rootdir).rstrip("\n"))
        lines.extend(f"verified: {edit.reason} (removes: {_summary(edit.finding)})" for edit in outcome.accepted)
    for item in outcome.unfixed:
        lines.append(f"not fixed: {_summary(item.finding)}: {item.why}")
    if not lines:
        lines.append("no hazard when this test runs alone: nothing to verify an edit against"
                     if not first.findings else "no edit verified")
    return "\n".join(lines) + "\n"
