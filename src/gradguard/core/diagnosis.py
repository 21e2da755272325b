"""Diagnosis: turn the facts of a finding (who saved, who wrote, when) into "why" and "how to fix".

Rules are framework-neutral: backends only tag each write with a category; the rules read the
categories, the user's source line and the pass counts.
"""

# NOTE [Diagnosis as data]
# ``RULES`` is an ordered table; the first row whose ``when`` matches the finding's facts decides. ``when``
# returns the write the rule is about (or True when it needs none), ``build`` returns a Verdict: the rule id,
# the explanation and suggestion text, and the same fix as FixIntents (preferred first). Text and intents
# are built in one place from the same facts, so the hunk ``gradguard fix`` applies is the edit the text
# describes. A Verdict's ``display`` lines go before those the probe set (PyTorch's eager errors, core/eager_rules.py).

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from . import eager_rules as E
from . import inplace_rules as _inplace_rules
from .inplace_rules import _saver, _where
from .findings import SAVED_TENSOR_KINDS, Finding, SourceLocation, TensorInfo, WriteRecord
from .intents import FixIntent, Verdict
from .fixes import keyword_calls, out_of_place, statement_code
from .source_ast import callee_of, parse_code, parse_statement, written_expression

__all__ = ["diagnose", "diagnose_or_fallback", "classify_source", "saves_running_stat", "HEADLINES", "Rule", "RULES"]

HEADLINES = {
    "inplace_modification": "a tensor saved for backward was modified in place before backward used it",
    "silent_write": "a tensor saved for backward changed without its version counter moving: "
    "gradients would be silently wrong",
    "leaf_inplace": "an in-place operation was applied to a leaf tensor that requires grad",
    "view_inplace": "an in-place operation was applied to a view that autograd cannot track",
    "out_argument": "an op wrote its result through out= while autograd was recording: PyTorch cannot "
    "differentiate a write through out=",
    "requires_grad_flag": "requires_grad was changed in place on a tensor autograd computed (not a leaf): "
    "only a leaf's flag can change",
    "backward_twice": "backward ran through a part of the graph that an earlier backward already freed",
    "no_graph": "backward was asked for a tensor autograd never recorded: nothing on its path requires grad",
    "non_leaf_grad": "a gradient was read from a tensor backward fills no .grad for (a computed tensor, or one that "
    "does not require grad), so the read got None",
    "non_leaf_param": "an optimizer was given a tensor autograd computed (not a leaf): backward keeps .grad only "
    "for leaves, so it could never update it",
    "unchecked_write": "a tensor a custom autograd.Function kept on ctx (not saved with save_for_backward) was "
    "modified in place before backward used it: PyTorch does not check it, gradients would be silently wrong",
    "undeclared_input_write": "a custom autograd.Function's forward wrote into its input in place without "
    "ctx.mark_dirty: autograd still sees the input unchanged, gradients would be silently wrong",
    "shared_grad_write": "a gradient that another part of the graph still needs was modified in place during "
    "backward: that part would get the modified gradient, silently",
    "dropped_inner_update": "a parameter was updated in place after a create_graph gradient was taken for it, and "
    "backward never went through that gradient: the meta-gradient silently ignores the update",
    "data_write_in_forward": "a forward changed its parameter through .data before using it: autograd never sees "
    "the change, the gradient ignores it",
    "module_input_write": "a module wrote into its input in place and the caller read that tensor again: the "
    "forward silently computes with the modified values",
}

_AUGMENTED = re.compile(r"[\w\)\]]\s*(\+|-|\*|/|//|%|\*\*|@|&|\||\^|>>|<<)=(?!=)")
_INDEX_ASSIGN = re.compile(r"\]\s*=(?!=)")


def classify_source(code: str) -> str | None:
    """Recognise the Python spelling of a write from the user's source line."""
    if ".data" in code:
        return "data_write"
    if _AUGMENTED.search(code):
        return "augmented_assign"
    return "index_assign" if _INDEX_ASSIGN.search(code) else None


def _first(writes: list[WriteRecord], category: str) -> WriteRecord | None:
    return next((w for w in writes if w.category == category), None)


def diagnose(finding: Finding) -> Finding:
    """Fill ``headline``, ``explanation``, ``suggestion``, ``rule`` and ``fixes`` in place; returns the finding."""
    finding.headline = finding.headline or HEADLINES.get(finding.kind, finding.kind)
    if finding.kind in SAVED_TENSOR_KINDS or finding.kind in _HYGIENE_KINDS or finding.facts.eager_check:
        _name_from_write(finding)
        verdict = _apply_rules(finding)
        finding.rule = verdict.rule
        if verdict.display:
            finding.facts.display = [*verdict.display, *(finding.facts.display or [])]
        explanation = verdict.explanation
        on_ctx = bool(finding.saved_at.argument and finding.saved_at.argument.startswith("ctx."))
        if on_ctx:
            explanation = (f"Backward reads it from `{finding.saved_at.argument}`, an attribute of ctx, not through "
                           f"save_for_backward, so PyTorch never compares its version. ") + explanation
        finding.explanation = finding.explanation or explanation
        finding.suggestion = finding.suggestion or verdict.suggestion
        if not finding.fixes:
            finding.fixes = list(verdict.fixes)
        if on_ctx:
            attribute = finding.saved_at.argument[len("ctx."):].split("[", 1)[0]  # type: ignore[index]  # on_ctx: a str
            finding.notes.append(
                f"In the Function, keep the tensor with `ctx.save_for_backward({attribute})` instead of "
                f"`ctx.{attribute} = ...` and read it back from `ctx.saved_tensors` in backward: PyTorch then checks "
                f"its version and raises at such a write (PyTorch's documentation asks for this).")
    return finding


