"""``OpReport``: the result of ``check_op``, one object with every view (text, rich, HTML, JSON).

Framework-neutral: no deep-learning framework is imported here.
"""

from __future__ import annotations

import html
import itertools
import textwrap
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Failure", "CheckResult", "OpReport", "OP_REPORT_FORMAT_VERSION", "verdict_order"]

OP_REPORT_FORMAT_VERSION = 1
_WIDTH = 100  # at most; the text follows the width it is given (``COLUMNS``, else the terminal, else 80)
_FRAME = 4  # a rich panel's "│ " and " │"
# a rich panel's line style, by how the line starts (the first that matches)
_STYLES = (("FAIL", "bold red"), ("WARN", "bold yellow"), ("passed", "green"), (("why", "note", "skipped"), "dim"),
           ("fix", "cyan"))


def _width(width: int | None) -> int:
    if width is None:
        from ..report.text import output_width

        width = output_width()
    return max(min(int(width), _WIDTH), 40)


@dataclass
class Failure:
    """One failed check.

    ``check`` is a dotted name (``gradient.numerical``, ``regime.repeated_indices``,
    ``mutation.silent_input_write``, ``composition.softmax``, ``aliasing.output_aliases_input`` ...);
    ``regime`` says which inputs it ran on (``given`` for the inputs as passed).
    """

    check: str
    regime: str
    message: str
    input: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    tolerance: str | None = None
    where: str | None = None
    why: str = ""
    fix: str = ""
    repro: str = ""
    severity: str = "failure"  # failure | warning

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FAILURE_KEYS}

    def lines(self, width: int = _WIDTH) -> list[str]:
        tag = "FAIL" if self.severity == "failure" else "WARN"
        head = f"{tag} {self.check} [{self.regime}]" + (f" {self.input}" if self.input else "")
        out = textwrap.wrap(head + ": " + self.message, width=width, subsequent_indent="     ",
                            break_on_hyphens=False) or [head]
        errs = [f"max {kind} err {value:.3g}" for kind, value in (("abs", self.max_abs_err), ("rel", self.max_rel_err))
                if value is not None] + ([f"allowed: {self.tolerance}"] if self.tolerance else [])
        for label, text in (("error", ", ".join(errs)), ("worst", self.where), ("why", self.why), ("fix", self.fix)):
            if text:
                out += _field(label, text, width)
        if self.repro:
            out.append("     repro:")
            out += ["       " + line for line in self.repro.splitlines()]
        return out


_FAILURE_KEYS = ("check", "regime", "severity", "message", "input", "max_abs_err", "max_rel_err", "tolerance", "where",
                 "why", "fix", "repro")  # a finding's JSON keys, in this order


def _field(label: str, text: str, width: int = _WIDTH) -> list[str]:
    head = f"     {label:<6}: "
    body = textwrap.wrap(text, width=width - len(head), break_on_hyphens=False) or [""]
    return [head + body[0]] + [" " * len(head) + line for line in body[1:]]


# NOTE [One verdict]
# A buggy op fails 8-12 checks, most of them consequences of one mistake. The report leads with the root
# cause: the first check that fails on the simplest input (the inputs as given before any regime; the op
# failing to run before wrong values; the forward before the backward; the backward against finite
# differences before the checks that build on it). Every other failure is listed under it in one line.
_CHECK_RANK = (
    "op.raised",
    "forward.reference",
    "gradient.numerical",
    "gradient.reference",
    "gradient.cotangent_linearity",
    "gradient.zero_cotangent",
    "gradient.nonfinite",
    "gradient.precision",
    "opcheck.",
    "mutation.",
    "aliasing.",
    "composition.",
    "regime.",
)


