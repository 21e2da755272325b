"""Plain-text rendering of a finding: the exception message, logs, notebooks' text fallback; on a terminal, the same
text framed and coloured with rich (``print_findings``).

# NOTE [terminal manners]
# On a terminal the finding is a panel as wide as the text needs and never wider than the terminal: the text
# is wrapped by ``render_finding`` at the terminal width minus the frame (at most the exception message's 100
# columns), so rich never re-wraps it. Where the output is not a terminal (piped, a CI log, a file) or the
# terminal is ``TERM=dumb``, the same text is written without box characters or colour, headed by the same
# title line, with one blank line after each finding. ``NO_COLOR`` (https://no-color.org) turns colour off and
# keeps the frame; rich reads it. ``COLUMNS`` sets the width where there is no terminal to ask (else 80).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import IO, Any

from ..core.findings import SAVED_TENSOR_KINDS, Finding, WriteRecord

__all__ = ["render_finding", "printable", "output_width", "wrap_notice", "fit_lines", "print_findings"]

_WIDTH = 100  # the exception message's width; terminals get their own (``render_finding(width=...)``)
_MIN_WIDTH = 40
_LABEL = 12
_KEEP = "\x00"  # stands for a space that wrapping must not break at


_VERSION_CHANGE = re.compile(r"\(version \d+ -> \d+\)")
# Control characters (ESC starts ANSI/OSC sequences: colours, cursor moves, window titles, hyperlinks) can sit
# in a source line the finding quotes; shown as \x1b etc. so they never act on the user's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (but newlines and tabs) written as visible ``\\xNN`` escapes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def stated_width(file=None) -> int | None:
    """``COLUMNS``, else the width of the terminal ``file`` (stdout by default) is, else None (a pipe, a file)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout if file is None else file
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # a replaced or closed stream: no terminal to ask
        pass
    return None


def output_width(file=None) -> int:
    """The columns gradguard's lines may use on ``file`` (stdout by default): ``COLUMNS``, else the terminal's
    width, else 80 (a pipe, a CI log, a file)."""
    return stated_width(file) or 80


def wrap_notice(text: str, prefix: str = "gradguard: ", file=None) -> str:
    """``prefix + text`` wrapped at ``file``'s output width (stderr by default), later lines indented by two;
    a word longer than the line (a path) stays whole. Ends with a newline."""
    width = max(output_width(sys.stderr if file is None else file), 20)
    return "\n".join(textwrap.wrap(prefix + " ".join(text.split()), width=width, subsequent_indent="  ",
                                   break_long_words=False, break_on_hyphens=False)) + "\n"


