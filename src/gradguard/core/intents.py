"""Fix intents: the structured edits a diagnosis rule proposes.

A rule states *what* to change in the user's source as data (an action, a file and line, the names it
acts on); ``gradguard fix`` turns an intent into a concrete-syntax-tree edit, applies it to a copy and
keeps it only if a re-run verifies it. Renderers show ``reason``; nothing here knows how to edit text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FixIntent", "ACTIONS", "Verdict", "out_of_place_method"]

# NOTE [Fix actions]
# Each action names one minimal, formatting-preserving edit of one statement (or two, for moves).
# ``line`` is the statement's first line in ``file``; ``target`` is the expression or name the edit
# acts on, written as in the source; ``detail`` holds the action's other arguments.
ACTIONS = {
    # `x = expr` -> `x = expr.detach()` (each name in detail["names"] for a tuple target)
    "detach_assignment": "detach the value assigned to `target` at `line`",
    # `f(..., a, ...)` -> `f(..., a.detach(), ...)`; detail["call"]: the callee text, e.g. "netD"
    "detach_argument": "detach the argument `target` of the call at `line`",
    # remove keyword detail["keyword"] from the call detail["call"] at `line` (retain_graph=True)
    "drop_keyword": "remove a keyword argument from a call",
    # set keyword detail["keyword"] of call detail["call"] at `line` to detail["value"] (inplace=True -> False);
    # detail["occurrence"]: which call of the callee in the statement; detail["position"]: the parameter's index
    # when it is passed positionally (`nn.ReLU(True)`)
    "set_keyword": "set a keyword argument of a call",
    # `x += y` -> `x = x + y` at `line`
    "augmented_to_binary": "rewrite an augmented assignment out of place",
    # `x.add_(y)` -> `x = x.add(y)`, `y = x.add_(v)` -> `x = x.add(v)` then `y = x`, `x[m] = v` ->
    # `x = x.masked_fill(m, v)` (detail["method"]); refused for a method without an out-of-place form (`normal_`)
    "inplace_to_out_of_place": "rewrite an in-place call or index assignment out of place",
    # `f(a)` -> `f(a.clone())` for the argument `target` of the call detail["call"] at `line`
    "clone_argument": "clone an argument before a call that writes into it",
    # `target` inside the statement at `line` replaced by detail["with"] (`scaler.scale(total).backward()` ->
    # `scaler.scale(loss).backward()`)
    "replace_expression": "replace an expression of a statement by another",
    # `if self.cache is None: self.cache = f(x)` -> `self.cache = f(x)`: the `if` at `line` (no else) replaced by its
    # body; detail["test"]: the condition as written
    "run_unconditionally": "run the body of an `if` every time",
    # move the statement at `line` to just after the statement at detail["after_line"]
    "move_statement": "move a statement after another",
    # insert detail["code"] as a new statement before `line` (same indentation)
    "insert_before": "insert a statement",
    # insert detail["code"] as a new statement after the statement at `line` (same indentation)
    "insert_after": "insert a statement after another",
    # `x = expr` -> `x = expr.clone()` at `line` (the value becomes a copy, not a view)
    "clone_assignment": "clone the value assigned to `target` at `line`",
    # replace the expression `target` in the statement at `line` by `target.clone()` (first occurrence)
    "clone_expression": "use a clone of an expression inside a statement",
    # replace the expression `target` in the statement at `line` by `target.detach()` (first occurrence)
    "detach_expression": "use a detached expression inside a statement",
    # wrap the statement at `line` in `with torch.no_grad():` (detail["context"] overrides the manager text)
    "wrap_no_grad": "run a statement under no_grad",
    # `buf[:], r = env.step(a)` -> `buf, r = env.step(a)`: bind `target` to the new value, not refill it
    "rebind_slice_target": "assign to a name instead of refilling its whole slice",
    # delete the statement at `line` (`target`: its code, checked before deleting); a block left empty gets `pass`
    "remove_statement": "delete a statement",
    # `for x in t:` -> `for i, x in enumerate(t):` + `x = t[i]` first in the body (also `x` inside a `zip(...)`
    # tuple); detail["index"]: the new index name. An indexed view can be written in place; an unbound one cannot.
    "index_loop_variable": "bind a for loop's variable to an indexed view of the tensor it iterates",
}

# NOTE [Preferred and alternative intents]
# ``Finding.fixes`` lists the preferred repair first. A repair may need several edits (detach the carried
# state AND drop retain_graph=True): all of them have preferred=True and are applied together. Each
# alternative repair comes after them with preferred=False; where an alternative needs several edits they
# share detail["group"] (an int), and ``gradguard fix`` tries one group at a time.


@dataclass(frozen=True)
class FixIntent:
    """One proposed edit of the user's source, as data."""

    action: str  # a key of ACTIONS
    file: str | None
    line: int | None
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # one line: why this edit fixes the finding (shown beside the hunk)
    preferred: bool = True  # False: an alternative, shown in the reason of the preferred one

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"FixIntent: unknown action {self.action!r}; expected one of {sorted(ACTIONS)}")

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "file": self.file, "line": self.line, "target": self.target,
                "detail": dict(self.detail), "reason": self.reason, "preferred": self.preferred}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FixIntent":
        return cls(data["action"], data.get("file"), data.get("line"), data.get("target"),
                   dict(data.get("detail") or {}), data.get("reason", ""), data.get("preferred", True))


@dataclass
class Verdict:
    """What one diagnosis rule concludes: its id, the "why" and "how to fix" text, and the same fix as data."""

    rule: str
    explanation: str
    suggestion: str
    fixes: list[FixIntent] = field(default_factory=list)
    display: list[tuple[str, str]] = field(default_factory=list)  # (label, text) lines shown before the probe's


# NOTE [Out-of-place methods come from the framework]
# `x.div_(n)` becomes `x = x.div(n)` (the ``inplace_to_out_of_place`` edit, core.edits) only when the tensor type
# has a method `div`: the table is the framework itself, not a list kept here. `normal_`, `uniform_`, `zero_`,
# `fill_`, `copy_` have no out-of-place method, so the repair for them writes into a clone instead (`x = x.clone()`
# first). `bernoulli_(p)` has a namesake with another meaning (`x.bernoulli()` draws with x as the probabilities), so
# it is treated as having none.
_OTHER_MEANING = {"bernoulli_"}


def out_of_place_method(name: str, namespace: bool = False) -> str | None:
    """``div_`` -> ``div``; None when the framework has no out-of-place method of that name (``normal_``).
    ``namespace``: look for a function of the module (``torch.relu`` for ``torch.relu_``) instead. The frameworks
    asked are those loaded in this process (core imports none: ``gradguard fix`` loads the script's framework
    before it edits, fix/_verify.load_frameworks)."""
    import sys

    if not name.endswith("_") or name.endswith("__") or name in _OTHER_MEANING:
        return None
    base = name[:-1]
    frameworks = [(sys.modules[m], getattr(sys.modules[m], "Tensor", None)) for m in ("torch", "paddle", "mindspore")
                  if m in sys.modules]
    if not frameworks:
        return base  # no framework to ask: trust the naming convention
    if any(callable(getattr(module if namespace else tensor, base, None)) for module, tensor in frameworks):
        return base
    return None
