"""Findings: the structured diagnosis that every renderer (text, rich, JSON, HTML) shows."""

from __future__ import annotations

import dataclasses
import linecache
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from .facts import Facts
from .intents import FixIntent
from .internal import log_fallback

__all__ = ["SourceLocation", "TensorInfo", "SaveSite", "WriteRecord", "Finding", "JSON_FORMAT_VERSION", "SAVED_TENSOR_KINDS",
           "SILENT_KINDS", "register_views"]

JSON_FORMAT_VERSION = 1

# NOTE [Findings do not import report]
# Data flows one way: findings are built in ``core`` and shown by ``report``. ``Finding.__str__`` and
# ``_repr_mimebundle_`` still need the renderers, so ``report`` registers them here when it is imported, and the
# top-level package imports ``report`` (``gradguard/__init__.py``): core never names the renderers. If they
# failed to load, a finding shows a one-line summary.
_text: Callable[[Finding], str] | None = None
_html: Callable[[Finding], str | None] | None = None


def register_views(text: Callable[[Finding], str], html: Callable[[Finding], str | None]) -> None:
    """Called by ``gradguard.report``: ``text(finding) -> str`` and ``html(finding) -> str``."""
    global _text, _html
    _text, _html = text, html


# Findings about a tensor saved for backward (or kept for it on a Function's ctx): they list the writes.
SAVED_TENSOR_KINDS = ("inplace_modification", "silent_write", "unchecked_write")
# Findings where the framework itself raises nothing: the gradient would be wrong without a word.
SILENT_KINDS = ("silent_write", "unchecked_write", "undeclared_input_write", "shared_grad_write", "module_input_write",
                "dropped_inner_update", "data_write_in_forward")


class SourceLocation:
    """A line of user code. The source text is read on first use: the pack hook creates one of these for
    every saved tensor, and almost none is ever shown."""

    __slots__ = ("file", "line", "function", "_code")

    def __init__(self, file: str, line: int, function: str, code: str | None = None):
        self.file = file
        self.line = line
        self.function = function
        self._code = code

    @property
    def code(self) -> str:
        if self._code is None:
            self._code = linecache.getline(self.file, self.line).strip()
        return self._code

    @property
    def short(self) -> str:
        return f"{display_path(self.file)}:{self.line}"

    def _key(self) -> tuple[str, int, str, str]:
        return (self.file, self.line, self.function, self.code)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceLocation) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"SourceLocation({self.file!r}, {self.line}, {self.function!r}, {self.code!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "SourceLocation | None":
        """Inverse of :meth:`to_dict`; None for no location (a missing dict or file)."""
        if not data or not data.get("file"):
            return None
        return cls(data["file"], data["line"], data.get("function") or "", data.get("code") or "")


def display_path(path: str) -> str:
    """Paths relative to the working directory when below it, so messages stay short and stable."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


@dataclass
class TensorInfo:
    """What the hazardous tensor is: a named parameter/buffer, or an activation described by shape."""

    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"
    name: str | None = None  # "rnn.weight_hh_l0" for parameters and buffers, else a variable name if known
    role: str = "tensor"  # parameter | buffer | leaf | activation | view | tensor
    producer: str | None = None  # autograd node that produced it, e.g. "SigmoidBackward0"

    @property
    def label(self) -> str:
        shape = "[" + ", ".join(str(s) for s in self.shape) + "]"
        head = f"{self.dtype}{shape}"
        if self.device != "cpu":
            head += f" on {self.device}"
        if self.name and self.role in ("parameter", "buffer"):
            return f"{self.role} {self.name} ({head})"
        if self.name:
            return f"{self.name} ({head}{', output of ' + self.producer if self.producer else ''})"
        return f"{head}, output of {self.producer}" if self.producer else f"{head}, {self.role}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        d["label"] = self.label
        return d


@dataclass
class SaveSite:
    """Who saved the tensor for backward: the autograd node, its argument, and the forward call."""

    node: str | None = None  # "AddmmBackward0"
    argument: str | None = None  # "mat2"
    location: SourceLocation | None = None
    chain: list[SourceLocation] = field(default_factory=list)  # the user's calls around it (the call of the model)

    @property
    def op(self) -> str | None:
        return f"{self.node}.{self.argument}" if self.node and self.argument else self.node

    def to_dict(self) -> dict[str, Any]:
        loc = self.location.to_dict() if self.location else {"file": None, "line": None, "function": None, "code": ""}
        return {"op": self.op, "node": self.node, "argument": self.argument, **loc,
                "chain": [c.to_dict() for c in self.chain]}


@dataclass
class WriteRecord:
    """One write into the tensor's memory after it was saved."""

    op: str  # "aten.add_.Tensor"
    location: SourceLocation | None  # the user's line
    via: str | None = None  # what the user called that did the write: "Adadelta.step()", "ReLU(inplace=True)"
    library_frame: str | None = None  # innermost library frame, e.g. "torch/optim/adadelta.py:302 in _single_tensor_adadelta"
    version_before: int | None = None
    version_after: int | None = None
    bumps_version: bool = True  # False: the framework cannot see this write (silent)
    category: str = "other"  # optimizer | activation | augmented_assign | index_assign | data_write | copy | kernel | other

    def to_dict(self) -> dict[str, Any]:
        loc = self.location.to_dict() if self.location else {"file": None, "line": None, "function": None, "code": ""}
        return {"op": self.op, **loc, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)[2:]}}


