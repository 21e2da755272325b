"""HTML rendering: a self-contained report (``gradguard run --html FILE``) and notebook fragments.

Everything is inline (CSS, SVG): the file opens offline, from a CI artifact, or in a mail attachment.
The picture of the autograd graph comes from ``finding.facts.graph`` (captured by the backend at error
time, see ``backends/torch/graph.py``); it is laid out here in simple layers, with no graphviz needed:

* the saver node on top, the nodes computing its inputs' gradients below it (one row per level);
* to the right of the saver, the stale tensor it saved (red), joined by a "saved <argument>" edge;
* below the stale tensor, each write that changed it (red, dashed), with an arrow into the tensor.
"""

from __future__ import annotations

import os
import re
from html import escape
from typing import Any, Iterable

from .._version import __version__
from ..core.findings import SAVED_TENSOR_KINDS, Finding, WriteRecord
from .json import dumps
from .text import _no_write, _saver_rows

__all__ = ["render_html", "finding_html", "notebook_html", "graph_svg", "OP_REPORT_CSS"]

_CHAR_W = 7.2  # px per character of 12px monospace
_NODE_H = 46
_ROW_GAP = 74
_COL_GAP = 22
_MARGIN = 20
_MAX_CHARS = 58

_STYLE = {
    # type/role -> (fill, stroke, stroke-width, dash attribute)
    "saver": ("#fff3dc", "#d97800", 3, ""),
    "op": ("#f2f5f9", "#7f8fa3", 1.2, ""),
    "leaf": ("#ecf7ec", "#4f944f", 1.2, ""),
    "leaf_stale": ("#ecf7ec", "#c62828", 2.5, ""),
    "stale": ("#fde7e7", "#c62828", 3, ""),
    "write": ("#fff0f0", "#c62828", 2, ' stroke-dasharray="6 4"'),
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
.gg-report td code{background:rgba(175,184,193,.2);padding:0 4px;border-radius:4px;word-break:break-word}
.gg-report pre.diff{margin:0;white-space:pre-wrap}.gg-report pre.diff .add{color:#1a6b2a}
.gg-report pre.diff .del{color:#a01010}.gg-report pre.diff .hunk{color:#555}
.gg-report tr.why td{color:#7a4a00}.gg-report tr.fix td{color:#1a6b2a;font-weight:500}
.gg-report .graph{margin-top:12px;border-top:1px solid #d8dee4;padding-top:10px;overflow-x:auto}
.gg-report .graph h3,.gg-report .raw summary{font-size:14px;margin:0 0 6px 0;color:#57606a}
"""


# check_op's report (``OpReport.to_html``), scoped under .gg-op: it fits the page or the notebook cell (fixed
# table layout, long code and tensors wrapped instead of widening the page).
OP_REPORT_CSS = """
.gg-op{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;color:#1f2328;
background:#fff;font-size:14px;max-width:1150px;border:2px solid #d0d7de;border-radius:8px;padding:12px 16px;
box-sizing:border-box;overflow-wrap:anywhere}
.gg-op p{margin:0 0 8px 0}
.gg-op table{border-collapse:collapse;width:100%;table-layout:fixed;margin:6px 0 10px 0}
.gg-op th{text-align:left;color:#57606a;font-weight:600;border-bottom:2px solid #d0d7de;padding:4px 8px}
.gg-op td{vertical-align:top;border-top:1px solid #d8dee4;padding:6px 8px}
.gg-op th:nth-child(1){width:76px}.gg-op th:nth-child(2){width:20%}.gg-op th:nth-child(3){width:9%}
.gg-op th:nth-child(4){width:6%}.gg-op th:nth-child(5){width:10%}
.gg-op td:first-child b{color:#cf222e;font-size:12px}
.gg-op code,.gg-op pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.gg-op pre{white-space:pre-wrap;background:#f6f8fa;border-left:3px solid #d0d7de;padding:4px 8px;margin:4px 0}
.gg-op ul{margin:6px 0;padding-left:20px;color:#57606a}
"""


def _h(text: Any) -> str:
    return escape("" if text is None else str(text), quote=True)


def _clip(text: str, limit: int = _MAX_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _prose(text: Any) -> str:
    """Escaped text with its `code` spans (Markdown backticks, as in the terminal) set as <code>."""
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", _h(text))


_WRITE_DETAIL = re.compile(r"^at (?P<path>.+?):(?P<line>\d+)(?:: (?P<code>.*))?$")


def _write_detail(detail: str, limit: int = _MAX_CHARS) -> str:
    """A write's "at path:line: code" cut to fit its box without losing the line number: the path gives way
    to its file name first, then the code is clipped."""
    match = _WRITE_DETAIL.match(detail)
    if match is None or len(detail) <= limit:
        return _clip(detail, limit)
    where = f"at {os.path.basename(match['path'])}:{match['line']}"
    code = match["code"]
    return _clip(f"{where}: {code}", limit) if code and len(where) + 4 < limit else where[:limit]


# NOTE [one box for the stale tensor]
# When the stale tensor is (a view of) a leaf of the drawn graph, e.g. AddmmBackward0 saved ``weight.t()``
# and TBackward0 leads to the parameter ``weight``, the graph dict has both the saved tensor and the leaf
# (``stale_alias``). They are one piece of memory: the picture draws one box, the tensor as backward saved
# it, says which leaf it views and in what shape, and the leaf's input edge points into that box.
def _merge_stale_alias(graph: dict[str, Any]) -> dict[str, Any]:
    nodes = graph.get("nodes", [])
    stale = next((n for n in nodes if n["id"] == graph.get("stale")), None)
    alias = next((n for n in nodes if n.get("stale_alias")), None)
    if stale is None or alias is None:
        return graph
    viewed = alias.get("detail", "").replace(": the stale tensor", "")
    merged = {**stale, "detail": "; ".join(x for x in (stale.get("detail"), f"view of {viewed}") if x)}
    edges = [{**e, "to": stale["id"], "kind": "alias"} if e.get("to") == alias["id"] else e
             for e in graph.get("edges", [])]
    return {**graph, "nodes": [merged if n is stale else n for n in nodes if n is not alias], "edges": edges}


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
    """Inline SVG of a captured graph (see ``backends/torch/graph.py`` for the dict), or "" if none."""
    if not graph or not graph.get("nodes"):
        return ""
    graph = _merge_stale_alias(graph)
    pos, width, height = _layout(graph)
    legend_y = height + 6
    height += 34
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gg-graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="ui-monospace,Menlo,Consolas,monospace" '
        f'role="img" aria-label="autograd graph around the saver node">',
        "<defs>",
        *(f'<marker id="gg-arrow{suffix}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
          f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
          for suffix, colour in (("", "#7f8fa3"), ("-red", "#c62828"), ("-orange", "#d97800"))),
        "</defs>",
    ]
    for edge in graph.get("edges", []):
        out += _edge_svg(edge, pos)
    for node in graph["nodes"]:
        out += _node_svg(node, pos)
    out += _legend_svg(legend_y, graph.get("truncated"))
    out.append("</svg>")
    return "\n".join(out)


def _edge_geometry(kind, a, b) -> tuple[float, float, float, float, str, str, str]:
    """x1, y1, x2, y2, colour, marker and extra attributes of an edge of ``kind`` from box ``a`` to box ``b``."""
    if kind == "saved":
        return (a[0] + a[2], a[1] + _NODE_H / 2, b[0], b[1] + _NODE_H / 2,
                "#d97800", "gg-arrow-orange", ' stroke-width="2.5"')
    if kind == "write":
        return (a[0] + a[2] / 2, a[1], b[0] + b[2] / 2, b[1] + _NODE_H,
                "#c62828", "gg-arrow-red", ' stroke-width="3"')
    if kind == "alias":  # a graph input that is the stale tensor's memory (NOTE [one box ...])
        return (a[0] + a[2], a[1] + _NODE_H / 2, b[0] + 16, b[1] + _NODE_H,
                "#c62828", "gg-arrow-red", ' stroke-width="1.5" stroke-dasharray="5 4"')
    return (a[0] + a[2] / 2, a[1] + _NODE_H, b[0] + b[2] / 2, b[1],
            "#7f8fa3", "gg-arrow", ' stroke-width="1.3"')


def _edge_svg(edge: dict[str, Any], pos) -> list[str]:
    a, b = pos.get(edge.get("from")), pos.get(edge.get("to"))
    if a is None or b is None:
        return []
    kind = edge.get("kind")
    x1, y1, x2, y2, colour, marker, extra = _edge_geometry(kind, a, b)
    out = [f'<line class="gg-edge gg-edge-{_h(kind)}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" '
           f'y2="{y2:.1f}" stroke="{colour}"{extra} marker-end="url(#{marker})"/>']
    label = edge.get("label")
    if label and kind in ("saved", "write"):
        lx, ly = (x1 + x2) / 2 + (8 if kind == "write" else 0), (y1 + y2) / 2 - 5
        anchor = "middle" if kind == "saved" else "start"
        out.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="12" fill="{colour}" text-anchor="{anchor}" '
                   f'font-weight="bold" paint-order="stroke" stroke="#fff" stroke-width="4">{_h(label)}</text>')
    return out


def _node_svg(node: dict[str, Any], pos) -> list[str]:
    p = pos.get(node["id"])
    if p is None:
        return []
    x, y, w = p
    key = _style_key(node)
    fill, stroke, stroke_w, dash_attr = _STYLE[key]
    out = [f'<g class="gg-node gg-{key}" data-id="{_h(node["id"])}">',
           f'<title>{_h(node.get("label"))} {_h(node.get("detail"))}</title>',
           f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_NODE_H}" rx="7" fill="{fill}" '
           f'stroke="{stroke}" stroke-width="{stroke_w}"{dash_attr}/>']
    weight = ' font-weight="bold"' if key in ("saver", "stale", "write", "leaf_stale") else ""
    out.append(f'<text x="{x + 10:.1f}" y="{y + 19:.1f}" font-size="12" fill="#1f2328"{weight}>'
               f'{_h(_clip(node.get("label", "")))}</text>')
    if node.get("detail"):
        detail = _write_detail(node["detail"]) if node.get("type") == "write" else _clip(node["detail"])
        out.append(f'<text x="{x + 10:.1f}" y="{y + 36:.1f}" font-size="11" fill="#57606a">'
                   f'{_h(detail)}</text>')
    out.append("</g>")
    return out


def _legend_svg(legend_y: float, truncated: Any) -> list[str]:
    legend = [("saver", "saved the tensor"), ("stale", "stale tensor"), ("write", "the write"),
              ("op", "autograd node"), ("leaf", "parameter / leaf")]
    out = []
    x = _MARGIN
    for key, text in legend:
        fill, stroke, stroke_w, dash_attr = _STYLE[key]
        out.append(f'<rect x="{x}" y="{legend_y}" width="16" height="12" rx="3" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{min(stroke_w, 2)}"{dash_attr}/>')
        out.append(f'<text x="{x + 22}" y="{legend_y + 11}" font-size="11" fill="#57606a">{_h(text)}</text>')
        x += 30 + len(text) * 6.8
    if truncated:
        out.append(f'<text x="{x}" y="{legend_y + 11}" font-size="11" fill="#57606a">(graph cut off: '
                   f'deeper nodes not shown)</text>')
    return out


def _src(location) -> str:
    return f'<pre class="src">{_h(location.code)}</pre>' if location and location.code else ""


def _write_item(w: WriteRecord) -> str:
    where = w.location.short if w.location else "an unknown line"
    via = f" via {_h(w.via)}" if w.via else ""
    versions = ""
    if w.version_before is not None:
        after = w.version_after if w.version_after is not None else "?"
        versions = f" (version {w.version_before} &rarr; {_h(after)})"
    silent = "" if w.bumps_version else ' <span class="silent">no version bump: invisible to the framework</span>'
    inside = f"<br><small>inside <code>{_h(w.library_frame)}</code></small>" if w.library_frame else ""
    code = _src(w.location)
    return f"<li><code>{_h(w.op)}</code>{via} at <code>{_h(where)}</code>{versions}{silent}{code}{inside}</li>"


def _diff(text: str) -> str:
    lines = []
    for line in _clip(str(text), 20_000).splitlines():
        cls = ("add" if line.startswith("+") and not line.startswith("+++") else
               "del" if line.startswith("-") and not line.startswith("---") else
               "hunk" if line.startswith("@@") else "")
        lines.append(f'<span class="{cls}">{_h(line)}</span>' if cls else _h(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def _write_rows(f: Finding, row) -> None:
    writes = [w for w in f.modified_at if w.category != "backward"]  # a freeing backward: the "freed by" row
    if writes:
        label = "modified by" if f.kind in SAVED_TENSOR_KINDS else "at"
        row(label, '<ol class="writes">' + "".join(_write_item(w) for w in writes) + "</ol>")
    elif f.kind in SAVED_TENSOR_KINDS:
        row("modified by", _no_write(f))


def finding_html(finding: Finding, *, graph: bool = True, raw: bool = False) -> str:
    """One finding as an HTML fragment (a ``<section>``): the facts, the why and the fix, the graph."""
    f = finding
    rows: list[str] = []

    def row(label: str, body: str, cls: str = "") -> None:
        rows.append(f'<tr class="{cls}"><th>{_h(label)}</th><td>{body}</td></tr>')

    row("tensor", f"<b>{_h(f.tensor.label)}</b>")
    for label, text, location in _saver_rows(f, lambda name: f"<code>{_h(name)}</code>"):
        row(label, text + _src(location))
    if f.versions:
        row("versions", f"saved at {_h(f.versions.get('saved'))}, now {_h(f.versions.get('now'))}")
    _write_rows(f, row)
    if f.facts.rank is not None:
        row("rank", _h(f.facts.rank))
    for label, value in f.facts.display or []:
        row(label, _prose(value))
    if f.explanation:
        row("why", _prose(f.explanation), "why")
    if f.suggestion:
        row("fix", _prose(f.suggestion), "fix")
    if f.facts.verified_fix:  # set by `gradguard fix --html`: the edit a re-run verified
        row("verified edit", _diff(f.facts.verified_fix), "diff")
    for note in f.notes:
        row("note", _prose(note), "note")
    parts = [
        f'<section class="finding" data-kind="{_h(f.kind)}" data-rule="{_h(f.rule)}">',
        f'<h2><span class="kind">{_h(f.kind)}</span>{_h(f.headline or f.kind)}</h2>',
        '<table class="facts">' + "".join(rows) + "</table>",
    ]
    svg = graph_svg(f.facts.graph) if graph else ""
    if svg:
        parts.append('<div class="graph"><h3>Autograd graph around the saver</h3>' + svg + "</div>")
    if raw:
        parts.append(f'<details class="raw"><summary>JSON</summary><pre>{_h(dumps(f.to_dict()))}</pre></details>')
    parts.append("</section>")
    return "\n".join(parts)


def notebook_html(finding: Finding) -> str:
    """One finding for a notebook cell (``_repr_mimebundle_``'s ``text/html``): styled, scoped, with its graph."""
    return f'<div class="gg-report"><style>{_FINDING_CSS}</style>{finding_html(finding)}</div>'


def render_html(findings: Iterable[Finding], *, script: str | None = None, rank: int | None = None,
                world_size: int | None = None, exit_code: int | None = None) -> str:
    """A complete, self-contained HTML document reporting ``findings`` (possibly none)."""
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
    body += [finding_html(f, raw=True) for f in findings] or ['<p class="none">No gradient hazards found.</p>']
    body.append("</div>")
    title = f"gradguard: {count}" + (f" ({script})" if script else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_h(title)}</title>\n<style>{_PAGE_CSS}{_FINDING_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