def _name_from_write(f: Finding) -> None:
    """An unnamed activation gets the variable the user wrote it through (``out`` in ``out += identity``):
    that name is how the user knows the tensor."""
    if f.tensor.name:
        return
    for write in f.modified_at:
        if write.category in ("augmented_assign", "index_assign") and write.location is not None:
            f.tensor.name = written_expression(write.location.file, write.location.line)
            return


@dataclass(frozen=True)
class Rule:
    """One row of the diagnosis table: ``when`` reads the finding's facts and returns what the rule is about
    (a write, or True) or None; ``build`` turns that into the verdict (text and fix intents)."""

    name: str
    when: Callable[[Finding], Any]
    build: Callable[[Finding, Any], Verdict]


def _apply_rules(f: Finding) -> Verdict:
    for rule in RULES:
        subject = rule.when(f)
        if subject is not None and subject is not False:
            return rule.build(f, subject)
    raise AssertionError("the last rule always matches")  # pragma: no cover


def _write(category: str, *, silent: bool | None = None,
           extra: Callable[[Finding, WriteRecord], object] | None = None) -> Callable[[Finding], WriteRecord | None]:
    """``when`` for the rules keyed on a write category (optionally only for silent or loud findings)."""

    def when(f: Finding) -> WriteRecord | None:
        if silent is not None and (f.kind == "silent_write") != silent:
            return None
        write = _first(f.modified_at, category)
        return None if write is None or (extra is not None and not extra(f, write)) else write

    return when


def _prefix(f: Finding) -> str:
    return "Its bytes changed while its version counter did not, so the framework's own check cannot see it. " \
        if f.kind == "silent_write" else ""


# A step between a forward and its backward: torch's version check saw it (and no backward ran since the save), or
# the framework's optimizers bump no version counter at all (a silent write, whatever the pass).
_stepped_before_backward = _write("optimizer", silent=False,
                                  extra=lambda f, w: (f.facts.backward_passes_since_save or 0) < 1)
_unversioned_step = _write("optimizer", silent=True, extra=lambda f, w: f.facts.optimizers_bump_versions is False)


def _fused_optimizer(f: Finding, opt: WriteRecord) -> Verdict:
    stepper = opt.via or "the optimizer step"
    return Verdict(
        "fused_optimizer",
        _prefix(f) + f"{stepper} at {_where(opt)} updated the parameter in place with a fused kernel that "
        f"does not bump the version counter, after {_saver(f)} saved it for a backward pass that had not run yet.",
        "Use the non-fused optimizer path (fused=False; foreach=True keeps most of the speed), and/or run "
        "every backward that needs this forward pass before the optimizer step.",
    )


def _data_write(f: Finding, data: WriteRecord) -> Verdict:
    fixes = []
    if data.location is not None:
        fixes.append(FixIntent("wrap_no_grad", data.location.file, data.location.line, target=None,
                               detail={"replace": ".data"},
                               reason="write the real tensor under no_grad so the version check sees it"))
    return Verdict(
        "data_write",
        _prefix(f) + f"The write at {_where(data)} went through `.data`, which has its own version counter, "
        f"so autograd does not see it; {_saver(f)} still needed the old values.",
        "Do not write through `.data`. Update the real tensor inside `with torch.no_grad():` (the version "
        "check then sees it), after the backward that needs the old values; or write into a `.clone()`.",
        fixes,
    )


def _optimizer_before_backward(f: Finding, opt: WriteRecord) -> Verdict:
    verdict = _inplace_rules.optimizer_before_backward_rule(f, opt)
    if f.facts.optimizer_fix is None or f.kind != "silent_write":
        return verdict
    # a framework whose optimizers bump no version counter (Paddle, MindSpore): the cause is the order of the calls
    framework = f.facts.framework or "the framework"
    verdict.explanation = (
        f"{opt.via} at {_where(opt)} updated {f.tensor.name or 'a parameter'} in place after {f.saved_at.op or 'an op'} "
        f"saved it for a backward pass that had not run yet. {framework}'s optimizers do not bump the version counter, "
        f"so {framework} computes that backward with the updated values and no error.")
    verdict.suggestion = f.facts.optimizer_fix
    return verdict


