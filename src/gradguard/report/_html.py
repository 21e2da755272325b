"""HTML rendering: a self-contained report (``gradguard run --html FILE``) and notebook fragments.

Everything is inline (CSS, SVG): the file opens offline, from a CI artifact, or in a mail attachment.
The picture of the autograd graph comes from ``finding.context["graph"]`` (captured by the backend at error
time, see ``backends/torch/_graph.py``); it is laid out here in simple layers, with no graphviz needed:

* the saver node on top, the nodes computing its inputs' gradients below it (one row per level);
* to the right of the saver, the stale tensor it saved (red), joined by a "saved <argument>" edge;
* below the stale tensor, each write that changed it (red, dashed), with an arrow into the tensor.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Iterable

from ..core._findings import Finding, WriteRecord

__all__ = ["render_html", "finding_html", "notebook_html", "graph_svg"]

_CHAR_W = 7.2  # px per character of 12px monospace
_NODE_H = 46
_ROW_GAP = 74
_COL_GAP = 22
_MARGIN = 20
_MAX_CHARS = 58

_STYLE = {
    # type/role -> (fill, stroke, stroke-width, dash)
    "saver": ("#fff3dc", "#d97800", 3, ""),
    "op": ("#f2f5f9", "#7f8fa3", 1.2, ""),
    "leaf": ("#ecf7ec", "#4f944f", 1.2, ""),
    "leaf_stale": ("#ecf7ec", "#c62828", 2.5, ""),
    "stale": ("#fde7e7", "#c62828", 3, ""),
    "write": ("#fff0f0", "#c62828", 2, "6 4"),
}

_PAGE_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;
background:#fff}
h1{font-size:22px;margin:0 0 4px 0}h1 .brand{color:#c62828}
.meta{color:#57606a;font-size:13px;margin-bottom:18px}
.none{font-size:15px;color:#1a6b2a}
"""

# Scoped under .gg-report: the same rules serve the page and a notebook cell without touching the notebook.
_FINDING_CSS = """
.gg-report .finding{border:2px solid #c62828;border-radius:8px;padding:14px 18px;margin:0 0 22px 0;max-width:1150px;
font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;color:#1f2328;background:#fff}
.gg-report .finding h2{font-size:17px;margin:0 0 10px 0;color:#b71c1c}
.gg-report .kind{display:inline-block;font-size:12px;background:#c62828;color:#fff;border-radius:10px;padding:1px 9px;
margin-right:8px;vertical-align:middle}
.gg-report table.facts{border-collapse:collapse;font-size:14px;width:100%}
.gg-report table.facts th{text-align:left;vertical-align:top;padding:4px 12px 4px 0;color:#57606a;white-space:nowrap;
width:110px}
.gg-report table.facts td{padding:4px 0;vertical-align:top;text-align:left}
.gg-report code,.gg-report pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
.gg-report pre.src{background:#f6f8fa;border-left:3px solid #d0d7de;margin:3px 0;padding:3px 8px;white-space:pre-wrap}
.gg-report ol.writes{margin:0;padding-left:20px}.gg-report ol.writes li{margin-bottom:4px}
.gg-report .silent{color:#b71c1c;font-weight:600}
.gg-report tr.why td{color:#7a4a00}.gg-report tr.fix td{color:#1a6b2a;font-weight:500}
.gg-report .graph{margin-top:12px;border-top:1px solid #d8dee4;padding-top:10px;overflow-x:auto}
.gg-report .graph h3,.gg-report .raw summary{font-size:14px;margin:0 0 6px 0;color:#57606a}
"""


def _h(text: Any) -> str:
    return escape("" if text is None else str(text), quote=True)


