"""Diagnosis: turn the facts of a finding (who saved, who wrote, when) into "why" and "how to fix".

Rules are framework-neutral: backends only tag each write with a category; the rules read the
categories, the user's source line and the pass counts.
"""

from __future__ import annotations

import re

from . import _inplace_rules
from ._findings import Finding, TensorInfo, WriteRecord

__all__ = ["diagnose", "diagnose_or_fallback", "classify_source", "HEADLINES"]

HEADLINES = {
    "inplace_modification": "a tensor saved for backward was modified in place before backward used it",
    "silent_write": "a tensor saved for backward changed without its version counter moving: "
    "gradients would be silently wrong",
    "leaf_inplace": "an in-place operation was applied to a leaf tensor that requires grad",
    "view_inplace": "an in-place operation was applied to a view that autograd cannot track",
    "backward_twice": "backward ran through a part of the graph that an earlier backward already freed",
}

_AUGMENTED = re.compile(r"[\w\)\]]\s*(\+|-|\*|/|//|%|\*\*|@|&|\||\^|>>|<<)=(?!=)")
_INDEX_ASSIGN = re.compile(r"\]\s*=(?!=)")


def classify_source(code: str) -> str | None:
    """Recognise the Python spelling of a write from the user's source line."""
    if ".data" in code:
        return "data_write"
    if _AUGMENTED.search(code):
        return "augmented_assign"
    if _INDEX_ASSIGN.search(code):
        return "index_assign"
    return None


def _first(writes: list[WriteRecord], category: str) -> WriteRecord | None:
    return next((w for w in writes if w.category == category), None)


def _where(write: WriteRecord) -> str:
    return write.location.short if write.location else "an unknown line"


def diagnose(finding: Finding) -> Finding:
    """Fill ``headline``, ``explanation``, ``suggestion`` and ``rule`` in place; returns the finding."""
    finding.headline = finding.headline or HEADLINES.get(finding.kind, finding.kind)
    if finding.kind in ("inplace_modification", "silent_write"):
        _name_from_write(finding)
        rule, why, fix = _saved_tensor_rules(finding)
    else:
        rule, why, fix = finding.rule, finding.explanation, finding.suggestion
    finding.rule = rule
    finding.explanation = finding.explanation or why
    finding.suggestion = finding.suggestion or fix
    return finding


def _name_from_write(f: Finding) -> None:
    """An unnamed activation gets the variable the user wrote it through (``out`` in ``out += identity``):
    that name is how the user knows the tensor."""
    if f.tensor.name:
        return
    for write in f.modified_at:
        if write.category in ("augmented_assign", "index_assign") and write.location is not None:
            from ._source_ast import written_expression

            f.tensor.name = written_expression(write.location.file, write.location.line)
            return