@dataclass
class Finding:
    """One diagnosed gradient hazard."""

    kind: str  # SAVED_TENSOR_KINDS | leaf_inplace | view_inplace | out_argument | backward_twice | ... (HEADLINES)
    tensor: TensorInfo
    saved_at: SaveSite = field(default_factory=SaveSite)
    modified_at: list[WriteRecord] = field(default_factory=list)
    versions: dict[str, int | None] = field(default_factory=dict)  # {"saved": 2, "now": 3}
    explanation: str = ""
    suggestion: str = ""
    headline: str = ""
    backend: str = "torch"
    rule: str = "generic"  # the diagnosis rule that produced explanation and suggestion
    facts: Facts = field(default_factory=Facts)  # what the producer saw besides the writes (JSON: "context")
    notes: list[str] = field(default_factory=list)  # what gradguard could not see
    fixes: list[FixIntent] = field(default_factory=list)  # structured edits for `gradguard fix`, preferred first

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": JSON_FORMAT_VERSION, "kind": self.kind, "headline": self.headline,
                "backend": self.backend, "tensor": self.tensor.to_dict(), "saved_at": self.saved_at.to_dict(),
                "modified_at": [w.to_dict() for w in self.modified_at], "versions": dict(self.versions),
                "explanation": self.explanation, "suggestion": self.suggestion, "rule": self.rule,
                "context": self.facts.to_dict(), "notes": list(self.notes), "fixes": [x.to_dict() for x in self.fixes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        """Inverse of :meth:`to_dict` (used to bring a finding back from a re-run in another process)."""
        location = SourceLocation.from_dict

        t = data["tensor"]
        tensor = TensorInfo(tuple(t["shape"]), t["dtype"], t.get("device", "cpu"), t.get("name"), t.get("role", "tensor"),
                            t.get("producer"))
        s = data.get("saved_at") or {}
        saved = SaveSite(s.get("node"), s.get("argument"), location(s),
                         [c for c in (location(entry) for entry in s.get("chain") or []) if c is not None])
        writes = [WriteRecord(w["op"], location(w), w.get("via"), w.get("library_frame"), w.get("version_before"),
                              w.get("version_after"), w.get("bumps_version", True), w.get("category", "other"))
                  for w in data.get("modified_at", [])]
        return cls(
            kind=data["kind"], tensor=tensor, saved_at=saved, modified_at=writes, versions=dict(data.get("versions", {})),
            explanation=data.get("explanation", ""), suggestion=data.get("suggestion", ""),
            headline=data.get("headline", ""), backend=data.get("backend", "torch"), rule=data.get("rule", "generic"),
            facts=Facts.from_dict(data.get("context")), notes=list(data.get("notes", [])),
            fixes=[FixIntent.from_dict(x) for x in data.get("fixes", [])],
        )

    def __str__(self) -> str:
        if _text is None:
            return f"gradguard finding: {self.kind} ({self.headline or self.rule})"
        return _text(self)

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        text = str(self)
        try:
            html = None if _html is None else _html(self)
        except Exception as internal:  # the text view must always work
            log_fallback("report.html", "the notebook HTML view of a finding", internal)
            html = None
        if html is None:
            html = "<pre>" + text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") + "</pre>"
        return {"text/plain": text, "text/html": html}