def _clip(text: str, limit: int = _MAX_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- graph picture -------------------------------------------------------------------------------
def _layout(graph: dict[str, Any]) -> tuple[dict[str, tuple[float, float, float]], float, float]:
    """id -> (x, y, width) of each box (top-left corner), and the picture's width and height."""
    nodes = graph.get("nodes", [])
    width_of = {n["id"]: min(_MAX_CHARS, max(len(n.get("label", "")), len(n.get("detail", "")), 8)) * _CHAR_W + 20
                for n in nodes}
    tree = [n for n in nodes if n.get("type") in ("op", "leaf")]
    rows: dict[int, list[dict[str, Any]]] = {}
    for n in tree:
        rows.setdefault(int(n.get("depth", 0)), []).append(n)
    row_widths = {d: sum(width_of[n["id"]] for n in row) + _COL_GAP * (len(row) - 1) for d, row in rows.items()}
    tree_width = max(row_widths.values(), default=0)
    pos: dict[str, tuple[float, float, float]] = {}
    for depth, row in rows.items():
        x = _MARGIN + (tree_width - row_widths[depth]) / 2
        y = _MARGIN + depth * (_NODE_H + _ROW_GAP)
        for n in row:
            pos[n["id"]] = (x, y, width_of[n["id"]])
            x += width_of[n["id"]] + _COL_GAP
    # The stale tensor to the right of the saver, the writes stacked below it.
    side_x = _MARGIN + tree_width + 70
    saver_pos = pos.get(graph.get("saver"))
    if saver_pos is not None:
        side_x = max(side_x, saver_pos[0] + saver_pos[2] + 130)
    side = [n for n in nodes if n.get("type") == "tensor"] + [n for n in nodes if n.get("type") == "write"]
    for i, n in enumerate(side):
        pos[n["id"]] = (side_x, _MARGIN + i * (_NODE_H + _ROW_GAP), width_of[n["id"]])
    width = max((x + w for x, _, w in pos.values()), default=0) + _MARGIN
    height = max((y + _NODE_H for _, y, _ in pos.values()), default=0) + _MARGIN
    return pos, width, height


def _style_key(node: dict[str, Any]) -> str:
    if node.get("role") in ("saver", "stale", "write"):
        return node["role"]
    if node.get("type") == "leaf":
        return "leaf_stale" if node.get("stale_alias") else "leaf"
    return "op"


def graph_svg(graph: dict[str, Any] | None) -> str:
    """Inline SVG of a captured graph (see ``backends/torch/_graph.py`` for the dict), or "" if none."""
    if not graph or not graph.get("nodes"):
        return ""
    pos, width, height = _layout(graph)
    legend_y = height + 6
    height += 34
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gg-graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="ui-monospace,Menlo,Consolas,monospace" '
        f'role="img" aria-label="autograd graph around the saver node">',
        "<defs>",
        '<marker id="gg-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#7f8fa3"/></marker>',
        '<marker id="gg-arrow-red" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c62828"/></marker>',
        '<marker id="gg-arrow-orange" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#d97800"/></marker>',
        "</defs>",
    ]
    for edge in graph.get("edges", []):
        a, b = pos.get(edge.get("from")), pos.get(edge.get("to"))
        if a is None or b is None:
            continue
        kind = edge.get("kind")
        if kind == "saved":
            x1, y1 = a[0] + a[2], a[1] + _NODE_H / 2
            x2, y2 = b[0], b[1] + _NODE_H / 2
            colour, marker, extra = "#d97800", "gg-arrow-orange", ' stroke-width="2.5"'
        elif kind == "write":
            x1, y1 = a[0] + a[2] / 2, a[1]
            x2, y2 = b[0] + b[2] / 2, b[1] + _NODE_H
            colour, marker, extra = "#c62828", "gg-arrow-red", ' stroke-width="3"'
        else:
            x1, y1 = a[0] + a[2] / 2, a[1] + _NODE_H
            x2, y2 = b[0] + b[2] / 2, b[1]
            colour, marker, extra = "#7f8fa3", "gg-arrow", ' stroke-width="1.3"'
        out.append(f'<line class="gg-edge gg-edge-{_h(kind)}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" '
                   f'y2="{y2:.1f}" stroke="{colour}"{extra} marker-end="url(#{marker})"/>')
        label = edge.get("label")
        if label and kind in ("saved", "write"):
            lx, ly = (x1 + x2) / 2, (y1 + y2) / 2 - 5
            anchor = "middle" if kind == "saved" else "start"
            if kind == "write":
                lx += 8
            out.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="12" fill="{colour}" text-anchor="{anchor}" '
                       f'font-weight="bold" paint-order="stroke" stroke="#fff" stroke-width="4">{_h(label)}</text>')
    for node in graph["nodes"]:
        p = pos.get(node["id"])
        if p is None:
            continue
        x, y, w = p
        key = _style_key(node)
        fill, stroke, stroke_w, dash = _STYLE[key]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<g class="gg-node gg-{key}" data-id="{_h(node["id"])}">')
        out.append(f'<title>{_h(node.get("label"))} {_h(node.get("detail"))}</title>')
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_NODE_H}" rx="7" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{stroke_w}"{dash_attr}/>')
        weight = ' font-weight="bold"' if key in ("saver", "stale", "write", "leaf_stale") else ""
        out.append(f'<text x="{x + 10:.1f}" y="{y + 19:.1f}" font-size="12" fill="#1f2328"{weight}>'
                   f'{_h(_clip(node.get("label", "")))}</text>')
        if node.get("detail"):
            out.append(f'<text x="{x + 10:.1f}" y="{y + 36:.1f}" font-size="11" fill="#57606a">'
                       f'{_h(_clip(node["detail"]))}</text>')
        out.append("</g>")
    legend = [("saver", "saved the tensor"), ("stale", "stale tensor"), ("write", "the write"),
              ("op", "autograd node"), ("leaf", "parameter / leaf")]
    x = _MARGIN
    for key, text in legend:
        fill, stroke, stroke_w, dash = _STYLE[key]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<rect x="{x}" y="{legend_y}" width="16" height="12" rx="3" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{min(stroke_w, 2)}"{dash_attr}/>')
        out.append(f'<text x="{x + 22}" y="{legend_y + 11}" font-size="11" fill="#57606a">{_h(text)}</text>')
        x += 30 + len(text) * 6.8
    if graph.get("truncated"):
        out.append(f'<text x="{x}" y="{legend_y + 11}" font-size="11" fill="#57606a">(graph cut off: '
                   f'deeper nodes not shown)</text>')
    out.append("</svg>")
    return "\n".join(out)