def _rank(f: "Failure") -> tuple[int, int, int]:
    rank = next((k for k, prefix in enumerate(_CHECK_RANK) if f.check == prefix or (prefix.endswith(".") and f.check.startswith(prefix))), len(_CHECK_RANK))
    given = f.regime == "given"  # outside it, a smaller reproducer is a simpler input
    return (0 if f.severity == "failure" else 1, 0 if given else 1, rank if given else 1 + len(f.repro))


def verdict_order(findings: list["Failure"]) -> list["Failure"]:
    """Findings ordered root cause first (stable: equal ranks keep the order the checks ran in)."""
    return sorted(findings, key=_rank)


@dataclass
class CheckResult:
    """One check that ran (or was skipped) on one regime."""

    check: str
    regime: str
    status: str  # pass | fail | warn | skip
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "regime": self.regime, "status": self.status, "detail": self.detail}


@dataclass
class OpReport:
    """What ``check_op`` found. ``passed`` is True when no check failed (warnings do not fail)."""

    op: str
    backend: str
    inputs: list[str]  # "x: float32[4, 8] (differentiated)"
    reference: str | None
    findings: list[Failure] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> list[Failure]:
        return [f for f in self.findings if f.severity == "failure"]

    @property
    def warnings(self) -> list[Failure]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def root_cause(self) -> Failure | None:
        """The first check that fails on the simplest input (see NOTE [One verdict]); None when passed."""
        return self.failures[0] if self.failures else None

    def failed_checks(self) -> set[str]:
        return {f.check for f in self.failures}

    def summary(self) -> str:
        skipped, nfail = sum(c.status == "skip" for c in self.checks), len(self.failures)
        ran = len(self.checks) - skipped
        status = "PASSED" if self.passed else "FAILED"
        parts = [f"{nfail} failure{'s' * (nfail != 1)}"]
        if self.warnings:
            parts.append(f"{len(self.warnings)} warning{'s' * (len(self.warnings) != 1)}")
        parts.append(f"{ran} checks run, {skipped} skipped, {self.elapsed_s:.2f} s")
        return f"gradguard.check_op {status}: {self.op}  ({'; '.join(parts)})"

    def __str__(self) -> str:
        return self.render()

    def render(self, width: int | None = None) -> str:
        """The report as text, every line at most ``width`` columns (default: ``COLUMNS``, else the terminal,
        else 80; 100 at most); a reproducer's code lines are kept whole."""
        width = _width(width)
        lines = textwrap.wrap(self.summary(), width=width, subsequent_indent="  ", break_on_hyphens=False)
        lines += self._body(width)
        return "\n".join(lines)

    def _body(self, width: int) -> list[str]:
        lines = _field("inputs", "; ".join(self.inputs), width)
        lines += _field("ref", self.reference or "none (pass reference= to compare values, conventions and precision)",
                        width)
        if self.failures:
            lines.append("  root cause (first check failing on the simplest input):")
            lines += ["  " + line for line in self.failures[0].lines(width - 2)]
            rest = self.failures[1:]
            if rest:
                lines.append(f"  consequences and further failures ({len(rest)}):")
                for f in rest:
                    err = f" (max abs err {f.max_abs_err:.3g})" if f.max_abs_err is not None else ""
                    body = textwrap.wrap(f"FAIL {f.check} [{f.regime}]{' ' + f.input if f.input else ''}: {f.message}{err}",
                                         width=width - 7, break_on_hyphens=False)
                    lines += ["     - " + body[0]] + ["       " + line for line in body[1:]]
        for f in self.warnings:  # without the reproducer
            lines += ["  " + line for line in itertools.takewhile(lambda s: s != "     repro:", f.lines(width - 2))]
        passed = sorted({c.check for c in self.checks if c.status == "pass"} - self.failed_checks())
        if passed:
            lines += _field("passed", ", ".join(passed), width)
        skipped = sorted({f"{c.check} ({c.detail})" for c in self.checks if c.status == "skip"})
        if skipped:
            lines += _field("skipped", "; ".join(skipped), width)
        for note in self.notes:
            lines += _field("note", note, width)
        return lines

    def __repr__(self) -> str:
        return f"<OpReport {self.op}: {'passed' if self.passed else 'FAILED ' + ', '.join(sorted(self.failed_checks()))}>"

    def __rich_console__(self, console, options):
        from rich.panel import Panel
        from rich.text import Text

        # NOTE [The panel fits the width it is given]: the text is wrapped for the room inside the frame (rich
        # never re-wraps it, so the border stays whole); a summary longer than the top border goes in the body.
        width = _width(options.max_width - _FRAME)
        summary = self.summary()
        colour = "green" if self.passed else "red"
        body = Text()
        if len(summary) + 6 > width + _FRAME:
            title = f"gradguard.check_op {'PASSED' if self.passed else 'FAILED'}"
            for line in textwrap.wrap(summary[len(title) + 2:], width=width, break_on_hyphens=False):
                body.append(line + "\n", style=f"bold {colour}")
        else:
            title = summary
        for line in self._body(width):
            body.append(line + "\n", style=next((s for start, s in _STYLES if line.strip().startswith(start)), ""))
        body.rstrip()
        yield Panel(body, title=Text(title, style=f"bold {colour}"), title_align="left", expand=False)

    def to_html(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        rows = []
        for f in self.findings:
            errs = ", ".join(f"{label} {value:.3g}" for label, value in (("abs", f.max_abs_err), ("rel", f.max_rel_err))
                             if value is not None)
            detail = "<br>".join(html.escape(x) for x in (f.message, f.where or "", f.why, "fix: " + f.fix if f.fix else "") if x)
            repro = f"<pre>{html.escape(f.repro)}</pre>" if f.repro else ""
            rows.append(
                f"<tr><td><b>{html.escape(f.severity.upper())}</b></td><td><code>{html.escape(f.check)}</code></td>"
                f"<td>{html.escape(f.regime)}</td><td>{html.escape(f.input or '')}</td><td>{errs}</td>"
                f"<td>{detail}{repro}</td></tr>")
        head = "<tr><th></th><th>check</th><th>regime</th><th>input</th><th>error</th><th>details</th></tr>"
        table = f"<table>{head}{''.join(rows)}</table>" if rows else ""
        passed = sorted({c.check for c in self.checks if c.status == "pass"} - self.failed_checks())
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        from ..report.html import OP_REPORT_CSS

        return (
            f"<div class='gg-op'><style>{OP_REPORT_CSS}</style><p style='color:{colour}'>"
            f"<b>{html.escape(self.summary())}</b></p>"
            f"<p>inputs: {html.escape('; '.join(self.inputs))}<br>reference: {html.escape(self.reference or 'none')}</p>"
            f"{table}<p>passed: {html.escape(', '.join(passed))}</p>"
            + (f"<ul>{notes}</ul>" if notes else "")
            + "</div>")

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": str(self), "text/html": self.to_html()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": OP_REPORT_FORMAT_VERSION,
            "op": self.op,
            "backend": self.backend,
            "passed": self.passed,
            "elapsed_s": self.elapsed_s,
            "inputs": list(self.inputs),
            "reference": self.reference,
            "failures": [f.to_dict() for f in self.failures],
            "warnings": [f.to_dict() for f in self.warnings],
            "checks": [c.to_dict() for c in self.checks],
            "notes": list(self.notes),
            "options": dict(self.options),
        }

    def to_json(self, **kwargs) -> str:
        """The report in gradguard's JSON envelope (``report: "check_op"``, schema ``check_op.schema.json``):
        ``findings`` holds the failures then the warnings; strict JSON (non-finite numbers as strings)."""
        from ..report.json import dumps, envelope

        data = self.to_dict()
        data.pop("format_version")  # the envelope's format_version governs the document
        findings = data.pop("failures") + data.pop("warnings")
        return dumps(envelope("check_op", findings, **data), **kwargs)