def _saved_tensor_rules(f: Finding) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    writes = f.modified_at
    passes = f.context.get("backward_passes_since_save") or 0
    retain = f.context.get("retain_graph")
    silent = f.kind == "silent_write"
    prefix = (
        "Its bytes changed while its version counter did not, so the framework's own check cannot see it. "
        if silent
        else ""
    )

    opt = _first(writes, "optimizer")
    if opt is not None:
        stepper = opt.via or "the optimizer step"
        if silent:
            return (
                "fused_optimizer",
                prefix + f"{stepper} at {_where(opt)} updated the parameter in place with a fused kernel that "
                f"does not bump the version counter, after {saver} saved it for a backward pass that had not run yet.",
                "Use the non-fused optimizer path (fused=False; foreach=True keeps most of the speed), and/or run "
                "every backward that needs this forward pass before the optimizer step.",
            )
        return _inplace_rules.optimizer_rule(f, opt, passes, retain)

    act = _first(writes, "activation")
    if act is not None:
        return _inplace_rules.activation_rule(f, act)

    data = _first(writes, "data_write")
    if data is not None:
        return (
            "data_write",
            prefix + f"The write at {_where(data)} went through `.data`, which has its own version counter, "
            f"so autograd does not see it; {saver} still needed the old values.",
            "Do not write through `.data`. Update the real tensor inside `with torch.no_grad():` (the version "
            "check then sees it), after the backward that needs the old values; or write into a `.clone()`.",
        )

    kernel = _first(writes, "kernel")
    if kernel is not None:
        if kernel.op.startswith("triton:"):
            who = f"The Triton kernel `{kernel.op[len('triton:'):]}`"
            who += f" (launched by {kernel.via})" if kernel.via else ""
        elif kernel.op.endswith((".forward", ".backward")):
            who = f"The custom autograd.Function {kernel.op}"
        else:
            who = f"{kernel.via or kernel.op}"
        return (
            "silent_kernel_write",
            prefix + f"{who}, called at {_where(kernel)}, wrote into memory that {saver} saved for backward.",
            "Kernel authors: write results into a fresh buffer (`torch.empty_like(x)`), or declare the write "
            "with `torch.autograd.graph.increment_version(x)` right after the kernel (or `ctx.mark_dirty(x)` and "
            "return x) so autograd can check it. Users: pass a copy (`op(x.clone())`) to the kernel.",
        )

    outside = _first(writes, "outside")
    if silent and (outside is not None or not writes):
        if outside is not None:
            where = outside.op.replace("write outside torch ", "", 1)
            why = (f"No torch op wrote it: the bytes changed {where}, in code that writes memory directly "
                   f"(a NumPy view from `.numpy()`, ctypes, DLPack, or a C++/CUDA extension using `data_ptr()`).")
        else:
            why = (f"No torch op, custom autograd.Function or Triton launch that gradguard watches wrote it, so the "
                   f"writer is code that writes memory directly: a NumPy view from `.numpy()`, ctypes, DLPack, or a "
                   f"C++/CUDA extension using `data_ptr()`. Re-run in bisect mode to pin it between two "
                   f"lines.")
        return (
            "silent_kernel_write",
            prefix + why + f" {saver} still needed the old values.",
            "Users: give NumPy/ctypes a copy (`t.detach().numpy().copy()`) or make the update with torch ops "
            "inside `with torch.no_grad():` on the real tensor. Extension authors: write into a fresh buffer, or "
            "call `torch.autograd.graph.increment_version(x)` after writing so autograd can check it.",
        )

    numpy_write = _first(writes, "numpy")
    if numpy_write is not None:
        return (
            "numpy_write",
            prefix + f"Memory shared with a NumPy/DLPack alias was written at {_where(numpy_write)}.",
            "Write through torch instead, inside `with torch.no_grad():`, or give NumPy a copy "
            "(`t.detach().cpu().numpy().copy()`).",
        )

    aug = _first(writes, "augmented_assign")
    if aug is not None:
        return _inplace_rules.augmented_rule(f, aug)

    idx = _first(writes, "index_assign")
    if idx is not None:
        return _inplace_rules.index_rule(f, idx)

    # DistributedDataParallel's forward broadcasts rank 0's buffers into every rank's buffers in place
    # (broadcast_buffers=True). It is the cause when every version-bumping write is DDP's own.
    ddp = [w for w in writes if "nn/parallel/distributed.py" in (w.library_frame or "").replace("\\", "/")]
    if ddp and all(w in ddp or not w.bumps_version for w in writes):
        return (
            "ddp_broadcast",
            prefix + f"DistributedDataParallel's forward at {_where(ddp[0])} copied rank 0's buffers into this "
            f"rank's buffers in place (broadcast_buffers=True, the default), after {saver} had saved this buffer "
            f"in an earlier forward pass whose backward had not run yet: that backward would use rank 0's values, "
            f"not the ones its forward used. (PyTorch >= 2.13 keeps the version counter during this broadcast, so "
            f"it computes the gradient silently wrong; earlier versions raise \"modified by an inplace operation\".)",
            "Run backward after each forward through the DDP model, or put both batches through one forward "
            "(torch.cat); or construct DDP with broadcast_buffers=False (forward_sync_buffers=False in PyTorch "
            ">= 2.13) and keep the buffers in sync yourself; for BatchNorm, convert the model with "
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).",
        )

    copy = _first(writes, "copy")
    if copy is not None and f.tensor.role == "buffer":
        return _inplace_rules.buffer_rule(f, copy)

    if not writes:
        return (
            "unseen_write",
            prefix + f"{saver} saved this tensor, and its version moved before backward used it, but gradguard "
            "saw no write: it happened before the guard was entered, in another thread, or in code that writes "
            "memory without going through the framework.",
            "Enter the guard earlier (or run the whole script with `gradguard run`) to see the write.",
        )

    first = writes[0]
    return (
        "generic_inplace",
        prefix + f"{first.op} at {_where(first)} wrote in place into a tensor that {saver} saved for backward.",
        "Clone before the in-place write (`y = x.clone()` and write into y), or use the out-of-place op.",
    )


def diagnose_or_fallback(build, *, kind: str, shape, dtype, backend: str) -> Finding:
    """``build()``; if gradguard itself fails there, a minimal finding that still reports the hazard.
    Every backend's error path uses this: our own failure must never hide the user's hazard."""
    try:
        return build()
    except Exception as internal:
        finding = Finding(kind=kind, tensor=TensorInfo(tuple(shape), str(dtype)), backend=backend)
        finding.notes.append(f"gradguard could not build the full diagnosis: {internal!r}")
        return diagnose(finding)
