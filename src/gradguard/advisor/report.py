"""The advisor's report: verified proposals, rejected candidates, unsafe in-place writes, measured figures."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..core.findings import SourceLocation

__all__ = ["Proposal", "RejectedCandidate", "UnsafeInplaceOp", "AdviceReport", "format_bytes"]


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"


def _plain(value):
    """A report value as JSON data: records (locations, proposals ...) as dicts, tuples and lists as lists."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


@dataclass
class Proposal(_Record):
    """Make this out-of-place op in-place. Only verified proposals reach ``AdviceReport.proposals``."""

    op: str  # aten::relu
    inplace_op: str  # aten::relu_
    location: SourceLocation | None
    module: str | None  # torch.nn module running the op (e.g. "ReLU"), when it is one
    operand: str  # "self" or "other"
    shape: tuple
    dtype: str
    tensor_bytes: int
    suggestion: str
    claimed_peak_saving: int  # from the recorded step, simulated
    measured_peak_saving: int | None = None  # from a run with only this rewrite applied
    gradients_identical: bool | None = None
    verified: bool = False
    note: str = ""
    occurrence: int = 1  # the n-th run of this op at this line in the step (a module used twice: 1, 2)


@dataclass
class RejectedCandidate:
    """An out-of-place op with an in-place form that must stay out-of-place, and why."""

    op: str
    location: SourceLocation | None
    operand: str
    shape: tuple
    reasons: list[tuple[str, str]]  # (rule code, detail)

    @property
    def codes(self) -> list[str]:
        return [c for c, _ in self.reasons]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "location": _plain(self.location), "operand": self.operand, "shape": list(self.shape),
                "reasons": [{"rule": c, "detail": d} for c, d in self.reasons]}


@dataclass
class UnsafeInplaceOp(_Record):
    kind: str  # raises | silent
    op: str
    location: SourceLocation | None
    saved_by: str | None
    saved_at: SourceLocation | None
    detail: str


