"""The rules for version-bumping writes into saved tensors: why the write broke backward, and the fix
written against the user's own lines (``h_cur = h_next.detach()`` at line 21, not a template).

Called from :func:`gradguard.core._diagnosis._saved_tensor_rules`; each function returns
``(rule, explanation, suggestion)``. Framework-neutral: they read the finding's categories, node names,
pass counts and source lines.
"""

from __future__ import annotations

import re

from ._findings import Finding, SourceLocation, WriteRecord
from ._fixes import carried_state, mask_assignment, out_of_place, statement_code, step_receivers

__all__ = [
    "optimizer_rule",
    "activation_rule",
    "augmented_rule",
    "index_rule",
    "buffer_rule",
    "why_saved",
    "tensor_phrase",
]

# What each output-saving backward node computes from the saved output: why overwriting it breaks backward.
_USES_OUTPUT = {
    "Sigmoid": "sigmoid's gradient is computed from its output s as s * (1 - s)",
    "Tanh": "tanh's gradient is computed from its output t as 1 - t^2",
    "Exp": "exp's gradient is its own output",
    "Softmax": "softmax's gradient is computed from its output s as s * (g - (g * s).sum(dim))",
    "LogSoftmax": "log_softmax's gradient is computed from exp of its output",
    "Relu": "ReLU's gradient passes only where its output is > 0, read from the saved output",
    "Elu": "ELU's gradient is computed from its output",
    "Sqrt": "sqrt's gradient is computed from its output as 1 / (2 * sqrt(x))",
    "Rsqrt": "rsqrt's gradient is computed from its output",
    "Hardtanh": "hardtanh's gradient is computed from its saved values",
}
# Argument names whose saved value feeds the gradient of the other operand.
_OTHER_OPERAND = {"mat2": "mat1 (the layer input)", "mat1": "mat2", "self": "the other operand",
                  "other": "the other operand", "weight": "the input", "input": "the weight"}
_INPLACE_MODULE = re.compile(r"(\w+)\(inplace=True\)")


def _op_of(node: str | None) -> str | None:
    """``SigmoidBackward0`` -> ``Sigmoid``."""
    if not node:
        return None
    return re.sub(r"Backward\d*$", "", node)


def _short(location: SourceLocation | None, home: str | None = None) -> str:
    """``line 21`` inside ``home`` (the file of the forward call, where the user is reading), else file:line."""
    if location is None:
        return "an unknown line"
    return f"line {location.line}" if home is not None and location.file == home else location.short


def _home(f: Finding) -> str | None:
    return f.saved_at.location.file if f.saved_at.location else None


def _backward_location(f: Finding) -> SourceLocation | None:
    raw = f.context.get("backward_at")
    if not raw:
        return None
    return SourceLocation(raw["file"], raw["line"], raw.get("function") or "", raw.get("code") or "")


def tensor_phrase(f: Finding) -> str:
    """``parameter rnn.weight_hh_l0``, ``buffer norm.scale``, ```features```, or ``the tensor``."""
    t = f.tensor
    if t.name and t.role in ("parameter", "buffer"):
        return f"{t.role} {t.name}"
    if t.name:
        return f"`{t.name}`"
    return "the tensor"


def why_saved(f: Finding) -> str:
    """Why the saving node needs the value: ``sigmoid's gradient is computed from its output ...``."""
    node, argument = f.saved_at.node, f.saved_at.argument
    op = _op_of(node)
    if argument == "result" and op in _USES_OUTPUT:
        return _USES_OUTPUT[op]
    if argument in _OTHER_OPERAND and node:
        return f"{node} needs its saved `{argument}` to compute the gradient of {_OTHER_OPERAND[argument]}"
    if node:
        return f"{node} computes its gradient from the saved value"
    return "backward computes a gradient from the saved value"


def _what_was_overwritten(f: Finding) -> str:
    op = _op_of(f.saved_at.node)
    if f.saved_at.argument == "result" and op:
        if f.tensor.name and f.tensor.role not in ("parameter", "buffer"):
            return f"`{f.tensor.name}`, the output of {op.lower()}"
        return f"the output of {op.lower()}"
    return tensor_phrase(f)


def _same_function(a: SourceLocation | None, b: SourceLocation | None) -> bool:
    return a is not None and b is not None and a.file == b.file and a.function == b.function


def _where(w: WriteRecord, f: Finding | None = None) -> str:
    return _short(w.location, _home(f) if f is not None else None)


def _versions(w: WriteRecord) -> str:
    if w.version_before is None or w.version_after is None:
        return ""
    return f" (version {w.version_before} -> {w.version_after})"


# -- optimizer steps -------------------------------------------------------------------------------------


