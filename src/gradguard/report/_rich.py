"""Terminal rendering with rich: the same text as the exception message, framed and coloured."""

from __future__ import annotations

from typing import IO

from ..core._findings import Finding
from ._text import render_finding

__all__ = ["print_findings"]

_STYLES = {"  why": "yellow", "  fix": "green", "  tensor": "bold", "  note": "dim"}


def print_findings(findings: list[Finding], file: IO[str], error_name: str = "") -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    console = Console(file=file, width=110, highlight=False, soft_wrap=False)
    for finding in findings:
        lines = render_finding(finding).splitlines()
        body = Text(lines[0] + "\n", style="bold")
        current_style = ""
        for line in lines[1:]:
            for prefix, style in _STYLES.items():
                if line.startswith(prefix):
                    current_style = style
                    break
            else:
                if line.startswith("  ") and not line.startswith("   "):
                    current_style = ""
            body.append(line + "\n", style=current_style)
        body.rstrip()
        title = f"gradguard: {error_name}" if error_name else "gradguard"
        console.print(Panel(body, title=Text(title, style="bold red"), title_align="left", expand=False))
