"""Score gradguard's diagnoses on the real-world corpus (benchmarks/realworld/cases).

    .venv/bin/python benchmarks/realworld/score.py [--jobs 2] [--timeout 180] [--only 001,019] [--src DIR]
                                                   [--split development|validation|all]

The corpus is split in two halves by a hash of each case id (corpus.split_of): work on the development half
(`--split development`); score the validation half only when a piece of work is finished, and never tune to it.
Totals are reported for each half and for the whole, so the gap between the halves is visible.

Each case's buggy.py is copied to a temporary folder and run under `python -m gradguard run --json`; the
findings are compared with the case's key.json. Prints a per-case table and totals, writes results.md and
results.json next to this file (or --out DIR). Exits 0 whatever the figures are (thresholds are asserted
elsewhere); 2 when the corpus itself is malformed.

How each column is read (all lines are lines of the case's buggy.py):
  raised    loud and silent cases: at least one finding. correct programs (kind none): no finding at all.
  kind      some finding's kind is the key's kind (or one of kinds_accepted).
  tensor    some finding names the stale/modified tensor: tensor.name (or the name in tensor.label) equals an
            accepted name or ends with "." + an accepted name.
  saver     the line where the stale tensor was saved, or its enclosing call, is named: saved_at.line; for
            backward_twice also the line of the "carried by"/"crosses" row of context.display; for a module
            writing its caller's input the caller's later read (context.read), for a .data write in a forward
            the line using the parameter after it (context.used_at).
  writes    every write of the key is named: each group of accepted lines has one line among modified_at[].line
            (for backward_twice: the "freed by" row of context.display, the earlier backward).
  fixline   a line the hand fix edits is named anywhere (saver, writes, or "line N" in the explanation/suggestion).
  fix       `python -m gradguard fix --apply` on a copy leaves a script that exits 0 under plain python (loud
            cases) or runs under gradguard with no finding (silent cases); "n/a" while `gradguard fix` is absent.
  placeholder / badcode / wording: template text in any finding string; a backticked code suggestion that is not
            valid Python (ast.parse); GAN wording (generator/discriminator/GAN) for code that has no GAN.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus import SPLITS, Case, key_problems, load_cases  # noqa: E402

__all__ = ["main", "score_case"]

REPO = os.path.dirname(os.path.dirname(HERE))
PLACEHOLDERS = ("?[]", "<unknown>", "the tensor = the tensor", "<tensor>", "line None", "line ?", "{name}", "{line}",
                "None.clone()", "`None`", "TODO")
_LINE_RE = re.compile(r"\blines? (\d+)\b")
_BACKTICK_RE = re.compile(r"`([^`]+)`")
_NOT_CODE = ("gradguard ", "python ", "pip ", "git ")


def _env(src: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k != "graph":
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _frame_lines(entry, path: str) -> set[int]:
    """Lines of `path` named by one frame-like dict (file/line) and any nested frame lists (chains, stacks)."""
    lines = set()
    if not isinstance(entry, dict):
        return lines
    if entry.get("line") and entry.get("file") and os.path.realpath(entry["file"]) == path:
        lines.add(int(entry["line"]))
    for key in ("chain", "frames", "stack", "user_frames", "call_chain", "defined_at", "construction", "module_at"):
        nested = entry.get(key)
        if isinstance(nested, dict):
            lines |= _frame_lines(nested, path)
        elif isinstance(nested, list):
            for item in nested:
                lines |= _frame_lines(item, path)
    return lines


def _display_lines(finding: dict, words: tuple[str, ...]) -> set[int]:
    lines = set()
    for row in (finding.get("context") or {}).get("display") or []:
        if isinstance(row, (list, tuple)) and len(row) == 2 and any(w in str(row[0]).lower() for w in words):
            lines |= {int(n) for n in _LINE_RE.findall(str(row[1]))}
    return lines


def saver_lines(finding: dict, path: str) -> set[int]:
    lines = _frame_lines(finding.get("saved_at") or {}, path)
    context = finding.get("context") or {}
    for key in ("read", "used_at"):  # a module's caller reading its written input; a parameter used after .data
        lines |= _frame_lines(context.get(key) or {}, path)
    if finding.get("kind") == "backward_twice":
        lines |= _display_lines(finding, ("carried", "crosses", "created", "saved", "built"))
    return lines


def write_lines(finding: dict, path: str) -> set[int]:
    lines = set()
    for write in finding.get("modified_at") or []:
        lines |= _frame_lines(write, path)
    if finding.get("kind") == "backward_twice":
        lines |= _display_lines(finding, ("freed",))
    return lines


def tensor_candidates(finding: dict) -> list[str]:
    tensor = finding.get("tensor") or {}
    names = [tensor.get("name") or ""]
    label = tensor.get("label") or ""
    head = label.split(" (")[0].strip()
    names += [head, head.split(" ")[-1]]
    return [n for n in names if n]


def _name_ok(candidates: list[str], accepted: list[str]) -> bool:
    return any(c == a or c.endswith("." + a) for c in candidates for a in accepted)


def bad_code(text: str) -> list[str]:
    """Backticked snippets that are meant as code but are not valid Python. A method named in prose
    (`.detach()`) is not a code suggestion; a block header (`with torch.no_grad():`) is checked with a body."""
    bad = []
    for snippet in _BACKTICK_RE.findall(text):
        snippet = snippet.strip()
        if not snippet or snippet.startswith(_NOT_CODE) or " --" in snippet or snippet.startswith("."):
            continue
        candidate = snippet + "\n    pass" if snippet.endswith(":") else snippet
        try:
            ast.parse(candidate)
        except SyntaxError:
            bad.append(snippet)
    return bad


def _run_guarded(script: str, src: str, timeout: float) -> tuple[list, int, str, float]:
    out_json = script + ".findings.json"
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "gradguard", "run", "--json", out_json, script],
                              cwd=os.path.dirname(script), capture_output=True, text=True, timeout=timeout, env=_env(src))
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        return [], -9, "timeout", time.perf_counter() - start
    seconds = time.perf_counter() - start
    try:
        with open(out_json, encoding="utf-8") as handle:
            findings = json.load(handle)
    except (OSError, ValueError):
        findings = []
    if isinstance(findings, dict):  # the versioned envelope {"format_version", ..., "findings": [...]}
        findings = findings.get("findings", [])
    return findings, code, stderr, seconds


def fix_available(src: str) -> bool:
    proc = subprocess.run([sys.executable, "-m", "gradguard", "fix", "--help"], capture_output=True, text=True,
                          env=_env(src), timeout=120)
    return proc.returncode == 0 and "usage" in (proc.stdout + proc.stderr).lower()


def _fix_right(case: Case, src: str, timeout: float) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="gg_fix_") as tmp:
        script = os.path.join(tmp, "buggy.py")
        shutil.copy(case.buggy, script)
        proc = subprocess.run([sys.executable, "-m", "gradguard", "fix", "--apply", script], cwd=tmp,
                              capture_output=True, text=True, timeout=timeout, env=_env(src))
        if case.key["loud"]:
            plain = subprocess.run([sys.executable, script], cwd=tmp, capture_output=True, text=True,
                                   timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
            ok = plain.returncode == 0
            return ok, "" if ok else f"fix exit {proc.returncode}; plain run exit {plain.returncode}: {plain.stderr.strip()[-200:]}"
        findings, _, _, _ = _run_guarded(script, src, timeout)
        return not findings, "" if not findings else f"fix exit {proc.returncode}; still {len(findings)} finding(s)"


def score_case(case: Case, src: str, timeout: float, with_fix: bool) -> dict:
    key = case.key
    with tempfile.TemporaryDirectory(prefix="gg_case_") as tmp:
        script = os.path.join(tmp, "buggy.py")
        shutil.copy(case.buggy, script)
        path = os.path.realpath(script)
        findings, code, stderr, seconds = _run_guarded(script, src, timeout)
    row = {"id": case.id, "split": case.split, "kind": key["kind"], "loud": key["loud"], "exit": code, "seconds": round(seconds, 2),
           "n_findings": len(findings), "found_kinds": [f.get("kind") for f in findings],
           "rules": [f.get("rule") for f in findings]}
    texts = [s for f in findings for s in _strings(f)] + [stderr]
    row["placeholders"] = sorted({p for p in PLACEHOLDERS for t in texts if p in t})
    row["bad_code"] = sorted({b for f in findings for field in ("suggestion", "explanation")
                              for b in bad_code(f.get(field) or "")})
    with open(case.buggy, encoding="utf-8") as handle:
        source = handle.read().lower()
    gan_words = [w for w in ("discriminator", "generator", "gan ") for f in findings
                 if w in ((f.get("explanation") or "") + (f.get("suggestion") or "")).lower()]
    row["wording"] = sorted(set(gan_words)) if gan_words and "gan" not in source and "discriminator" not in source else []
    if case.correct:
        row["raised"] = not findings
        return row
    row["raised"] = bool(findings)
    row["kind_ok"] = any(f.get("kind") in case.accepted_kinds() for f in findings)
    row["tensor_named"] = [c for f in findings for c in tensor_candidates(f)]
    row["tensor_ok"] = _name_ok(row["tensor_named"], key["tensor_names"])
    named_savers = set().union(*[saver_lines(f, path) for f in findings]) if findings else set()
    named_writes = set().union(*[write_lines(f, path) for f in findings]) if findings else set()
    mentioned = {int(n) for f in findings for field in ("explanation", "suggestion")
                 for n in _LINE_RE.findall(f.get(field) or "")}
    row["saver_named"], row["writes_named"] = sorted(named_savers), sorted(named_writes)
    row["saver_ok"] = bool(named_savers & set(key["saver_lines"])) if key["saver_lines"] else None
    groups = [bool(set(g) & named_writes) for g in key["writes"]]
    row["writes_found"] = f"{sum(groups)}/{len(groups)}"
    row["writes_ok"] = all(groups)
    row["fixline_ok"] = bool(set(key["fix_lines"]) & (named_savers | named_writes | mentioned))
    row["fix_ok"], row["fix_note"] = None, "n/a"
    if with_fix:
        try:
            row["fix_ok"], row["fix_note"] = _fix_right(case, src, timeout)
        except subprocess.TimeoutExpired:
            row["fix_ok"], row["fix_note"] = False, "timeout"
    return row


def _pct(rows, field, pred=lambda r: True):
    vals = [r[field] for r in rows if pred(r) and r.get(field) is not None]
    return (sum(bool(v) for v in vals), len(vals))


def totals(rows: list[dict]) -> dict:
    hazards = [r for r in rows if r["kind"] != "none"]
    loud = [r for r in hazards if r["loud"]]
    return {
        "cases": len(rows), "loud": len(loud), "silent": len(hazards) - len(loud),
        "correct_programs": len(rows) - len(hazards),
        "raised_loud": _pct(loud, "raised"), "raised_silent": _pct(hazards, "raised", lambda r: not r["loud"]),
        "kind": _pct(hazards, "kind_ok"), "tensor": _pct(hazards, "tensor_ok"), "saver": _pct(hazards, "saver_ok"),
        "writes": _pct(hazards, "writes_ok"), "fixline": _pct(hazards, "fixline_ok"), "fix": _pct(loud, "fix_ok"),
        "fix_silent": _pct(hazards, "fix_ok", lambda r: not r["loud"]),
        "quiet_on_correct": _pct([r for r in rows if r["kind"] == "none"], "raised"),
        "placeholder_cases": sum(bool(r["placeholders"]) for r in rows),
        "bad_code_cases": sum(bool(r["bad_code"]) for r in rows),
        "gan_wording_cases": sum(bool(r["wording"]) for r in rows),
    }


def _mark(value) -> str:
    return "n/a" if value is None else ("yes" if value else "**no**")


def totals_by_split(rows: list[dict]) -> dict:
    """Totals for the whole run and for each half present in it."""
    out = {"all": totals(rows)}
    for split in SPLITS:
        half = [r for r in rows if r["split"] == split]
        if half:
            out[split] = totals(half)
    return out


def render_markdown(rows: list[dict], by_split: dict, header: str) -> str:
    def frac(pair):
        n, d = pair
        return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "n/a"

    columns = [c for c in ("development", "validation", "all") if c in by_split]
    if len(columns) == 2:  # one half only: its column equals the whole
        columns = columns[:1]
    out = [f"# gradguard on the real-world corpus\n\n{header}\n", "## Totals\n",
           "| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    labels = [("raised_loud", "finding raised, loud cases"), ("raised_silent", "finding raised, silent cases"),
              ("kind", "kind right"), ("tensor", "tensor named (parameter/variable name)"),
              ("saver", "saver line (or enclosing call)"), ("writes", "every write line named"),
              ("fixline", "a line the hand fix edits is named"), ("fix", "`gradguard fix --apply` leaves a loud case running clean under plain python"),
              ("fix_silent", "silent cases left with no finding by `gradguard fix --apply` (it makes only edits a re-run verifies)"),
              ("quiet_on_correct", "no finding on correct programs")]
    for field, label in labels:
        out.append(f"| {label} | " + " | ".join(frac(by_split[c][field]) for c in columns) + " |")
    for field, label in (("placeholder_cases", "cases with placeholder text"),
                         ("bad_code_cases", "cases with a code suggestion that is not valid Python"),
                         ("gan_wording_cases", "cases with GAN wording for non-GAN code")):
        out.append(f"| {label} | " + " | ".join(str(by_split[c][field]) for c in columns) + " |")
    for c in columns:
        t = by_split[c]
        out.append(f"\n{c}: {t['cases']} cases: {t['loud']} loud, {t['silent']} silent, "
                   f"{t['correct_programs']} correct programs.")
    out += ["\n## Per case\n",
            "| case | half | kind | raised | kind ok | tensor (named) | saver (named) | writes | fix line | fix | notes |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = []
        if r["placeholders"]:
            notes.append("placeholder " + ", ".join(f"`{p}`" for p in r["placeholders"]))
        if r["bad_code"]:
            notes.append("invalid code " + "; ".join(f"`{b[:40]}`" for b in r["bad_code"]))
        if r["wording"]:
            notes.append("GAN wording")
        if r["exit"] == -9:
            notes.append("timeout")
        notes.append(f"{r['seconds']:.1f}s")
        if r["kind"] == "none":
            found = ", ".join(k or "?" for k in r["found_kinds"]) or "-"
            out.append(f"| {r['id']} | {r['split'][:3]} | none | {'quiet' if r['raised'] else '**' + found + '**'} | | | | | | | "
                       f"{'; '.join(notes)} |")
            continue
        tensor = ", ".join(dict.fromkeys(r["tensor_named"]))[:40] or "-"
        out.append(
            f"| {r['id']} | {r['split'][:3]} | {r['kind']} | {_mark(r['raised'])} | {_mark(r['kind_ok'])} | {_mark(r['tensor_ok'])} "
            f"({tensor}) | {_mark(r['saver_ok'])} ({','.join(map(str, r['saver_named'])) or '-'}) | "
            f"{r['writes_found']} ({','.join(map(str, r['writes_named'])) or '-'}) | {_mark(r['fixline_ok'])} | "
            f"{_mark(r['fix_ok']) if r['fix_ok'] is not None else r['fix_note']} | {'; '.join(notes)} |")
    out.append("\n## Failing cases per metric\n")
    for field, label in labels[:-1]:
        failing = [r["id"] for r in rows if r["kind"] != "none" and r.get(field + "_ok", r.get(field)) is False
                   and not (field.startswith("raised") and (r["loud"] != (field == "raised_loud")))]
        if field in ("raised_loud", "raised_silent"):
            failing = [r["id"] for r in rows if r["kind"] != "none" and not r["raised"]
                       and r["loud"] == (field == "raised_loud")]
        if field in ("fix", "fix_silent"):  # one fix_ok per case, counted apart for loud and silent cases
            failing = [r["id"] for r in rows if r["kind"] != "none" and r["fix_ok"] is False
                       and r["loud"] == (field == "fix")]
        out.append(f"- **{label}**: {', '.join(failing) or 'none'}")
    noisy = [r["id"] for r in rows if r["kind"] == "none" and not r["raised"]]
    out.append(f"- **finding on a correct program**: {', '.join(noisy) or 'none'}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--only", default="", help="comma-separated case id prefixes")
    parser.add_argument("--src", default=os.path.join(REPO, "src"), help="gradguard sources to score (first on PYTHONPATH)")
    parser.add_argument("--out", default=HERE, help="folder for results.md and results.json")
    parser.add_argument("--no-fix", action="store_true", help="skip the `gradguard fix` check")
    parser.add_argument("--split", choices=SPLITS + ("all",), default="all",
                        help="score one half only (development while working; validation only when work is done)")
    options = parser.parse_args(argv)
    cases = load_cases()
    problems = {c.id: key_problems(c) for c in cases}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        for case_id, found in problems.items():
            print(f"malformed case {case_id}: {'; '.join(found)}", file=sys.stderr)
        return 2
    if options.only:
        prefixes = options.only.split(",")
        cases = [c for c in cases if any(c.id.startswith(p) for p in prefixes)]
    if options.split != "all":
        cases = [c for c in cases if c.split == options.split]
    with_fix = not options.no_fix and fix_available(options.src)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        rows = list(pool.map(lambda c: score_case(c, options.src, options.timeout, with_fix), cases))
    by_split = totals_by_split(rows)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    header = (f"Scored by `benchmarks/realworld/score.py` against gradguard at `{commit or '?'}` (sources: "
              f"`{os.path.relpath(options.src, REPO)}`), {len(rows)} cases ({options.split}), "
              f"{time.perf_counter() - start:.0f} s with "
              f"{options.jobs} jobs. `gradguard fix`: {'checked' if with_fix else 'not available (fix column n/a)'}.")
    text = render_markdown(rows, by_split, header)
    print(text)
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(options.out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    with open(os.path.join(options.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"summary": by_split["all"], "summary_by_split": by_split, "cases": rows}, handle, indent=1)
        handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