def _direct_write_words(f: Finding, verdict: Verdict) -> Verdict:
    """A write no op of a framework other than torch made: its own words (the core text names torch's ways)."""
    if f.facts.direct_writers is None:
        return verdict
    framework, writers = f.facts.framework or "framework", f.facts.direct_writers
    outside = _first(f.modified_at, "outside")
    if outside is not None:
        where = outside.location.short if outside.location else "before the first traced line"
        why = f"No {framework} op wrote it: bisect mode saw its bytes change at {where}, in {writers}."
    else:
        why = (f"No {framework} op that gradguard watches wrote it, so the writer is {writers}. Re-run with "
               f"`gradguard.guard(bisect=True)` to pin it to a line.")
    verdict.explanation = f"{why} {f.saved_at.op or 'the op that saved it'} still needed the old values."
    verdict.suggestion = f.facts.direct_write_fix or verdict.suggestion
    return verdict


def _kernel_write(f: Finding, kernel: WriteRecord) -> Verdict:
    if kernel.op.startswith("triton:"):
        who = f"The Triton kernel `{kernel.op[len('triton:'):]}`"
        who += f" (launched by {kernel.via})" if kernel.via else ""
    elif kernel.op.endswith((".forward", ".backward")):
        who = f"The custom autograd.Function {kernel.op}"
    else:
        who = f"{kernel.via or kernel.op}"
    return _direct_write_words(f, Verdict(
        "silent_kernel_write",
        _prefix(f) + f"{who}, called at {_where(kernel)}, wrote into memory that {_saver(f)} saved for backward.",
        "Kernel authors: write results into a fresh buffer (`torch.empty_like(x)`), or declare the write "
        "with `torch.autograd.graph.increment_version(x)` right after the kernel (or `ctx.mark_dirty(x)` and "
        "return x) so autograd can check it. Users: pass a copy (`op(x.clone())`) to the kernel.",
    ))


def _outside_when(f: Finding) -> WriteRecord | bool | None:
    if f.kind != "silent_write":
        return None
    return _first(f.modified_at, "outside") or (True if not f.modified_at else None)


def _outside_write(f: Finding, outside: WriteRecord | bool) -> Verdict:
    if isinstance(outside, WriteRecord):
        where = outside.op.replace("write outside torch", "", 1).strip() or f"at {_where(outside)}"
        why = (f"No torch op wrote it: the bytes changed {where}, in code that writes memory directly "
               f"(a NumPy view from `.numpy()`, ctypes, DLPack, or a C++/CUDA extension using `data_ptr()`).")
    else:
        why = ("No torch op, custom autograd.Function or Triton launch that gradguard watches wrote it, so the "
               "writer is code that writes memory directly: a NumPy view from `.numpy()`, ctypes, DLPack, or a "
               "C++/CUDA extension using `data_ptr()`. Re-run in bisect mode to pin it between two "
               "lines.")
    return _direct_write_words(f, Verdict(
        "silent_kernel_write",
        _prefix(f) + why + f" {_saver(f)} still needed the old values.",
        "Users: give NumPy/ctypes a copy (`t.detach().numpy().copy()`) or make the update with torch ops "
        "inside `with torch.no_grad():` on the real tensor. Extension authors: write into a fresh buffer, or "
        "call `torch.autograd.graph.increment_version(x)` after writing so autograd can check it.",
    ))


def saves_running_stat(node: str | None, argument: str | None) -> bool:
    """Whether a BatchNorm node saved one of its running statistics (NOTE [Running stats saved in eval mode])."""
    return node is not None and "BatchNorm" in node and argument in ("running_mean", "running_var")


def _eval_running_stats_when(f: Finding) -> bool | None:
    # NOTE [Running stats saved in eval mode] (backends/torch/session.py): only nodes saved in eval mode get here
    return True if f.kind == "silent_write" and saves_running_stat(f.saved_at.node, f.saved_at.argument) else None


def _eval_running_stats(f: Finding, _: object) -> Verdict:
    module = f.tensor.name.rsplit(".", 1)[0] if f.tensor.name and "." in f.tensor.name else "the BatchNorm module"
    write = f.modified_at[0] if f.modified_at else None
    writer = (f"the training-mode forward at {_where(write)} (`{write.location.code}`) updated them in place, "
              f"without moving their version counter" if write is not None and write.location else
              f"with no other write seen, the usual writer is a forward of {module} in training mode, which updates "
              f"the running statistics in place without moving their version counter")
    return Verdict(
        "eval_running_stats_updated",
        _prefix(f) + f"{_saver(f)} comes from a forward in eval mode, which normalises with the running statistics "
        f"and needs them again in backward. They changed before that backward: {writer}. The backward would use "
        f"the new statistics (pytorch/pytorch#13402).",
        "Run the backward of the eval-mode forward before the next training-mode forward; or, if that output needs no "
        "gradient (an evaluation or a target network), compute it under `with torch.no_grad():`.",
    )


def _user_hooks_when(f: Finding) -> bool | None:
    reason = f.facts.user_hooks
    return True if reason in ("shape", "layout") or (reason == "values" and not f.modified_at) else None