# -- finding -------------------------------------------------------------------------------------
def _src(code: str) -> str:
    return f'<pre class="src">{_h(code)}</pre>' if code else ""


def _write_item(w: WriteRecord) -> str:
    where = w.location.short if w.location else "an unknown line"
    via = f" via {_h(w.via)}" if w.via else ""
    versions = ""
    if w.version_before is not None:
        after = w.version_after if w.version_after is not None else "?"
        versions = f" (version {w.version_before} &rarr; {_h(after)})"
    silent = "" if w.bumps_version else ' <span class="silent">no version bump: invisible to the framework</span>'
    inside = f"<br><small>inside <code>{_h(w.library_frame)}</code></small>" if w.library_frame else ""
    code = _src(w.location.code) if w.location else ""
    return f"<li><code>{_h(w.op)}</code>{via} at <code>{_h(where)}</code>{versions}{silent}{code}{inside}</li>"


def finding_html(finding: Finding, *, graph: bool = True, raw: bool = False) -> str:
    """One finding as an HTML fragment (a ``<section>``): the facts, the why and the fix, the graph."""
    f = finding
    rows: list[str] = []

    def row(label: str, body: str, cls: str = "") -> None:
        rows.append(f'<tr class="{cls}"><th>{_h(label)}</th><td>{body}</td></tr>')

    row("tensor", f"<b>{_h(f.tensor.label)}</b>")
    if f.saved_at.node or f.saved_at.location:
        saver = f"<code>{_h(f.saved_at.op or '?')}</code>"
        if f.saved_at.location:
            saver += f", saved in the forward call at <code>{_h(f.saved_at.location.short)}</code>"
            saver += _src(f.saved_at.location.code)
        row("saved by", saver)
    if f.versions:
        row("versions", f"saved at {_h(f.versions.get('saved'))}, now {_h(f.versions.get('now'))}")
    if f.modified_at:
        label = "modified by" if f.kind in ("inplace_modification", "silent_write") else "at"
        row(label, '<ol class="writes">' + "".join(_write_item(w) for w in f.modified_at) + "</ol>")
    elif f.kind in ("inplace_modification", "silent_write"):
        row("modified by", "no write seen by gradguard")
    if f.context.get("rank") is not None:
        row("rank", _h(f.context["rank"]))
    for label, value in f.context.get("display", []):
        row(label, _h(value))
    if f.explanation:
        row("why", _h(f.explanation), "why")
    if f.suggestion:
        row("fix", _h(f.suggestion), "fix")
    for note in f.notes:
        row("note", _h(note), "note")
    parts = [
        f'<section class="finding" data-kind="{_h(f.kind)}" data-rule="{_h(f.rule)}">',
        f'<h2><span class="kind">{_h(f.kind)}</span>{_h(f.headline or f.kind)}</h2>',
        '<table class="facts">' + "".join(rows) + "</table>",
    ]
    svg = graph_svg(f.context.get("graph")) if graph else ""
    if svg:
        parts.append('<div class="graph"><h3>Autograd graph around the saver</h3>' + svg + "</div>")
    if raw:
        data = json.dumps(f.to_dict(), indent=2, default=str)
        parts.append(f'<details class="raw"><summary>JSON</summary><pre>{_h(data)}</pre></details>')
    parts.append("</section>")
    return "\n".join(parts)


def notebook_html(finding: Finding) -> str:
    """One finding for a notebook cell (``_repr_mimebundle_``'s ``text/html``): styled, scoped, with its graph."""
    return f'<div class="gg-report"><style>{_FINDING_CSS}</style>{finding_html(finding)}</div>'


def render_html(findings: Iterable[Finding], *, script: str | None = None, rank: int | None = None,
                world_size: int | None = None, exit_code: int | None = None) -> str:
    """A complete, self-contained HTML document reporting ``findings`` (possibly none)."""
    from .. import __version__

    findings = list(findings)
    meta = [f"gradguard {_h(__version__)}"]
    if script:
        meta.append(f"script <code>{_h(script)}</code>")
    if rank is not None:
        meta.append(f"rank {_h(rank)}" + (f" of {_h(world_size)}" if world_size is not None else ""))
    if exit_code is not None:
        meta.append(f"exit code {_h(exit_code)}")
    count = f"{len(findings)} finding" + ("" if len(findings) == 1 else "s")
    body = [f'<h1><span class="brand">gradguard</span> report: {count}</h1>',
            f'<div class="meta">{" &middot; ".join(meta)}</div>', '<div class="gg-report">']
    if findings:
        body += [finding_html(f, raw=True) for f in findings]
    else:
        body.append('<p class="none">No gradient hazards found.</p>')
    body.append("</div>")
    title = f"gradguard: {count}" + (f" ({script})" if script else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_h(title)}</title>\n<style>{_PAGE_CSS}{_FINDING_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
