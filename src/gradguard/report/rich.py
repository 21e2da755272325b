"""Terminal rendering with rich: the same text as the exception message, framed and coloured on a terminal.

# NOTE [terminal manners]
# On a terminal the finding is a panel as wide as the text needs and never wider than the terminal: the text
# is wrapped by ``render_finding`` at the terminal width minus the frame (at most the exception message's 100
# columns), so rich never re-wraps it. Where the output is not a terminal (piped, a CI log, a file) or the
# terminal is ``TERM=dumb``, the same text is written without box characters or colour, headed by the same
# title line, with one blank line after each finding. ``NO_COLOR`` (https://no-color.org) turns colour off and
# keeps the frame; rich reads it. ``COLUMNS`` sets the width where there is no terminal to ask (else 80).
"""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from ..core.findings import Finding
from .text import _WIDTH, output_width, render_finding

__all__ = ["print_findings"]

_STYLES = {"  why": "yellow", "  fix": "green", "  tensor": "bold", "  note": "dim"}
_FRAME = 4  # "│ " and " │"


def print_findings(findings: list[Finding], file: IO[str], error_name: str = "") -> None:
    """Print each finding to ``file``: a panel on a terminal, plain text elsewhere (see the NOTE above)."""
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