def _user_hooks_round_trip(f: Finding, _: object) -> Verdict:
    reason = f.facts.user_hooks
    packed, unpacked = f.facts.packed or {}, f.facts.unpacked or {}
    saver = _saver(f)
    if reason == "values":
        what = ("the same shape and strides, other values: either your hooks keep the tensor itself and it was "
                "written in place afterwards (PyTorch checks no version for tensors packed by hooks), or unpack "
                "returns a copy of another tensor")
    else:
        what = (f"a {'shape' if reason == 'shape' else 'layout'} other than the one pack was given (packed: shape "
                f"{tuple(packed.get('shape', ()))}, strides {tuple(packed.get('strides', ()))}; unpacked: shape "
                f"{tuple(unpacked.get('shape', ()))}, strides {tuple(unpacked.get('strides', ()))}), with other "
                f"values: unpack handed back another tensor or view. A cache keyed by storage returns one copy for "
                f"a tensor and its transpose (modelscope/ms-swift#10157)")
    return Verdict(
        "user_hooks_round_trip",
        _prefix(f) + f"{saver} saved this tensor through your saved_tensors_hooks, and unpack returned {what}. "
        f"PyTorch does not compare what unpack returns with what pack was given, so the gradient would be "
        f"silently wrong.",
        "Make unpack return exactly what pack was given: key a cache on storage, storage offset, shape, strides "
        "and dtype (not on the storage alone), or keep each view's own copy (`t.detach().to('cpu', copy=True)`); "
        "never modify a tensor your hooks keep.",
    )


def _numpy_write(f: Finding, numpy_write: WriteRecord) -> Verdict:
    return Verdict(
        "numpy_write",
        _prefix(f) + f"Memory shared with a NumPy/DLPack alias was written at {_where(numpy_write)}.",
        "Write through torch instead, inside `with torch.no_grad():`, or give NumPy a copy "
        "(`t.detach().cpu().numpy().copy()`).",
    )


def _ddp_when(f: Finding) -> WriteRecord | None:
    # DistributedDataParallel's forward broadcasts rank 0's buffers into every rank's buffers in place
    # (broadcast_buffers=True). It is the cause when every version-bumping write is DDP's own.
    ddp = [w for w in f.modified_at if "nn/parallel/distributed.py" in (w.library_frame or "").replace("\\", "/")]
    return ddp[0] if ddp and all(w in ddp or not w.bumps_version for w in f.modified_at) else None


def _ddp_broadcast(f: Finding, ddp: WriteRecord) -> Verdict:
    return Verdict(
        "ddp_broadcast",
        _prefix(f) + f"DistributedDataParallel's forward at {_where(ddp)} copied rank 0's buffers into this "
        f"rank's buffers in place (broadcast_buffers=True, the default), after {_saver(f)} had saved this buffer "
        f"in an earlier forward pass whose backward had not run yet: that backward would use rank 0's values, "
        f"not the ones its forward used. (PyTorch >= 2.13 keeps the version counter during this broadcast, so "
        f"it computes the gradient silently wrong; earlier versions raise \"modified by an inplace operation\".)",
        "Run backward after each forward through the DDP model, or put both batches through one forward "
        "(torch.cat); or construct DDP with broadcast_buffers=False (forward_sync_buffers=False in PyTorch "
        ">= 2.13) and keep the buffers in sync yourself; for BatchNorm, convert the model with "
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).",
    )


# The version moved through a write into another part of the same storage (a slot of a preallocated buffer): the
# backend records it as a ``shared_counter`` write.
_shared_counter_when = _write("shared_counter")


_buffer_refill_when = _write("copy", extra=lambda f, w: f.tensor.role == "buffer")


def _unversioned_copy_when(f: Finding) -> WriteRecord | None:
    """A value copy that bumped no version counter (Paddle's ``set_value``/``copy_``), where the refill or generic
    rows would otherwise answer: the first write no version counter saw."""
    if not any(w.op.endswith(("set_value", "copy_")) and not w.bumps_version for w in f.modified_at):
        return None
    if _shared_counter_when(f) and not _buffer_refill_when(f):
        return None
    return next(w for w in f.modified_at if not w.bumps_version)


def _silent_set_value(f: Finding, write: WriteRecord) -> Verdict:
    return Verdict(
        "silent_set_value",
        f"{write.op} at {_where(write)} overwrote a tensor that {f.saved_at.op or 'an op'} saved for backward. It "
        "does not bump the version counter, so the gradient is computed from the new values without any error.",
        "Write the new values into a fresh tensor instead of copying them into a tensor the graph still needs, or do "
        "it after backward.",
    )


def _unseen_write(f: Finding, _subject: object) -> Verdict:
    if f.facts.write_log is False:  # the sentinel: no write log, so no writer to name (and none missed)
        why, fix = ("an in-place write moved its version before backward used it; the write log was off (the cheap "
                    "sentinel mode), so the line that wrote is not known.",
                    "Run with the write log on to name the line that wrote: `gradguard run` (re-runs in forensic mode "
                    "by itself), `gradguard.guard(track_writes=True)`, or `pytest --gradguard-mode=forensic`.")
    else:
        why, fix = ("its version moved before backward used it, but gradguard saw no write: it happened before the "
                    "guard was entered, in another thread, or in code that writes memory without going through the "
                    "framework.",
                    "Enter the guard earlier (or run the whole script with `gradguard run`) to see the write.")
    return Verdict("unseen_write", _prefix(f) + f"{_saver(f)} saved this tensor, and " + why, fix)