@dataclass
class AdviceReport(_Record):
    proposals: list[Proposal] = field(default_factory=list)  # verified, with a peak saving
    unverified: list[Proposal] = field(default_factory=list)  # safe by the rules, but verification failed
    safe_without_peak_gain: list[Proposal] = field(default_factory=list)  # verified safe, frees nothing at peak
    rejected: list[RejectedCandidate] = field(default_factory=list)
    unsafe_inplace: list[UnsafeInplaceOp] = field(default_factory=list)
    baseline_peak: int = 0  # bytes, tracked live tensor storage allocated by the step
    rewritten_peak: int | None = None  # measured with every verified proposal applied
    claimed_total_saving: int = 0
    measured_total_saving: int | None = None
    gradients_identical: bool | None = None  # all verified proposals applied together
    baseline_seconds: float | None = None
    rewritten_seconds: float | None = None
    timing_runs: tuple = ((), ())  # every timed run (baseline seconds, rewritten seconds)
    ops_recorded: int = 0
    runs: int = 0
    memory_method: str = ""
    cuda_peaks: tuple | None = None  # (baseline, rewritten) from torch.cuda.max_memory_allocated, CUDA only
    allocator_peaks: tuple | None = None  # (baseline, rewritten): CPU allocator cross-check (torch.profiler)
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def rejected_with(self, code: str) -> list[RejectedCandidate]:
        return [r for r in self.rejected if code in r.codes]

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["timing_runs"] = {"baseline": list(self.timing_runs[0]), "rewritten": list(self.timing_runs[1])}
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The report in gradguard's JSON envelope (``report: "advise"``, schema ``advise.schema.json``):
        ``findings`` holds the verified proposals; every other list and figure keeps its ``to_dict`` key."""
        from ..report.json import dumps, envelope

        data = self.to_dict()
        return dumps(envelope("advise", data.pop("proposals"), **data), indent=indent)

    def render(self) -> str:
        step = f"{self.ops_recorded} aten ops recorded, " if self.ops_recorded else ""
        lines = ["gradguard advise: in-place memory advisor",
                 f"  step: {step}{self.runs} runs; memory = {self.memory_method}",
                 f"  baseline peak: {format_bytes(self.baseline_peak)}"]
        lines += self._proposal_lines() + self._measurement_lines() + self._other_lines()
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __str__ = render

    def _proposal_lines(self) -> list[str]:
        if not self.proposals:
            return ["\nno verified proposal: no out-of-place op can become in-place with a peak-memory gain"]
        lines = [f"\n{len(self.proposals)} verified proposal(s) (gradients bit-identical, peak drop measured):"]
        for i, p in enumerate(self.proposals, 1):
            where = (p.location.short if p.location else "?") + (
                f" (call #{p.occurrence})" if p.occurrence > 1 else "")
            lines.append(f"  {i}. {where}: {p.op} -> {p.inplace_op}  [{p.dtype}{list(p.shape)}, operand {p.operand}"
                         + (f", inside nn.{p.module}" if p.module else "") + "]")
            if p.location and p.location.code:
                lines.append(f"       {p.location.code}")
            lines.append(f"       suggestion: {p.suggestion}")
            lines.append(f"       frees at peak: claimed {format_bytes(p.claimed_peak_saving)}, "
                         f"measured {format_bytes(p.measured_peak_saving)}")
        return lines

    def _measurement_lines(self) -> list[str]:
        lines = []
        if self.rewritten_peak is not None and self.proposals:
            lines.append(f"\n  all verified proposals together: peak {format_bytes(self.baseline_peak)} -> "
                         f"{format_bytes(self.rewritten_peak)} (claimed -{format_bytes(self.claimed_total_saving)}, "
                         f"measured -{format_bytes(self.measured_total_saving)}), gradients identical: "
                         f"{self.gradients_identical}")
        if self.allocator_peaks is not None:
            a, b = self.allocator_peaks
            lines.append(f"  cross-check, CPU allocator peak (torch.profiler memory events, includes kernel scratch): "
                         f"{format_bytes(a)} -> {format_bytes(b)} (-{format_bytes(a - b)})")
        if self.baseline_seconds is not None and self.rewritten_seconds is not None:
            lines.append(f"  step time (median of {len(self.timing_runs[0])}"
                         + (", both under the accounting mode" if self.ops_recorded else "") + "): "
                         f"{self.baseline_seconds * 1e3:.1f} ms -> {self.rewritten_seconds * 1e3:.1f} ms"
                         + (f" (min {min(self.timing_runs[0]) * 1e3:.1f} -> {min(self.timing_runs[1]) * 1e3:.1f} ms)"
                            if self.timing_runs[0] else ""))
        return lines

    def _other_lines(self) -> list[str]:
        lines = []
        if self.safe_without_peak_gain:
            locs = ", ".join(sorted({p.location.short + (f" (call #{p.occurrence})" if p.occurrence > 1 else "")
                                     for p in self.safe_without_peak_gain if p.location}))
            lines.append(f"\n  {len(self.safe_without_peak_gain)} more op(s) are safe in place but free nothing at "
                         f"peak: {locs}")
        if self.unverified:
            lines.append(f"\n  {len(self.unverified)} candidate(s) failed verification (not proposed):")
            lines += [f"    {p.location.short if p.location else '?'} {p.op}: {p.note}" for p in self.unverified]
        if self.unsafe_inplace:
            lines.append(f"\n{len(self.unsafe_inplace)} unsafe in-place op(s):")
            lines += [f"  [{u.kind}] {u.detail}" for u in self.unsafe_inplace]
        if self.rejected:
            lines.append(f"\n{len(self.rejected)} out-of-place op(s) must stay out-of-place:")
            for r in self.rejected:
                where = r.location.short if r.location else "?"
                lines.append(f"  {where} {r.op} ({r.operand}): " + "; ".join(f"{c}: {d}" for c, d in r.reasons[:2]))
        return lines
