"""The verify loop of ``gradguard fix``: run, propose edits from the findings' fix intents, re-run, keep.

# NOTE [What "verified" means]
# An edit is kept only when a re-run of the edited program (same interpreter, arguments and working
# directory; edits held in memory, see gradguard._overlay) shows that it removed the finding it was made
# for: the run ends with no finding and the exit code a healthy run has (0 when the original only failed at
# the hazard), or the finding it targeted is gone and the next hazard of the same script surfaces (PyTorch
# stops at the first stale tensor, so a script with two hazards is repaired one round at a time; the whole
# set counts as a fix only when the last round runs clean: otherwise the earlier rounds' edits are dropped too
# and nothing is written, since one finding's signature going away is not the failure going away). Candidates
# come from the finding's own intents first, then from NOTE [Repairs from the mechanism, not the rule id].
# Silent writes have no failure to compare against: proving their edit needs gradients from a reference run
# without the writer, which the loop cannot produce for an arbitrary script, so it reports them unfixed and says
# so instead of guessing.
#
# NOTE [A repair that runs clean comes first]
# A repair that removes its hazard but lets the next one surface is kept only when no other repair of the same
# finding runs clean: moving gdrl SAC's policy loss after the critics' steps removes the first stale tensor, but
# the critic outputs it is built from are stale too, and no later round can move them; moving the policy's
# backward and step up to where its loss is made runs clean in one round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from .._overlay import COVERAGE_ENV, OVERLAY_ENV, read_coverage
from ..core.frames import LIBRARY_PATHS
from ..core.intents import FixIntent
from ..core.edits import EditNotApplicable, apply_intents
from .pytest_run import FIX_PYTEST_REPORT_ENV, is_pytest, pytest_argv
from .search import general_repairs, rebinds_a_lost_name, same_intent

__all__ = ["RunResult", "AcceptedEdit", "Unfixed", "FixOutcome", "run_guarded", "repair", "lost_gradients"]

# Kinds whose failure a re-run can check; silent kinds are reported, never "fixed" (see the NOTE).
_SILENT_KINDS = ("silent_write",)


@dataclass
class RunResult:
    exit_code: int
    findings: list[dict]
    stderr_tail: str = ""
    timed_out: bool = False
    coverage: list[dict] | None = None  # per backward: optimizer parameters "used", "reached" (sets), its "site"


@dataclass
class AcceptedEdit:
    intents: list[FixIntent]
    finding: dict  # the finding it removed (as in the JSON report)
    alternatives: list[FixIntent] = field(default_factory=list)
    base: dict[str, str] = field(default_factory=dict)  # the sources its lines refer to (earlier edits applied)

    @property
    def reason(self) -> str:
        text = "; ".join(dict.fromkeys(i.reason for i in self.intents if i.reason)) or self.intents[0].action
        if self.alternatives:
            other = self.alternatives[0]
            text += f" (also proposed, not verified: {other.reason or other.action}, line {other.line})"
        return text


@dataclass
class Unfixed:
    finding: dict
    why: str


@dataclass
class FixOutcome:
    original: dict[str, str]  # path -> source as on disk
    edited: dict[str, str]  # path -> source with the kept edits
    accepted: list[AcceptedEdit]
    unfixed: list[Unfixed]
    clean: bool  # the last run ended with no finding and a healthy exit code
    runs: int


def run_guarded(command: list[str], cwd: str, sources: dict[str, str], timeout: float,
                mode: str = "auto") -> RunResult:
    """One ``gradguard run --json`` of the program with ``sources`` overlaid; its exit code and findings.
    ``-m pytest`` runs pytest with the plugin instead (NOTE [Verifying an edit by re-running one test]).
    ``mode``: ``gradguard run --mode`` (forensic sees what only the write log sees: a module writing its
    caller's input)."""
    with tempfile.TemporaryDirectory(prefix="gradguard-fix-") as folder:
        report = os.path.join(folder, "report.json")
        env = dict(os.environ)
        env.pop(OVERLAY_ENV, None)
        coverage = os.path.join(folder, "coverage.json")
        env[COVERAGE_ENV] = coverage
        if sources:
            overlay = os.path.join(folder, "overlay.json")
            with open(overlay, "w", encoding="utf-8") as handle:
                json.dump(sources, handle)
            env[OVERLAY_ENV] = overlay
        argv = [sys.executable, "-m", "gradguard", "run", "--json", report,
                *(["--mode", mode] if mode != "auto" else []), *command]
        if is_pytest(command):
            argv, env[FIX_PYTEST_REPORT_ENV] = pytest_argv(command), report
        try:
            proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return RunResult(-1, [], "", timed_out=True)
        try:
            with open(report, encoding="utf-8") as handle:
                findings = json.load(handle).get("findings", [])
        except (OSError, ValueError):
            findings = []
        return RunResult(proc.returncode, findings, proc.stderr[-2000:], coverage=read_coverage(coverage))


def signature(finding: dict) -> tuple:
    """What identifies one hazard across runs (lines of the saver and the writes, the rule, the tensor)."""
    saved = finding.get("saved_at") or {}
    writes = tuple((w.get("file"), w.get("line")) for w in finding.get("modified_at") or ())
    return (finding.get("kind"), finding.get("rule"), saved.get("file"), saved.get("line"),
            (finding.get("tensor") or {}).get("name"), writes)


def candidate_repairs(finding: dict) -> list[tuple[list[FixIntent], list[FixIntent]]]:
    """(edits applied together, the alternatives) per repair, the preferred repair first (see
    NOTE [Preferred and alternative intents] in gradguard.core.intents)."""
    intents = [FixIntent.from_dict(d) for d in finding.get("fixes") or ()]
    preferred = [i for i in intents if i.preferred]
    others = [i for i in intents if not i.preferred]
    groups: dict[object, list[FixIntent]] = {}
    for index, intent in enumerate(others):
        groups.setdefault(intent.detail.get("group", ("single", index)), []).append(intent)
    repairs = [preferred] if preferred else []
    repairs += list(groups.values())
    return [(repair, [i for i in intents if i not in repair]) for repair in repairs]


def _editable(path: str | None) -> str | None:
    """Why gradguard will not edit ``path`` (library code, missing file); None when it may."""
    if not path:
        return "the edit names no file"
    if LIBRARY_PATHS.is_library(path):
        return f"{path} is library code; gradguard fix edits only your files"
    if not os.path.isfile(path):
        return f"{path} is not a file on disk"
    return None


def _apply(sources: dict[str, str], original: dict[str, str], intents: list[FixIntent]) -> dict[str, str]:
    by_file: dict[str, list[FixIntent]] = {}
    for intent in intents:
        problem = _editable(intent.file)
        if problem:
            raise EditNotApplicable(problem)
        by_file.setdefault(os.path.realpath(intent.file), []).append(intent)
    edited = dict(sources)
    for path, group in by_file.items():
        if path not in original:
            with open(path, encoding="utf-8") as handle:
                original[path] = handle.read()
        edited[path] = apply_intents(edited.get(path, original[path]), group)
    return edited


def _last_error(stderr: str) -> str:
    """`` (NameError: name 'x' is not defined)``: the last line of a traceback, when there is one."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return f" ({last[:160]})" if "Error" in last or "Exception" in last else ""


def lost_gradients(before: RunResult, after: RunResult) -> str | None:
    """Why the edited run cuts a gradient an optimizer step of the original run used (see NOTE [A fix must keep
    the gradients the optimizer uses]); None when every backward still reaches what its step used."""
    if not before.coverage:
        return None
    edited = _in_call_order(before.coverage, after.coverage or [])
    for index, entry in enumerate(before.coverage):
        after = edited[index] if index < len(edited) else {}
        # What the original's steps used, and, for an optimizer the edited run's next step would leave with no
        # gradient at all, what the original's backward reached of its parameters (the failing backward has no
        # step after it in the original run: a detach that lets a loop of micro-batches finish must not leave the
        # encoder's optimizer stepping on nothing).
        reached = after.get("reached", set())
        stepped = after.get("stepped", set())
        fed = {key.split(":")[0] for key in stepped & reached}
        used = entry.get("used", set()) | {key for key in entry.get("reached", set()) & stepped
                                           if key.split(":")[0] not in fed}
        missing = used - reached
        if missing:
            optimizers = sorted({int(key.split(":")[0]) + 1 for key in missing})
            return (f"backward call {index + 1} no longer reaches {len(missing)} of the {len(used)} parameters "
                    f"that the optimizer step after it updates (optimizer {', '.join(map(str, optimizers))} in the "
                    f"order they are made): the error goes away, but so does their gradient")
    return None


def _in_call_order(before: list[dict], after: list[dict]) -> list[dict]:
    """``after``'s backward passes matched to ``before``'s: positionally, unless the edit reordered the calls
    (a step moved with its loss's backward before another model's): then the n-th pass of each call site (its file
    and line text) to the n-th pass of the same site. An edit that rewrote a backward's line
    (`loss.backward(retain_graph=True)` -> `loss.backward()`) leaves a site the edited run lacks: positionally."""
    sites = [entry.get("site") for entry in before]
    edited = [entry.get("site") for entry in after]
    if None in sites or None in edited or sites == edited[:len(sites)] or not set(sites) <= set(edited):
        return after
    by_site: dict[str, list[dict]] = {}
    for entry in after:
        by_site.setdefault(entry["site"], []).append(entry)
    seen: dict[str, int] = {}
    matched = []
    for site in sites:
        nth = seen[site] = seen.get(site, -1) + 1
        matched.append(by_site[site][nth] if nth < len(by_site.get(site, ())) else {})
    return matched


def merged_losses(before: RunResult, after: RunResult) -> str | None:
    """Why the edited run trains two optimizers' parameters on one backward when the original trained each on
    its own (NOTE [One loss per optimizer stays one loss per optimizer]); None otherwise."""
    if not before.coverage or not after.coverage:
        return None

    def fed(entry: dict) -> set[str]:
        return {key.split(":")[0] for key in entry.get("used", ())}

    if any(len(fed(entry)) > 1 for entry in before.coverage):
        return None  # the program itself steps several optimizers on one loss
    for index, entry in enumerate(after.coverage):
        optimizers = sorted(int(o) + 1 for o in fed(entry))
        if len(optimizers) > 1:
            return (f"backward call {index + 1} would feed the steps of optimizers "
                    f"{', '.join(map(str, optimizers))} (in the order they are made), where each of the "
                    f"original's losses trains one optimizer's parameters: the error goes away, but one model "
                    f"would also train on another's loss")
    return None


# NOTE [One loss per optimizer stays one loss per optimizer]
# Moving `critic_opt.step()` after `actor_loss.backward()` ends the "modified by an inplace operation" error of
# an actor-critic loop, and so does any edit that lets a step consume gradients accumulated from a later loss:
# the critic then also descends the actor's loss. Where every backward of the original run feeds at most one
# optimizer (its own model's step), an edited run in which one backward feeds the steps of two is rejected; a
# program that steps several optimizers on one loss (an encoder's and a decoder's) is left alone.


def _healthy_exit(first: RunResult) -> int:
    """The exit code a repaired run should end with: 0 when the original failed at the hazard."""
    return 0 if first.findings else first.exit_code


def load_frameworks(findings: list[dict]) -> None:
    """Import the frameworks the findings came from into this process: the edits ask the framework's own tensor
    type which out-of-place methods exist (NOTE [Out-of-place methods come from the framework]), and core imports
    no framework itself."""
    import importlib

    for backend in dict.fromkeys(f.get("backend") or "torch" for f in findings):
        try:
            importlib.import_module(backend)
        except ImportError:
            pass  # then the edits follow the naming convention (``div_`` -> ``div``)


def repair(command: list[str], cwd: str, *, timeout: float, max_rounds: int = 6, mode: str = "auto",
           say: Callable[[str], None] = lambda text: None) -> tuple[RunResult, FixOutcome]:
    """Run ``command`` (``gradguard run``'s program words) and repair its findings round by round."""
    original: dict[str, str] = {}
    sources: dict[str, str] = {}
    first = run_guarded(command, cwd, sources, timeout, mode)
    load_frameworks(first.findings)
    runs = 1
    healthy = _healthy_exit(first)
    accepted: list[AcceptedEdit] = []
    unfixed: list[Unfixed] = []
    current = first
    seen: set[tuple] = set()
    # NOTE [Backtracking over partial repairs]: a round whose hazard goes while the next one surfaces keeps the
    # first such edit and remembers the others; when a later round finds no edit, the search returns to the
    # latest round with an untried one (moving a loss after a step may leave a second stale weight that only a
    # fresh forward, the other candidate, also repairs).
    choices: list[tuple[list, dict, int, RunResult, set, dict]] = []
    for _round in range(max_rounds):
        stop, why = _round_stop(current, seen, timeout)
        if stop:
            unfixed += [why] if why is not None else []
            break
        finding = current.findings[0]
        key = signature(finding)
        repairs = _round_repairs(finding, sources)
        kept, partials, tried, tries = _try_repairs(
            repairs, lambda edited: run_guarded(command, cwd, edited, timeout, mode), sources, original,
            key, first, healthy, say)
        runs += tries
        why = ("no proposed edit verified: " + "; ".join(tried) if repairs
               else f"no edit is known for this diagnosis ({finding.get('rule')})")
        if kept is None and not partials and choices:
            partials, sources, depth, current, seen, finding = choices.pop()
            del accepted[depth:]
            say("going back to an earlier round's other candidate")
        if kept is None and partials:
            kept = partials[0]
            if partials[1:]:
                choices.append((partials[1:], dict(sources), len(accepted), current, set(seen), finding))
        if kept is None:
            unfixed.append(Unfixed(finding, why))
            break
        intents, alternatives, edited, current = kept
        base = {path: sources.get(path, original[path]) for path in original}
        accepted.append(AcceptedEdit(intents, finding, alternatives, base))
        sources = edited
    else:
        if current.findings:
            unfixed.append(Unfixed(current.findings[0], f"still failing after {max_rounds} rounds of edits"))
    clean = not current.timed_out and not current.findings and current.exit_code == healthy
    if not clean and accepted:
        _note_dropped(accepted, unfixed)
        accepted, sources = [], {}
    return first, FixOutcome(original, sources, accepted, unfixed, clean, runs)


def _round_repairs(finding: dict, sources: dict) -> list:
    """The rule's repairs, then the general ones (NOTE [Repairs from the mechanism, not the rule id]) it lacks."""
    repairs = candidate_repairs(finding)
    repairs += [(extra, []) for extra in general_repairs(finding, sources, lambda p: _editable(p) is None)
                if not any(_same_repair(extra, known) for known, _ in repairs)]
    return [(intents, rest) for intents, rest in repairs if not any(map(rebinds_a_lost_name, intents))]


def _round_stop(current: RunResult, seen: set, timeout: float) -> tuple[bool, Unfixed | None]:
    """(whether the search ends before this round, why when that leaves a hazard unfixed); records the round's
    hazard in ``seen``."""
    if current.timed_out:
        return True, Unfixed({}, f"the run did not finish within {timeout:g} s")
    if not current.findings:
        return True, None
    finding = current.findings[0]
    key = signature(finding)
    if key in seen:
        return True, Unfixed(finding, "the same hazard came back after an edit meant to remove it")
    seen.add(key)
    if finding.get("kind") in _SILENT_KINDS:
        return True, Unfixed(finding, "a silent write has no failure to check an edit against; gradguard "
                                      "cannot verify a repair, so it offers none")
    return False, None


def _try_repairs(repairs: list, run: Callable, sources: dict, original: dict, key, first: RunResult, healthy,
                 say: Callable[[str], None]):
    """(kept, partials, tried, runs): each repair applied and re-run until one runs clean; the ones that only
    removed this hazard, and why the others were not kept."""
    kept = None
    partials: list = []
    tried: list[str] = []
    runs = 0
    for intents, alternatives in repairs:
        try:
            edited = _apply(sources, original, intents)
        except EditNotApplicable as problem:
            tried.append(f"{intents[0].action} at line {intents[0].line}: {problem}")
            continue
        say(f"trying {', '.join(f'{i.action} at line {i.line}' for i in intents)}")
        result = run(edited)
        runs += 1
        status, why = _verdict(result, key, first, healthy)
        if status == "clean":
            kept = (intents, alternatives, edited, result)
            break
        if status == "partial":
            # This hazard is gone and the next one surfaced: keep it unless another repair runs clean
            # (NOTE [A repair that runs clean comes first]).
            partials.append((intents, alternatives, edited, result))
        else:
            tried.append(f"{intents[0].action} at line {intents[0].line}: {why}")
    return kept, partials, tried, runs


def _verdict(result: RunResult, key, first: RunResult, healthy) -> tuple[str | None, str | None]:
    """("clean", None) when the edited run is healthy, ("partial", None) when only this hazard went, else
    (None, why the edit is not kept)."""
    gone = not any(signature(f) == key for f in result.findings)
    cut = None if result.timed_out else (lost_gradients(first, result) or merged_losses(first, result))
    if cut is not None:
        return None, cut
    if result.timed_out:
        return None, "the re-run timed out"
    if not result.findings and result.exit_code == healthy:
        return "clean", None
    made = result.findings[0] if result.findings else {}
    if made.get("kind") == "no_graph" and not any(f.get("kind") == "no_graph" for f in first.findings):
        # the edit cut the only path to what the backward needs (a detach of the loss): its failure, no new hazard
        message = (made.get("context") or {}).get("torch_message") or "nothing left to backpropagate"
        return None, f"the edited script exits {result.exit_code}, not {healthy} (RuntimeError: {message})"
    if result.findings and gone:
        return "partial", None
    if not result.findings:
        return None, f"the edited script exits {result.exit_code}, not {healthy}{_last_error(result.stderr_tail)}"
    return None, "the same hazard remains"


def _note_dropped(accepted: list[AcceptedEdit], unfixed: list[Unfixed]) -> None:
    # NOTE [What "verified" means]: an edit is kept only when the script's failure is gone, not when one
    # finding's signature went away.
    dropped = "; ".join(f"{edit.reason} (line {edit.intents[0].line})" for edit in accepted)
    note = (f" (the edits of the earlier rounds are not kept, since the script still fails with them: "
            f"{dropped})")
    if unfixed:
        unfixed[-1] = Unfixed(unfixed[-1].finding, unfixed[-1].why + note)


def _same_repair(a: list[FixIntent], b: list[FixIntent]) -> bool:
    return len(a) == len(b) and all(same_intent(x, y) for x, y in zip(a, b))