def _generic_inplace(f: Finding, first: WriteRecord) -> Verdict:
    code = statement_code(first.location)
    rewritten = out_of_place(code) if code else None
    fixes = []
    if rewritten and first.location is not None:
        augmented = isinstance(ast.parse(code.strip()).body[0], ast.AugAssign)  # out_of_place parsed it already
        action = "augmented_to_binary" if augmented else "inplace_to_out_of_place"
        fixes.append(FixIntent(action, first.location.file, first.location.line,
                               target=rewritten.split(" = ", 1)[0],
                               reason=f"`{rewritten}` makes a new tensor and leaves the saved one intact"))
    refilled = _refilled_name(code)
    if refilled and first.location is not None and not fixes:
        fixes.append(FixIntent("rebind_slice_target", first.location.file, first.location.line, target=refilled,
                               reason=f"`{refilled}` then names the new tensor; the one backward saved keeps its "
                                      f"values"))
    written = written_expression(first.location.file, first.location.line) if first.location else None
    if not fixes and written and first.location is not None:  # `x.normal_()`: no out-of-place method
        fixes.append(FixIntent("insert_before", first.location.file, first.location.line, target=written,
                               detail={"code": f"{written} = {written}.clone()"},
                               reason=f"the write then changes a copy of `{written}`; backward keeps the saved "
                                      f"values"))
    suggestion = (f"Write it out of place: `{rewritten}` instead of `{code}`." if rewritten else
                  f"Write into a copy: insert `{written} = {written}.clone()` before line {first.location.line} "
                  f"(`{code}` has no out-of-place form), so backward keeps the saved values."
                  if written and first.location is not None and fixes and fixes[0].action == "insert_before" else
                  f"Bind `{refilled}` to the new value instead of refilling it (`{refilled}` for `{refilled}[:]` "
                  f"in `{code}`): the tensor backward saved keeps its values. (Code that holds the old tensor no "
                  f"longer sees updates.)" if refilled else
                  "Clone before the in-place write (`y = x.clone()` and write into y), or use the out-of-place op.")
    return Verdict(
        "generic_inplace",
        _prefix(f) + f"{first.op} at {_where(first)} wrote in place into a tensor that {_saver(f)} saved for "
        f"backward.",
        suggestion,
        fixes,
    )