def optimizer_rule(f: Finding, opt: WriteRecord, passes: int, retain: bool | None) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    stepper = opt.via or "the optimizer step"
    step_code = f"`{opt.location.code}`" if opt.location else stepper
    target = tensor_phrase(f)
    save = f.saved_at.location
    backward = _backward_location(f)
    backward_code = f"`{backward.code}`" if backward and backward.code else "backward()"

    if passes < 1:
        return (
            "optimizer_step_before_backward",
            f"{saver} saved {target} in the forward call at {_short(save, _home(f))}; before any backward ran through that "
            f"forward, {stepper} at {_where(opt, f)} updated it in place{_versions(opt)}. The backward at "
            f"{_short(backward, _home(f))} would compute gradients with a weight the forward never used.",
            f"Step after the backward: call {step_code} after {backward_code} (line "
            f"{backward.line if backward else '?'}), so the forward, its backward and the step run in that order.",
        )

    carried = carried_state(backward)
    loop_wrapped = (_same_function(backward, opt.location) and backward is not None and opt.location is not None
                    and backward.line < opt.location.line)
    if loop_wrapped or (carried and not _same_function(backward, opt.location)):
        return _retained_graph_rule(f, opt, passes, retain, carried, backward)

    receivers = step_receivers(opt.location)
    why = (
        f"{saver} saved {target} in the forward call at {_short(save, _home(f))}. Before this backward at "
        f"{_short(backward, _home(f))} ({backward_code}) used it, an earlier backward ran and {stepper} at "
        f"{_where(opt, f)} updated {target} in place{_versions(opt)}, so this backward would compute gradients "
        f"with a weight that forward never used (PyTorch < 1.5 did exactly that, silently)."
    )
    if len(receivers) > 1:
        return (
            "optimizer_step_between_backwards",
            why + " This is the GAN / actor-critic ordering bug: one model is stepped while another loss still "
            "has to backpropagate through it.",
            f"Compute that loss from a fresh forward after the step: re-run `{save.code if save else 'the forward'}` "
            f"after {step_code} (line {opt.location.line if opt.location else '?'}) and build the loss from the new "
            f"output. In the first loss, feed the stepped model a detached input "
            f"({_detached_call_hint(save.code if save else '')}), so its backward stays inside the model it "
            f"trains and needs no "
            f"retain_graph=True.",
        )
    return (
        "optimizer_step_between_backwards",
        why,
        f"Backpropagate every loss before stepping: sum the losses and call backward once "
        f"(`(loss_a + loss_b).backward()`), or move {step_code} (line {opt.location.line if opt.location else '?'}) "
        f"after {backward_code}; then step once per batch.",
    )


def _detached_call_hint(code: str) -> str:
    """``g_loss = bce(D(fake), y)`` -> ```D(fake.detach())``` for the loss that trains D: the stepped
    model's call found in the saving line, with its input detached."""
    import ast

    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1
                and isinstance(node.args[0], ast.Name)):
            return f"e.g. `{node.func.id}({node.args[0].id}.detach())`"
    return "the other model's output `.detach()`ed"


def _retained_graph_rule(f, opt, passes, retain, carried, backward) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    stepper = opt.via or "the optimizer step"
    target = tensor_phrase(f)
    kept = ("retain_graph=True kept it alive through its backward" if retain is not False
            else "a backward with retain_graph=True kept it alive")
    if carried:
        state = carried[0]
        carrier = (f"`{state.name}` carries it into the next iteration: it still holds the earlier forward's "
                   f"output (`{state.assignment.code}`, line {state.assignment.line}, without .detach())")
        detach = f"Detach the carried state where it crosses into the next iteration: {state.detach_fix()}"
    else:
        carrier = ("a tensor from that iteration (for example an RNN hidden state) was carried into this one "
                   "without .detach()")
        detach = "Detach what you carry into the next iteration (`h = h_next.detach()`)"
    retain_fix = (f", and drop retain_graph=True from `{backward.code}` (line {backward.line})"
                  if backward is not None and "retain_graph" in backward.code else ", and drop retain_graph=True")
    return (
        "retained_graph_across_steps",
        f"{saver} saved {target} in the forward call at {_short(f.saved_at.location, _home(f))} of an earlier iteration "
        f"({passes} backward pass(es) ago). That iteration's graph is still alive: {kept}, and {carrier}. So "
        f"this backward at {_short(backward, _home(f))} runs on into the old graph. In between, {stepper} at "
        f"{_where(opt, f)} updated {target} in place{_versions(opt)}, so the value the old graph saved is gone.",
        f"{detach}{retain_fix}. Each backward then covers only its own iteration. If you want gradients through "
        f"several iterations (truncated BPTT), run one backward over the whole window and step after it.",
    )


# -- in-place activations --------------------------------------------------------------------------------