def fit_lines(text: str, width: int) -> str:
    """``text`` with each line longer than ``width`` wrapped under its own indent (continuations two deeper)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.strip(), width=max(width, 20), initial_indent=indent,
                             subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _field(label: str, text: str, width: int) -> list[str]:
    head = f"  {label:<{_LABEL}}: "
    text = _VERSION_CHANGE.sub(lambda m: m.group(0).replace(" ", _KEEP), text)  # one unit, never split
    body = [line.replace(_KEEP, " ") for line in
            textwrap.wrap(text, width=width - len(head), break_on_hyphens=False)] or [""]
    return [head + body[0]] + [" " * len(head) + line for line in body[1:]]


def _code(location, indent: int) -> list[str]:
    return [" " * indent + "| " + location.code] if location and location.code else []


def _write_lines(index: int, w: WriteRecord, width: int) -> list[str]:
    where = w.location.short if w.location else "an unknown line"
    via = f" via {w.via}" if w.via else ""
    # Wrapped with a hanging indent under the op, so the rich panel (same width) never re-wraps it. The
    # version change is one unit ("(version 0 -> 1)" is never split): its spaces are protected while wrapping.
    versions = ""
    if w.version_before is not None:
        after = w.version_after if w.version_after is not None else "?"
        versions = "  " + f"(version {w.version_before} -> {after})".replace(" ", _KEEP)
    silent = "  [no version bump: invisible to the framework]" if not w.bumps_version else ""
    text = f"{index}. {w.op}{via} at {where}{versions}{silent}"
    lines = [line.replace(_KEEP, " ") for line in textwrap.wrap(
        text, width=width, initial_indent="    ", subsequent_indent="       ", break_on_hyphens=False,
        break_long_words=False)]
    lines += _code(w.location, 7)
    if w.library_frame:
        lines.append(f"       inside {w.library_frame}")
    return lines


def _saver(f: Finding, code=str) -> str:
    """The "saved by" text, each name or place set by ``code`` (plain here, ``<code>`` in HTML)."""
    where = f.saved_at.location
    if not f.saved_at.op:  # no autograd node to name (a graph built by a statement): only where
        return f"the forward call at {code(where.short)}"
    return code(f.saved_at.op) + (f", saved in the forward call at {code(where.short)}" if where else "")


def _saver_rows(f: Finding, code=str) -> list[tuple[str, str, Any]]:
    """The "saved by" row, then a "called from" row per user's call of the model whose forward saved it: (label,
    text with each name or place set by ``code``, the location whose code line goes under it)."""
    if not (f.saved_at.node or f.saved_at.location):
        return []
    return [("saved by", _saver(f, code), f.saved_at.location),
            *(("called from", code(call.short), call) for call in f.saved_at.chain)]


def _modified_lines(f: Finding, width: int) -> list[str]:
    lines: list[str] = []
    if f.kind in SAVED_TENSOR_KINDS:
        if not f.modified_at:
            return _field("modified by", _no_write(f), width)
        lines.append(f"  {'modified by':<{_LABEL}}:")
        for i, w in enumerate(f.modified_at, 1):
            lines += _write_lines(i, w, width)
        return lines
    # an earlier backward that freed the graph is already the "freed by" row
    for i, w in enumerate((w for w in f.modified_at if w.category != "backward"), 1):
        where = w.location.short if w.location else "an unknown line"
        lines += _field("at" if i == 1 else "", f"{w.op} at {where}", width) + _code(w.location, 17)
    return lines


def render_finding(f: Finding, width: int = _WIDTH) -> str:
    """The finding as plain text, wrapped at ``width`` columns (100: the exception message)."""
    width = max(int(width), _MIN_WIDTH)
    lines = [f"{f.headline or f.kind}"]
    lines += _field("tensor", f.tensor.label, width)
    for label, text, location in _saver_rows(f):
        lines += _field(label, text, width) + _code(location, 17)
    if f.versions:
        saved, now = f.versions.get("saved"), f.versions.get("now")
        lines += _field("versions", f"saved at {saved}, now {now}", width)
    lines += _modified_lines(f, width)
    for label, value in f.facts.display or []:
        lines += _field(label, value, width)
    if f.explanation:
        lines += _field("why", f.explanation, width)
    if f.suggestion:
        lines += _field("fix", f.suggestion, width)
    for note in f.notes:
        lines += _field("note", note, width)
    return printable("\n".join(lines))


def _no_write(f) -> str:
    """What to say when no write is listed: missed, or never looked for (the sentinel keeps no write log)."""
    if f.facts.write_log is False:
        return "not recorded (write log off)"
    return "no write seen by gradguard"


_STYLES = {"  why": "yellow", "  fix": "green", "  tensor": "bold", "  note": "dim"}
_FRAME = 4  # "│ " and " │"


def print_findings(findings: list[Finding], file: IO[str], error_name: str = "") -> None:
    """Print each finding to ``file``: a panel on a terminal, plain text elsewhere (NOTE [terminal manners])."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    console = Console(file=file, highlight=False, soft_wrap=False)  # follows the width, NO_COLOR, TERM=dumb
    plain = not console.is_terminal or console.is_dumb_terminal  # no box characters or colour there
    # the text fits inside the panel on a terminal, the whole line elsewhere; the exception message's width at most
    width = min(_WIDTH, output_width(file) if plain else console.width - _FRAME)
    title = f"gradguard: {error_name}" if error_name else "gradguard"
    if plain:
        for finding in findings:
            file.write(f"{title}\n{render_finding(finding, width=width)}\n\n")
        file.flush()
        return
    for finding in findings:
        lines = render_finding(finding, width=width).splitlines()
        body = Text()  # not Text(style=...): that style would be the base of every line
        body.append(lines[0] + "\n", style="bold")
        current_style = ""
        for line in lines[1:]:
            style = next((style for prefix, style in _STYLES.items() if line.startswith(prefix)), None)
            if style is not None:
                current_style = style
            elif line.startswith("  ") and not line.startswith("   "):
                current_style = ""
            body.append(line + "\n", style=current_style)
        body.rstrip()
        console.print(Panel(body, title=Text(title, style="bold red"), title_align="left", expand=False))