def _refilled_name(code: str) -> str | None:
    """``self.obs[:], r = env.step(a)`` -> ``self.obs``: a whole-slice assignment target (a buffer refilled)."""
    statement = parse_statement(code.strip())
    if not isinstance(statement, ast.Assign):
        return None
    for node in ast.walk(ast.Tuple(elts=statement.targets, ctx=ast.Store())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and not (
                node.slice.lower or node.slice.upper or node.slice.step):
            if isinstance(node.value, (ast.Name, ast.Attribute)):
                return ast.unparse(node.value)
    return None


# -- custom Function and tensor-hook hygiene (backends/torch/attribution.py) ---------------------------

def _kind(kind: str) -> Callable[[Finding], bool | None]:
    return lambda f: True if f.kind == kind else None


def _forward_writes_input(f: Finding, _: object) -> Verdict:
    function, argument = f.facts.function or "the Function", f.facts.argument or "its input"
    write = f.modified_at[0] if f.modified_at else None
    line = f" at {_where(write)} (`{write.location.code}`)" if write is not None and write.location else ""
    return Verdict(
        "forward_writes_input",
        f"{function}.forward wrote into its input `{argument}`{line} without `ctx.mark_dirty({argument})`. "
        f"Autograd still records `{argument}` with its old history: every other use of it after this call, and "
        f"the gradient that flows back through it, are computed as if it had not changed.",
        f"Write the result into a new tensor (`{argument} = {argument} * ...` instead of `{argument}.mul_(...)`); "
        f"or, to keep the in-place write, declare it: call `ctx.mark_dirty({argument})` in forward and return "
        f"`{argument}`, so autograd records the write (and raises if the old value is still needed).",
    )


def _writes_shared_grad(f: Finding, _: object) -> Verdict:
    """Both shared-gradient rows: a tensor hook wrote it (``facts.hook``, the first row), or a custom backward."""
    write = f.modified_at[0] if f.modified_at else None
    argument = f.tensor.name or "grad"
    writer = f"The {f.facts.writer or 'tensor hook'}" if f.facts.hook else f.facts.writer or "A custom backward"
    line = f" at {_where(write)} (`{write.location.code}`)" if write is not None and write.location else ""
    how = "wrote into it in place" if write is None or write.bumps_version else \
        "wrote into its memory without moving its version (a kernel or `.data`)"
    why = (f"{writer} received `{argument}` and{line} {how}, but the engine had handed the same gradient tensor to "
           f"another node that had not run yet (the other input of an add, or a tensor used twice): that node "
           f"computes with the modified gradient, silently.")
    if f.facts.hook:
        return Verdict(
            "hook_writes_shared_grad", why,
            f"A hook must not modify its argument (PyTorch's register_hook documentation): return a new tensor "
            f"instead (`lambda {argument}: {argument} * s` for `{argument}.mul_(s)`, `{argument}.clamp(...)` for "
            f"`{argument}.clamp_(...)`); the returned tensor replaces the gradient for this tensor only.",
        )
    return Verdict(
        "backward_writes_shared_grad", why,
        f"Never modify `{argument}` in backward: compute a new tensor (`{argument}.neg()`, `{argument} * s`, "
        f"`{argument}.clone()` before an in-place kernel). Kernel authors: allocate the gradient's output buffer "
        f"(`torch.empty_like({argument})`).",
    )


def _inplace_module_sites(f: Finding, inplace: re.Match[str] | None,
                          locations: tuple[SourceLocation | None, ...]) -> list[SourceLocation]:
    """The lines constructing the in-place module ``inplace`` names, in the files of ``locations``."""
    sites: list[SourceLocation] = []
    if inplace is None:
        return sites
    for file in dict.fromkeys(loc.file for loc in locations if loc is not None):
        sites.extend(s for s in keyword_calls(file, inplace.group(1), "inplace", True) if s not in sites)
    rank = f.facts.module_rank
    if rank and len(sites) == rank[1] > 1:  # the k-th such module under the call is the k-th such line
        sites = [sites[rank[0]]]
    return sites


def _inplace_false_fix(module: str, inplace: re.Match[str], sites: list[SourceLocation], name: str,
                       read: SourceLocation | None) -> tuple[str, list[FixIntent]]:
    """The suggestion and intents that construct the module with inplace=False at each of ``sites``."""
    owner = module[: inplace.start()].strip().rstrip("(").strip()
    at = f" at {sites[0].short} (`{sites[0].code.rstrip(',')}`)" if len(sites) == 1 else ""
    suggestion = (f"Construct {owner or 'it'} with inplace=False{at}. An in-place module is safe only where "
                  f"nothing reads its input again (`out = self.relu(out)` rebinds the name).")
    fixes = [FixIntent("set_keyword", site.file, site.line, target=None,
                       detail={"call": inplace.group(1), "keyword": "inplace", "value": False},
                       reason=f"construct {inplace.group(1)} with inplace=False: `{name}` keeps its "
                              f"value for the read at line {read.line if read else '?'}",
                       preferred=len(sites) == 1)
             for site in sites]
    return suggestion, fixes


def _module_writes_caller_input(f: Finding, _: object) -> Verdict:
    name, module = f.tensor.name or "the input", f.facts.module or "a module"
    write = f.modified_at[0] if f.modified_at else None
    call, read = SourceLocation.from_dict(f.facts.call), SourceLocation.from_dict(f.facts.read)
    inplace = _inplace_rules._INPLACE_MODULE.search(module)
    sites = _inplace_module_sites(f, inplace, (call, read))
    why = (f"{module} wrote into `{name}` in place (called at {_where(write) if write else 'an unknown line'}), "
           f"and `{name}` is read again at {read.short if read else 'a later line'}"
           f"{' (`' + read.code + '`)' if read is not None and read.code else ''}: that read gets the modified "
           f"values, not the ones `{name}` held before the call. No tensor saved for backward is involved, so "
           f"PyTorch raises nothing; the forward (and its gradient) silently compute something else.")
    called = module.split(" (", 1)[0]
    inside = _write_inside(f)
    if sites and inplace is not None:  # (sites are found only when inplace matched)
        suggestion, fixes = _inplace_false_fix(module, inplace, sites, name, read)
    elif inside is not None:  # the module's forward is the user's code: its write is the line to change
        where, rewritten, fixes = inside
        suggestion = (f"Write it out of place in the module's forward: `{rewritten}` at {where}, so every caller's "
                      f"tensor keeps its value (or pass a copy: `{called}({name}.clone())`).")
    else:
        suggestion = (f"Pass a copy (`{called}({name}.clone())`) or make the module compute out of place, so "
                      f"`{name}` keeps its value for the read.")
        fixes = []
    if call is not None:
        fixes.append(FixIntent("clone_argument", call.file, call.line, target=name,
                               detail={"call": callee_of(call.code, argument=name)},
                               reason=f"pass a copy of `{name}`: the module writes into the copy",
                               preferred=not fixes))
    return Verdict("module_writes_caller_input", why, suggestion, fixes)


def _write_inside(f: Finding) -> tuple[str, str, list[FixIntent]] | None:
    """(where, the rewritten statement, its intent) for a module input written by a statement of the user's own
    forward (the write log keeps it after the call: backends/torch/forward_hooks.py), when it has an out-of-place form."""
    inside = next((w for w in f.modified_at[1:] if w.category == "module_input" and w.location is not None), None)
    if inside is None or inside.location is None:
        return None
    rewritten = out_of_place(statement_code(inside.location))
    if rewritten is None:
        return None
    at = inside.location
    return at.short, rewritten, [FixIntent("inplace_to_out_of_place", at.file, at.line,
                                           target=rewritten.split(" = ", 1)[0],
                                           reason=f"`{rewritten}` makes a new tensor: the caller's keeps its value")]


def _inner_update_dropped(f: Finding, _: object) -> Verdict:
    name = f.tensor.name or "the parameter"
    grad_at = SourceLocation.from_dict(f.facts.gradient_at)
    backward_at = SourceLocation.from_dict(f.facts.backward_at)
    write = f.modified_at[0] if f.modified_at else None
    at = f" at {write.location.short} (`{write.location.code}`)" if write is not None and write.location else ""
    return Verdict(
        "inner_update_dropped",
        f"`torch.autograd.grad(..., create_graph=True)`{' at ' + grad_at.short if grad_at else ''} built a graph "
        f"for the gradient of `{name}`, so that a later loss could differentiate through the update made with it. "
        f"The update was then written into `{name}` in place{at} (under torch.no_grad(), through `.data`, or by "
        f"an optimizer), outside autograd: the backward{' at ' + backward_at.short if backward_at else ''} "
        f"reached `{name}` as a plain leaf and never went through that gradient. The meta-gradient misses the "
        f"inner step (its second-order term and its dependence on the inner loss): MAML silently degrades to "
        f"training on the outer loss alone.",
        "Keep the update in the graph: compute fast weights functionally (`fast = [p - lr * g for p, g in "
        "zip(params, grads)]`), run the outer forward with them (`torch.func.functional_call(model, "
        "dict(zip(names, fast)), x)`) and backward that loss. If a first-order update is what you want, drop "
        "create_graph=True: the same gradients, without the unused graph.",
    )


class _DropData(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        return node.value if node.attr == "data" else node


def _in_graph(code: str) -> str | None:
    """The value a ``.data`` write gives the parameter, computed where autograd sees it (the ``.data`` reads
    dropped): ``P.data = F.normalize(P.data, dim=0)`` -> ``F.normalize(P, dim=0)``; an in-place write is first made
    an assignment by the one out-of-place rewrite (``P.data.div_(n)`` -> ``P.div(n)``, ``P.data *= m`` -> ``P * m``);
    None for any other statement (``P.data.normal_()``: no out-of-place method)."""
    for candidate in (code.strip(), out_of_place(code)):
        tree = parse_code(candidate) if candidate else None
        stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
                and stmt.targets[0].attr == "data":
            return ast.unparse(_DropData().visit(stmt.value))
    return None


def _data_in_forward(f: Finding, _: object) -> Verdict:
    target = f.facts.target or f.tensor.name or "the parameter"
    module = f.facts.module or "the module"
    write = f.modified_at[0] if f.modified_at else None
    used = SourceLocation.from_dict(f.facts.used_at)
    where = f"`{write.location.code}` at {write.location.short}" if write is not None and write.location else \
        "A `.data` write"
    value = _in_graph(write.location.code) if write is not None and write.location else None
    return Verdict(
        "data_in_forward",
        f"{where} changes `{target}` through `.data` inside {module}.forward, and the forward then uses it"
        f"{' at ' + used.short if used else ''}. Autograd never sees that change: the gradient is computed as if "
        f"`{target}` had been used as stored, so it is not the gradient of your loss (the Jacobian of "
        f"{'`' + value + '`' if value else 'that computation'} is missing), and the optimizer applies it to the "
        f"changed weight. No error: `.data` writes are not version-checked either.",
        f"Compute it as a new tensor and use that: `w = {value or '...'}`, then use `w` where the forward uses "
        f"`{target}` (`x @ w`; for a layer, `torch.func.functional_call(layer, {{'weight': w}}, (x,))`), or "
        f"register the computation as a parametrization (`torch.nn.utils.parametrize.register_parametrization`). "
        f"To constrain the stored weight instead (a projection), do it after `optimizer.step()` under "
        f"`torch.no_grad()`, outside forward.",
    )


_HYGIENE_KINDS = ("undeclared_input_write", "shared_grad_write", "module_input_write", "dropped_inner_update",
                  "data_write_in_forward")

R = _inplace_rules
RULES: tuple[Rule, ...] = (
    # PyTorch's eager errors (core/eager_rules.py): an in-place write it refuses, a backward through a freed graph
    Rule("leaf_inplace", E.check("leaf"), E.leaf_rule),
    Rule("view_of_leaf_inplace", E.check("view_of_leaf"), E.view_of_leaf_rule),
    Rule("out_argument_with_grad", E.check("out_argument"), E.out_argument_rule),
    Rule("detach_view_inplace", E.check("detach_view"), E.cut_in_place_rule),
    Rule("requires_grad_of_non_leaf", E.check("requires_grad_flag"), E.cut_in_place_rule),
    Rule("multi_output_view_inplace", E.check("multi_output_view"), E.multi_view_rule),
    Rule("no_grad_view_inplace", lambda f: True if f.facts.eager_check in ("no_grad_view", "no_grad_view_base")
         else None, E.no_grad_view_rule),
    Rule("custom_function_view_inplace", E.check("custom_function_view"), E.function_view_rule),
    Rule("carried_state_backward_twice", lambda f: f.facts.carried, E.carried_rule),
    Rule("same_loss_backward_twice", lambda f: f.facts.same_loss, E.same_loss_rule),
    Rule("forward_outside_loop", lambda f: f.facts.forward_before_loop, E.hoisted_rule),
    Rule("freed_graph_reused", lambda f: f.facts.crossing, E.crossing_rule),
    Rule("accumulated_loss_backpropagated", lambda f: f.facts.accumulation and "term" in f.facts.accumulation,
         E.running_sum_rule),
    Rule("accumulated_loss_not_reset", lambda f: f.facts.accumulation, E.accumulated_rule),
    Rule("backward_twice", E.check("backward_twice"), E.unknown_twice_rule),
    Rule("second_order_without_create_graph", lambda f: True if f.facts.eager_check == "no_graph" and (
        f.facts.graph_cut or {}).get("cause") == "constant_gradient" else None, E.no_graph_rule),
    Rule("reentrant_checkpoint_without_grad_input", lambda f: True if f.facts.eager_check == "no_graph" and (
        f.facts.graph_cut or {}).get("cause") == "reentrant_checkpoint" else None, E.no_graph_rule),
    Rule("no_graph", E.check("no_graph"), E.no_graph_rule),
    Rule("grad_of_non_leaf", E.check("non_leaf_grad"), E.non_leaf_grad_rule),
    Rule("grad_of_tensor_not_requiring_grad", E.check("grad_not_required"), E.grad_not_required_rule),
    Rule("optimizer_of_non_leaf", E.check("non_leaf_param"), E.non_leaf_param_rule),
    Rule("forward_writes_input", _kind("undeclared_input_write"), _forward_writes_input),
    Rule("hook_writes_shared_grad", lambda f: True if f.kind == "shared_grad_write" and f.facts.hook else None,
         _writes_shared_grad),
    Rule("backward_writes_shared_grad", _kind("shared_grad_write"), _writes_shared_grad),
    Rule("module_writes_caller_input", _kind("module_input_write"), _module_writes_caller_input),
    Rule("inner_update_dropped", _kind("dropped_inner_update"), _inner_update_dropped),
    Rule("data_in_forward", _kind("data_write_in_forward"), _data_in_forward),
    Rule("user_hooks_round_trip", _user_hooks_when, _user_hooks_round_trip),
    Rule("eval_running_stats_updated", _eval_running_stats_when, _eval_running_stats),
    Rule("fused_optimizer", _write("optimizer", silent=True, extra=lambda f, w: f.facts.optimizers_bump_versions
                                   is not False), _fused_optimizer),
    Rule("optimizer_step_before_backward", lambda f: _stepped_before_backward(f) or _unversioned_step(f),
         _optimizer_before_backward),
    Rule("retained_graph_across_steps",
         _write("optimizer", silent=False, extra=lambda f, w: R.optimizer_wraps_retained_graph(f, w)),
         R.retained_graph_rule),
    Rule("optimizer_step_between_backwards", _write("optimizer", silent=False), R.optimizer_between_backwards_rule),
    Rule("inplace_flag_set_later", _write("activation", extra=lambda f, w: bool(R.switched_later(f, w))),
         R.flag_set_later_rule),
    Rule("inplace_activation", _write("activation"), R.activation_rule),
    Rule("data_write", _write("data_write"), _data_write),
    Rule("silent_kernel_write", _write("kernel"), _kernel_write),
    Rule("silent_outside_write", _outside_when, _outside_write),
    Rule("numpy_write", _write("numpy"), _numpy_write),
    Rule("augmented_assignment", _write("augmented_assign"), R.augmented_rule),
    Rule("index_assignment", _write("index_assign"), R.index_rule),
    Rule("ddp_broadcast", _ddp_when, _ddp_broadcast),
    Rule("silent_set_value", _unversioned_copy_when, _silent_set_value),
    Rule("buffer_refill", _buffer_refill_when, R.buffer_rule),
    Rule("shared_version_counter", _shared_counter_when, R.shared_counter_rule),
    Rule("unseen_write", lambda f: True if not f.modified_at else None, _unseen_write),
    Rule("generic_inplace", lambda f: f.modified_at[0], _generic_inplace),
)


def diagnose_or_fallback(build: Callable[[], Finding], *, kind: str, shape: Iterable[int], dtype: object,
                         backend: str) -> Finding:
    """``build()``; if gradguard itself fails there, a minimal finding that still reports the hazard.
    Every backend's error path uses this: our own failure must never hide the user's hazard."""
    try:
        return build()
    except Exception as internal:
        finding = Finding(kind=kind, tensor=TensorInfo(tuple(shape), str(dtype)), backend=backend)
        finding.notes.append(f"gradguard could not build the full diagnosis: {internal!r}")
        return diagnose(finding)