def activation_rule(f: Finding, act: WriteRecord) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    via = act.via or act.op
    module = _INPLACE_MODULE.search(via)
    written_op = act.op.split(".")[1] if act.op.count(".") >= 1 else act.op  # "relu_"
    saver_op = (_op_of(f.saved_at.node) or "").lower()
    if f.saved_at.argument == "result" and saver_op and written_op.rstrip("_") == saver_op:
        shown = {"relu": "ReLU"}.get(saver_op, saver_op)
        owner = via[: module.start()].strip().rstrip("(").strip() if module else ""
        return (
            "consecutive_inplace_activation",
            f"Two in-place {shown}s in a row: the second ({via} at {_where(act, f)}) overwrote the first one's "
            f"output, which the first one's backward ({saver}) needs: {why_saved(f)}.",
            f"Drop the second {shown}{' (' + owner + ')' if owner else ''}: {saver_op}({saver_op}(x)) == "
            f"{saver_op}(x). Or construct it with inplace=False.",
        )
    if module is not None:
        owner = via[: module.start()].strip().rstrip("(").strip()  # "gate.2" in "gate.2 (ReLU(inplace=True))"
        fix = (f"Construct {owner or 'it'} with inplace=False: `nn.{module.group(1)}(inplace=False)`. An in-place "
               f"op is safe only right after an op that does not save its output (Linear, Conv, BatchNorm).")
    else:
        plain = via.replace("torch.", "").rstrip("_")
        fix = (f"Use the out-of-place form: `torch.{plain}(x)` (or `F.{plain}(x)` without inplace=True) instead "
               f"of {via}.")
    return (
        "inplace_activation",
        f"The in-place {'module' if module else 'op'} {via} at {_where(act, f)} overwrote {_what_was_overwritten(f)}, which {saver} "
        f"saved for backward: {why_saved(f)}.",
        fix,
    )


# -- Python spellings of in-place writes ------------------------------------------------------------------


def augmented_rule(f: Finding, aug: WriteRecord) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    code = statement_code(aug.location) or aug.op
    rewritten = out_of_place(code)
    fix = (f"Write it out of place: `{rewritten}` instead of `{code}`. That makes a new tensor and leaves the "
           f"saved one intact." if rewritten else
           "Write it out of place: `x = x + y` instead of `x += y` (likewise `x = x * y`, `x = x / y`).")
    return (
        "augmented_assignment",
        f"`{code}` at {_where(aug, f)} is an in-place operation: it overwrote {_what_was_overwritten(f)}, which "
        f"{saver} saved for backward: {why_saved(f)}.",
        fix,
    )


def index_rule(f: Finding, idx: WriteRecord) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    code = statement_code(idx.location)
    masked = mask_assignment(code) if code else None
    why = (f"The {'mask' if masked else 'index/slice'} assignment `{code or idx.op}` at {_where(idx, f)} writes in "
           f"place into {_what_was_overwritten(f)}, which {saver} saved for backward: {why_saved(f)}.")
    if masked:
        return ("mask_assignment", why,
                f"Mask out of place: `{masked}` (or `torch.where(mask, value, x)`); the saved tensor stays intact.")
    name = f.tensor.name if f.tensor.name and f.tensor.role not in ("parameter", "buffer") else None
    if name and idx.location:
        fix = (f"Assign into a copy: insert `{name} = {name}.clone()` before line {idx.location.line}, so the "
               f"assignment changes the copy and {f.saved_at.node or 'backward'} keeps the saved values.")
    else:
        fix = ("Assign into a copy (`x = x.clone(); x[idx] = value`) so the saved tensor stays intact, or use an "
               "out-of-place form such as `torch.where(mask, value, x)` or `x.index_put((idx,), value)`.")
    return ("index_assignment", why, fix)


# -- buffers -----------------------------------------------------------------------------------------------


def buffer_rule(f: Finding, copy: WriteRecord) -> tuple[str, str, str]:
    saver = f.saved_at.op or "an autograd node"
    name = f.tensor.name or "the buffer"
    save = f.saved_at.location
    backward = _backward_location(f)
    attribute = f"self.{name.rsplit('.', 1)[-1]}"
    code = copy.location.code if copy.location else copy.op
    if (_same_function(copy.location, save) and copy.location is not None and save is not None
            and copy.location.line < save.line):
        # The write sits above the save in the same forward(): a later call of forward wrote what an
        # earlier call saved, i.e. two forwards ran before one backward.
        use = (f"use `{attribute}.clone()` in `{save.code}` (line {save.line})" if attribute in save.code
               else f"use a clone of the buffer in the computation at line {save.line}")
        return (
            "buffer_updated_by_second_forward",
            f"`{save.function}` ran twice before backward (two forward passes, e.g. on a real and a fake batch). "
            f"The first call saved buffer {name} ({saver}, line {save.line}); the second call refilled it in place "
            f"at {_where(copy, f)} (`{code}`){_versions(copy)}, so the first call's backward would use the second "
            f"call's value.",
            f"Keep a snapshot in the graph: {use}, as torch.nn.utils.spectral_norm does; or run one forward on "
            f"both batches (`torch.cat([real, fake])`), or backward after each forward.",
        )
    after = f"after `{backward.code}` (line {backward.line})" if backward is not None else "after the backward"
    return (
        "buffer_refill",
        f"`{code}` at {_where(copy, f)} refilled buffer {name} in place{_versions(copy)} after {saver} saved it in "
        f"the forward call at {_short(save, _home(f))}; backward needs the value that forward used: {why_saved(f)}.",
        f"Refill {name} only {after}: move the call that reaches line {copy.location.line if copy.location else '?'} "
        f"there. Or have forward use a snapshot (`{attribute}.clone()`).",
    )
