"""The rules for version-bumping writes into saved tensors: why the write broke backward, and the fix
written against the user's own lines (``h_cur = h_next.detach()`` at line 21, not a template).

Rows of the rule table in :mod:`gradguard.core.diagnosis`; each function returns a
:class:`~gradguard.core.intents.Verdict`: the rule id, the explanation, the suggestion and the same fix as
structured :class:`~gradguard.core.intents.FixIntent` s. Framework-neutral: they read the finding's
categories, node names, pass counts and source lines.
"""

from __future__ import annotations

import ast
import dataclasses
import re

from .findings import Finding, SourceLocation, WriteRecord
from .fixes import (carried_state, crossing_recompute, is_valid_python, keyword_calls, mask_assignment,
                     out_of_place, single_statement, statement_code, step_receivers)
from .intents import FixIntent, Verdict
from .module_sites import constructed_in_place, inplace_position, writer_sites
from .source_ast import assignment_before, callee_of, line_in_block, parse_code, parse_statement, written_expression

__all__ = ["optimizer_before_backward_rule", "optimizer_between_backwards_rule", "retained_graph_rule",
           "activation_rule", "flag_set_later_rule", "switched_later", "augmented_rule", "index_rule", "buffer_rule",
           "why_saved", "tensor_phrase", "optimizer_wraps_retained_graph"]

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
    return re.sub(r"Backward\d*$", "", node) if node else None


def _short(location: SourceLocation | None, f: Finding | None = None) -> str:
    """``line 21`` inside the file of ``f``'s forward call (where the user is reading), else file:line."""
    if location is None:
        return "an unknown line"
    home = f.saved_at.location.file if f is not None and f.saved_at.location else None
    return f"line {location.line}" if home is not None and location.file == home else location.short


def _saver(f: Finding) -> str:
    return f.saved_at.op or "an autograd node"


def tensor_phrase(f: Finding) -> str:
    """``parameter rnn.weight_hh_l0``, ``buffer norm.scale``, ```features```, or ``the tensor``."""
    t = f.tensor
    if t.name and t.role in ("parameter", "buffer"):
        return f"{t.role} {t.name}"
    return f"`{t.name}`" if t.name else "the tensor"


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
    return _short(w.location, f)


def _versions(w: WriteRecord) -> str:
    if w.version_before is None or w.version_after is None:
        return ""
    return f" (version {w.version_before} -> {w.version_after})"


# -- optimizer steps -------------------------------------------------------------------------------------


def _loc(location: SourceLocation | None) -> tuple[str | None, int | None]:
    return (location.file, location.line) if location is not None else (None, None)


def _line_of(location: SourceLocation | None) -> str:
    return f"line {location.line}" if location is not None else "the line that runs it"


def optimizer_wraps_retained_graph(f: Finding, opt: WriteRecord) -> bool:
    """The step sits inside the loop after this backward (or a carried state crosses functions): the old
    graph was kept alive across iterations."""
    backward = SourceLocation.from_dict(f.facts.backward_at)
    carried = carried_state(backward)
    # A loss made statements before the call that backpropagates it, in an outer frame, with steps in between
    # (NOTE [A loss made before the steps]) is a helper's backward-then-step called per loss, not a loop.
    loop_wrapped = (_step_follows(opt, backward) and not f.facts.loss_made_early
                    and not _helper_per_loss(f, opt, backward))
    return loop_wrapped or bool(carried and not _same_function(backward, opt.location))


def _helper_per_loss(f: Finding, opt: WriteRecord, backward: SourceLocation | None) -> bool:
    """The step and this backward run in a helper that the save's block calls again after the call that stepped
    (``update(opt_d, loss_d)``, then ``update(opt_g, loss_g)``): placed at their calls, the step comes before this
    backward, in the same pass over the block, not in the previous iteration."""
    save = f.saved_at.location
    if save is None or backward is None or opt.location is None:
        return False
    step = line_in_block(save.file, save.line, save.line, opt.location.function, opt.location.line, save.function)
    later = line_in_block(save.file, save.line, step, backward.function, backward.line, save.function) if step else None
    return step is not None and later is not None and step < later


def optimizer_before_backward_rule(f: Finding, opt: WriteRecord) -> Verdict:
    stepper = opt.via or "the optimizer step"
    step_code = f"`{opt.location.code}`" if opt.location else stepper
    target = tensor_phrase(f)
    save = f.saved_at.location
    backward = SourceLocation.from_dict(f.facts.backward_at)
    backward_code = f"`{backward.code}`" if backward and backward.code else "backward()"
    fixes = _move_step_intents(opt, backward, "step after the backward at line {}", even_if_it_follows=True)
    return Verdict(
        "optimizer_step_before_backward",
        f"{_saver(f)} saved {target} in the forward call at {_short(save, f)}; before any backward ran "
        f"through that forward, {stepper} at {_where(opt, f)} updated it in place{_versions(opt)}. The backward at "
        f"{_short(backward, f)} would compute gradients with a weight the forward never used.",
        f"Step after the backward: call {step_code} after {backward_code} ({_line_of(backward)}), so the forward, "
        f"its backward and the step run in that order.",
        fixes,
    )


def _two_model_intents(f: Finding, opt: WriteRecord, save, backward) -> tuple[list[FixIntent], tuple | None]:
    """(intents, detach hint) when two models are stepped: recompute what crosses into the stepped model's graph,
    re-run its forward after the step, or feed it a detached input."""
    fixes = []
    chain = f.saved_at.chain[0] if getattr(f.saved_at, "chain", None) else save
    crossing = crossing_recompute(chain, opt.location, backward)
    if crossing is not None:
        name, argument, code = crossing
        fixes.append(FixIntent("insert_after", *_loc(opt.location), target=name, detail={"code": code},
                               reason=f"recompute `{name}` from `{argument}.detach()` after the step: the "
                                      f"second loss then stays out of the stepped model's graph"))
    if (save is not None and opt.location is not None and save.line < opt.location.line
            and _same_function(save, opt.location) and is_valid_python(save.code)):
        # a copy, not a move: the statements between the save and the step still use the first value
        fixes.append(FixIntent("insert_after", *_loc(opt.location), target=save.code,
                               detail={"code": save.code},
                               reason=f"recompute `{save.code}` from a fresh forward after the step at line "
                                      f"{opt.location.line}"))
    hint = _detached_call(save.code if save else "")
    # Only at the user's own call of the model: a detach inside the model's forward would cut the gradient of
    # every layer before it (the error goes away, the training is broken).
    if hint is not None and save is not None and _same_function(save, opt.location):
        fixes.append(FixIntent("detach_argument", *_loc(save), target=hint[1], detail={"call": hint[0]},
                               reason="feed the stepped model a detached input", preferred=not fixes))
    fixes += _loss_site_repairs(f, opt, fixes)
    if crossing is not None:  # the most precise repair: the others become alternatives, tried one at a time
        fixes = fixes[:1] + [_as_preferred(x, False) for x in fixes[1:]]
    return fixes, hint


def _step_follows(opt: WriteRecord, backward) -> bool:
    """NOTE [A loss made before the steps]: the step already follows this backward in its function (a helper's
    zero_grad, backward, step; a loop that steps after each backward), so moving it cannot help: the loss must be
    made after the earlier steps."""
    return _same_function(backward, opt.location) and opt.location.line > backward.line


def _move_step_intents(opt: WriteRecord, backward, reason: str, even_if_it_follows: bool = False) -> list[FixIntent]:
    """The step moved after the backward that needs the weights it updates (unless ``even_if_it_follows``, only when
    it does not already follow it); ``reason``'s ``{}`` is the backward's line."""
    if opt.location is None or backward is None or not even_if_it_follows and _step_follows(opt, backward):
        return []
    return [FixIntent("move_statement", *_loc(opt.location), target=opt.location.code,
                      detail={"after_line": backward.line}, reason=reason.format(backward.line))]


def optimizer_between_backwards_rule(f: Finding, opt: WriteRecord) -> Verdict:
    stepper = opt.via or "the optimizer step"
    step_code = f"`{opt.location.code}`" if opt.location else stepper
    target = tensor_phrase(f)
    save = f.saved_at.location
    backward = SourceLocation.from_dict(f.facts.backward_at)
    backward_code = f"`{backward.code}`" if backward and backward.code else "backward()"
    receivers = step_receivers(opt.location)
    why = (
        f"{_saver(f)} saved {target} in the forward call at {_short(save, f)}. Before this backward at "
        f"{_short(backward, f)} ({backward_code}) used it, an earlier backward ran and {stepper} at "
        f"{_where(opt, f)} updated {target} in place{_versions(opt)}, so this backward would compute gradients "
        f"with a weight that forward never used (PyTorch < 1.5 did exactly that, silently)."
    )
    if len(receivers) > 1:
        fixes, hint = _two_model_intents(f, opt, save, backward)
        hint_text = (f"e.g. `{hint[0]}({hint[1]}.detach())`" if hint is not None
                     else "the other model's output `.detach()`ed")
        two_models = _two_models_wording(receivers)
        return Verdict(
            "optimizer_step_between_backwards",
            why + f" {two_models}",
            f"Compute that loss from a fresh forward after the step: re-run "
            f"{'`' + save.code + '`' if save else 'the forward'} after {step_code} ({_line_of(opt.location)}) and "
            f"build the loss from the new output. In the first loss, feed the stepped model a detached input "
            f"({hint_text}), so its backward stays inside the model it trains and needs no retain_graph=True.",
            fixes,
        )
    fixes = _move_step_intents(opt, backward, "backpropagate every loss before stepping (after line {})")
    fixes += _loss_site_repairs(f, opt, fixes)
    again = f.facts.recompute_in_loop
    if _step_follows(opt, backward):
        # the step already comes after this backward in its own function: only a fresh forward helps
        fresh = (f"recompute `{again['name']}` in the loop, before line {again['line']} (it is made once, at line "
                 f"{again['made_line']})" if again else "make the loss from a forward that runs after the step")
        fresh = fresh[0].upper() + fresh[1:]
        suggestion = (f"{fresh}: this backward then goes through a graph made with the weights {step_code} "
                      f"({_line_of(opt.location)}) wrote. (The step already follows its own backward here, so "
                      f"moving it cannot help.) Or sum the losses and call backward once, before the first step.")
    else:
        suggestion = (f"Backpropagate every loss before stepping: sum the losses and call backward once "
                      f"(`(loss_a + loss_b).backward()`), or move {step_code} ({_line_of(opt.location)}) after "
                      f"{backward_code}; then step once per batch.")
    return Verdict("optimizer_step_between_backwards", why, suggestion, fixes)


def _loss_made_early(f: Finding, opt: WriteRecord) -> FixIntent | None:
    """Move the statement that made the loss to after the steps that ran before its backward (the step sits in a
    helper after that helper's own backward: SAC's ``update_params``)."""
    early = f.facts.loss_made_early
    if not early:
        return None
    step = opt.location
    if step is not None and (step.file, step.function) == (early["file"], early.get("function")) and not (
            early["line"] < step.line <= early["after_line"]):
        return None  # the step is not one of the statements in between: moving the loss changes nothing
    return FixIntent("move_statement", early["file"], early["line"], target=early["code"],
                     detail={"after_line": early["after_line"]},
                     reason=f"compute `{early['name']}` from a fresh forward after the steps that run before its "
                            f"backward (after line {early['after_line']})", preferred=False)


def _backward_moved_up(f: Finding, opt: WriteRecord) -> list[FixIntent]:
    """Move the statements that backpropagate the loss and step with it to just after the loss is made, before the
    other steps (gdrl's SAC: the policy loss's inputs were made before the critics stepped, not only the loss)."""
    early = f.facts.loss_made_early
    lines = (early or {}).get("backward_block")
    if not lines or _loss_made_early(f, opt) is None:
        return []
    return [FixIntent("move_statement", early["file"], line, detail={"after_line": early["line"], "group": 1},
                      reason=f"backpropagate `{early['name']}` and step right after it is made (line {early['line']}), "
                             f"before the steps that update the weights its forward saved", preferred=False)
            for line in lines]


def _loss_site_repairs(f: Finding, opt: WriteRecord, earlier: list[FixIntent]) -> list[FixIntent]:
    """The repairs read from where the loss was made (alternatives; the first one preferred when no other rule
    proposed an edit)."""
    repairs: list[list[FixIntent]] = [[i] for i in (_loss_made_early(f, opt), _recompute_in_loop(f)) if i is not None]
    moved_up = _backward_moved_up(f, opt)
    if moved_up:
        repairs.insert(1 if repairs else 0, moved_up)
    if not earlier and repairs:
        repairs[0] = [_as_preferred(i) for i in repairs[0]]
    return [intent for repair in repairs for intent in repair]


def _recompute_in_loop(f: Finding) -> FixIntent | None:
    """Recompute, at the top of the loop that steps, a value made once before it (SinGAN's ``fake``)."""
    again = f.facts.recompute_in_loop
    if not again:
        return None
    return FixIntent("insert_before", again["file"], again["line"], target=again["name"],
                     detail={"code": again["code"]},
                     reason=f"recompute `{again['name']}` in the loop (it was made once, at line "
                            f"{again['made_line']}, and the loop's step updates the weights its forward saved)",
                     preferred=False)


def _as_preferred(intent: FixIntent, preferred: bool = True) -> FixIntent:
    return dataclasses.replace(intent, preferred=preferred)


def _two_models_wording(receivers: list[str]) -> str:
    """GAN wording only for code whose optimizers look like a GAN's (``opt_d``/``opt_g``, ``optimizerD``)."""
    lowered = [r.lower() for r in receivers]
    gan = (any(r.endswith(("_d", "optimizerd", "disc", "discriminator", "netd")) for r in lowered)
           and any(r.endswith(("_g", "optimizerg", "gen", "generator", "netg")) for r in lowered))
    if gan:
        return ("This is the GAN ordering bug: one model is stepped while another loss still has to "
                "backpropagate through it.")
    return ("Two models are trained here and one is stepped while another loss still has to backpropagate "
            "through it (the actor-critic / multi-model ordering bug).")


def _detached_call(code: str) -> tuple[str, str] | None:
    """``g_loss = bce(D(fake), y)`` -> ``("D", "fake")``: the stepped model's call found in the saving line,
    whose input the first loss should detach."""
    tree = parse_code(code.strip())
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and len(node.args) == 1
                and isinstance(node.args[0], ast.Name)):
            return ast.unparse(node.func), node.args[0].id
    return None


def retained_graph_rule(f: Finding, opt: WriteRecord) -> Verdict:
    stepper = opt.via or "the optimizer step"
    target = tensor_phrase(f)
    passes = f.facts.backward_passes_since_save or 0
    retain = f.facts.retain_graph
    backward = SourceLocation.from_dict(f.facts.backward_at)
    carried = carried_state(backward)
    kept = ("retain_graph=True kept it alive through its backward" if retain is not False
            else "a backward with retain_graph=True kept it alive")
    fixes: list[FixIntent] = []
    if carried:
        state = carried[0]
        carrier = (f"`{state.name}` carries it into the next iteration: it still holds the earlier forward's "
                   f"output (`{state.assignment.code}`, line {state.assignment.line}, without .detach())")
        detach = f"Detach the carried state where it crosses into the next iteration: {state.detach_fix()}"
        fixes.append(state.detach_intent())
    elif f.facts.recompute_in_loop:  # NOTE [A value made once, before the loop that steps]
        again = f.facts.recompute_in_loop
        carrier = (f"`{again['name']}` was made once, before this loop (line {again['made_line']}), and every "
                   f"iteration builds its loss from it, so every backward runs into that one forward's graph")
        detach = (f"Recompute `{again['name']}` inside the loop, before its first use (line {again['line']}): "
                  f"`{again['code']}`")
        fixes.append(_as_preferred(_recompute_in_loop(f)))
    else:
        carrier = ("a tensor from that iteration (for example an RNN hidden state) was carried into this one "
                   "without .detach()")
        detach = "Detach what you carry into the next iteration (`h = h_next.detach()`)"
    if backward is not None and "retain_graph" in backward.code:
        retain_fix = f", and drop retain_graph=True from `{backward.code}` (line {backward.line})"
        fixes.append(FixIntent("drop_keyword", *_loc(backward), target=None,
                               detail={"call": "backward", "keyword": "retain_graph"},
                               reason="each backward then frees its own iteration's graph",
                               preferred=not f.facts.recompute_in_loop or bool(carried)))
    else:
        retain_fix = ", and drop retain_graph=True"
    return Verdict(
        "retained_graph_across_steps",
        f"{_saver(f)} saved {target} in the forward call at {_short(f.saved_at.location, f)} of an earlier "
        f"iteration ({passes} backward pass(es) ago). That iteration's graph is still alive: {kept}, and {carrier}. So "
        f"this backward at {_short(backward, f)} runs on into the old graph. In between, {stepper} at "
        f"{_where(opt, f)} updated {target} in place{_versions(opt)}, so the value the old graph saved is gone.",
        f"{detach}{retain_fix}. Each backward then covers only its own iteration. If you want gradients through "
        f"several iterations (truncated BPTT), run one backward over the whole window and step after it.",
        fixes,
    )


# -- in-place activations --------------------------------------------------------------------------------


def _files(f: Finding, act: WriteRecord) -> list[str]:
    """The files a module's construction is searched in: those of the write and the save, and the module's own."""
    files = list(dict.fromkeys(loc.file for loc in (act.location, f.saved_at.location, *f.saved_at.chain)
                               if loc is not None))
    return files + [extra for extra in f.facts.module_files or () if extra not in files]


def _construction_intents(f: Finding, act: WriteRecord, module, written_op: str, saver_op: str):
    """(intents, construction sites, switching statements) for an in-place module's write."""
    found = writer_sites(_files(f, act), act.via) if module else None
    resolved, switches = bool(found and found[2]), found[1] if found else []
    site_list = found[0] if found else []
    # One intent per construction. Unresolved (the instance unknown): one per call of the class on each line with
    # inplace=True, the later first when two in-place activations follow each other, since the second is the one
    # that overwrites. Several candidates: none is preferred, gradguard fix tries them one at a time.
    consecutive = f.saved_at.argument == "result" and written_op.rstrip("_") == saver_op
    fixes = [FixIntent("remove_statement", *_loc(s), target=s.code, preferred=False,
                       reason=f"`{s.code}` made it write in place") for s in switches]
    position = inplace_position(module.group(1)) if module else None
    for site in site_list:
        for k in _occurrences(site, module.group(1), resolved, consecutive):
            detail = {"call": module.group(1), "keyword": "inplace", "value": False}
            if k is not None:
                detail["occurrence"] = k
            if position is not None and "inplace=" not in site.location.code:  # `nn.ReLU(True)`
                detail["position"] = position
            fixes.append(FixIntent("set_keyword", *_loc(site.location), target=None, detail=detail,
                                   reason=f"construct {module.group(1)} with inplace=False", preferred=False))
    if len(fixes) == 1:
        fixes = [_as_preferred(x) for x in fixes]
    return fixes, [s.location for s in site_list], switches


def _occurrences(site, call: str, resolved: bool, consecutive: bool) -> list:
    """Which calls of ``call`` on the construction line the intents edit (None: the only one)."""
    if resolved:
        return [site.occurrence]
    count = site.location.code.count(f"{call}(")
    return [None] if count <= 1 else list(range(count))[::-1 if consecutive else 1]


def _module_fix(f: Finding, module, via: str, sites: list, switches: list) -> str:
    """The suggestion for an in-place module: delete the statements that switched it, or construct it out of place."""
    owner = via[: module.start()].strip().rstrip("(").strip()  # "gate.2" in "gate.2 (ReLU(inplace=True))"
    if switches:
        lines = ", ".join(f"`{s.code}` ({_short(s, f)})" for s in switches)
        return (f"{lines} switched {owner or 'the ' + module.group(1)} to in-place after it was constructed: delete "
                f"{'it' if len(switches) == 1 else 'them'} (or set inplace to False). An in-place op is safe only "
                f"right after an op that does not save its output (Linear, Conv, BatchNorm).")
    at = f" at {_short(sites[0], f)}" if len(sites) == 1 else ""
    edited = (sites[0].code.replace("inplace=True", "inplace=False").rstrip(",").strip()
              if len(sites) == 1 and sites[0].code.count("inplace=True") == 1 else "")
    shown = edited if edited and is_valid_python(edited) else f"nn.{module.group(1)}(inplace=False)"
    return (f"Construct {owner or 'it'} with inplace=False{at}: `{shown}`. An "
            f"in-place op is safe only right after an op that does not save its output (Linear, Conv, "
            f"BatchNorm).")


def _op_fix(act: WriteRecord, via: str, written_op: str, fixes: list) -> str:
    """The suggestion (and intent, added to ``fixes``) for an in-place op no module made: its out-of-place form."""
    plain = via.replace("torch.", "").rstrip("_")
    code = statement_code(act.location)
    if act.location is not None and "inplace" in code:
        fixes.append(FixIntent("set_keyword", *_loc(act.location), target=None,
                               detail={"call": callee_of(code, keyword="inplace"), "keyword": "inplace", "value": False},
                               reason="call it out of place"))
    elif act.location is not None and out_of_place(code):
        fixes.append(FixIntent("inplace_to_out_of_place", *_loc(act.location), target=written_op,
                               reason=f"`{out_of_place(code)}` leaves the saved output intact"))
    return (f"Use the out-of-place form: `torch.{plain}(x)` (or `F.{plain}(x)` without inplace=True) instead "
            f"of {via}.")


def activation_rule(f: Finding, act: WriteRecord) -> Verdict:
    via = act.via or act.op
    module = _INPLACE_MODULE.search(via)
    written_op = act.op.split(".")[1] if act.op.count(".") >= 1 else act.op  # "relu_"
    saver_op = (_op_of(f.saved_at.node) or "").lower()
    fixes, sites, switches = _construction_intents(f, act, module, written_op, saver_op)
    written = (f" (written at {_short(sites[0], f)}: `{sites[0].code}`)" if len(sites) == 1
               else f" (constructed with inplace=True at {', '.join(_short(s, f) for s in sites)})" if sites
               else "")
    if f.saved_at.argument == "result" and saver_op and written_op.rstrip("_") == saver_op:
        shown = {"relu": "ReLU"}.get(saver_op, saver_op)
        owner = via[: module.start()].strip().rstrip("(").strip() if module else ""
        return Verdict(
            "consecutive_inplace_activation",
            f"Two in-place {shown}s in a row: the second ({via} at {_where(act, f)}{written}) overwrote the first "
            f"one's output, which the first one's backward ({_saver(f)}) needs: {why_saved(f)}.",
            f"Drop the second {shown}{' (' + owner + ')' if owner else ''}: {saver_op}({saver_op}(x)) == "
            f"{saver_op}(x). Or construct it with inplace=False"
            f"{' at ' + _short(sites[0], f) if len(sites) == 1 else ''}.",
            fixes,
        )
    fix = _module_fix(f, module, via, sites, switches) if module is not None else _op_fix(act, via, written_op, fixes)
    return Verdict(
        "inplace_activation",
        f"The in-place {'module' if module else 'op'} {via} at {_where(act, f)}{written} overwrote "
        f"{_what_was_overwritten(f)}, which {_saver(f)} saved for backward: {why_saved(f)}.",
        fix,
        fixes,
    )


def switched_later(f: Finding, act: WriteRecord, found=None) -> list[SourceLocation]:
    """The statements that made the writing module in-place after its constructor built it out of place
    (``self.drop.inplace = True``, ``m.inplace = True`` in a loop over modules); [] when a constructor passed
    inplace=True (the constructor is the cause: ``activation_rule``) or no such statement is found. ``found``:
    the module's construction sites (``writer_sites``: see NOTE [Resolving the writing instance to its
    construction]) when already looked up."""
    found = found or writer_sites(_files(f, act), act.via)
    module = _INPLACE_MODULE.search(act.via or "")
    if module is None or not found or not found[1]:
        return []
    sites, switches, _resolved = found
    kind = module.group(1)
    if sites and any(constructed_in_place(site, kind) for site in sites):
        return []
    if not sites and any(keyword_calls(file, kind, "inplace", True) for file in _files(f, act)):
        return []  # the instance's construction not found: any `Kind(inplace=True)` may be it
    return list(switches)


def flag_set_later_rule(f: Finding, act: WriteRecord) -> Verdict:
    via = act.via or act.op
    module = _INPLACE_MODULE.search(via)
    owner = via[: module.start()].strip().rstrip("(").strip() if module else ""
    found = writer_sites(_files(f, act), act.via)
    switches = switched_later(f, act, found)
    sites = [s.location for s in found[0]] if found else []
    built = f" ({_short(sites[0], f)}: `{sites[0].code}`)" if len(sites) == 1 else ""
    lines = " and ".join(f"`{s.code}` at {_short(s, f)}" for s in switches)
    listed = " and ".join(f"`{s.code}` ({_short(s, f)})" for s in switches)
    one = len(switches) == 1
    fixes = [FixIntent("remove_statement", *_loc(s), target=s.code,
                       reason=f"`{s.code}` switched {owner or 'the module'} to in-place after it was constructed")
             for s in switches if isinstance(single_statement(s.code), ast.Assign)]  # alone on its line
    return Verdict(
        "inplace_flag_set_later",
        f"The in-place module {via} at {_where(act, f)} overwrote {_what_was_overwritten(f)}, which {_saver(f)} saved "
        f"for backward: {why_saved(f)}. Its constructor built it out of place{built}; {lines} switched it to "
        f"in-place afterwards.",
        f"Delete {listed}, or set {'it' if one else 'them'} to False: {owner or 'the module'} then computes out "
        f"of place and leaves the saved output intact. An in-place op is safe only right after an op that does not "
        f"save its output (Linear, Conv, BatchNorm).",
        fixes,
    )


# -- Python spellings of in-place writes ------------------------------------------------------------------


def augmented_rule(f: Finding, aug: WriteRecord) -> Verdict:
    code = statement_code(aug.location) or aug.op
    rewritten = out_of_place(code)
    fix = (f"Write it out of place: `{rewritten}` instead of `{code}`. That makes a new tensor and leaves the "
           f"saved one intact." if rewritten else
           "Write it out of place: `x = x + y` instead of `x += y` (likewise `x = x * y`, `x = x / y`).")
    fixes = [FixIntent("augmented_to_binary", *_loc(aug.location), target=rewritten.split(" = ", 1)[0],
                       reason=f"`{rewritten}` makes a new tensor and leaves the saved one intact")
             ] if rewritten and aug.location is not None else []
    return Verdict(
        "augmented_assignment",
        f"`{code}` at {_where(aug, f)} is an in-place operation: it overwrote {_what_was_overwritten(f)}, which "
        f"{_saver(f)} saved for backward: {why_saved(f)}.",
        fix,
        fixes,
    )


def index_rule(f: Finding, idx: WriteRecord) -> Verdict:
    code = statement_code(idx.location)
    masked = mask_assignment(code) if code else None
    why = (f"The {'mask' if masked else 'index/slice'} assignment `{code or idx.op}` at {_where(idx, f)} writes in "
           f"place into {_what_was_overwritten(f)}, which {_saver(f)} saved for backward: {why_saved(f)}.")
    if masked:
        fixes = [FixIntent("inplace_to_out_of_place", *_loc(idx.location), target=masked.split(" = ", 1)[0],
                           detail={"method": "masked_fill"}, reason=f"`{masked}` leaves the saved tensor intact")
                 ] if idx.location is not None else []
        return Verdict("mask_assignment", why,
                       f"Mask out of place: `{masked}` (or `torch.where(mask, value, x)`); the saved tensor stays "
                       f"intact.", fixes)
    name = f.tensor.name if f.tensor.name and f.tensor.role not in ("parameter", "buffer") else None
    if name and idx.location is not None:
        # the name the writing statement uses (`out` inside forward), not the caller's name for the same tensor
        written = _base_name(written_expression(idx.location.file, idx.location.line))
        if written and written.isidentifier() and written != name:
            name = written
    if name and idx.location:
        fix = (f"Assign into a copy: insert `{name} = {name}.clone()` before line {idx.location.line}, so the "
               f"assignment changes the copy and {f.saved_at.node or 'backward'} keeps the saved values.")
        fixes = [FixIntent("insert_before", *_loc(idx.location), target=name,
                           detail={"code": f"{name} = {name}.clone()"},
                           reason="the assignment then changes a copy and backward keeps the saved values")]
        fixes += _clone_read_of_written(idx.location, code)
    else:
        fix = ("Assign into a copy (`x = x.clone(); x[idx] = value`) so the saved tensor stays intact, or use an "
               "out-of-place form such as `torch.where(mask, value, x)` or `x.index_put((idx,), value)`.")
        fixes = [_as_preferred(x) for x in _clone_read_of_written(idx.location, code)]
    return Verdict("index_assignment", why, fix, fixes)


def _clone_read_of_written(location: SourceLocation | None, code: str) -> list[FixIntent]:
    """``x[i] = f(x[i])``: an alternative that hands ``f`` a copy of the slot the statement overwrites."""
    stmt = parse_statement(code.strip()) if code and location is not None else None
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript)):
        return []
    slot = ast.get_source_segment(code.strip(), stmt.targets[0]) or ast.unparse(stmt.targets[0])
    compact = "".join(ast.unparse(stmt.targets[0]).split())
    if not any("".join(ast.unparse(n).split()) == compact for n in ast.walk(stmt.value)):
        return []
    return [FixIntent("clone_expression", *_loc(location), target=slot, preferred=False,
                      reason=f"the computation reads a copy of `{slot}`, so the write cannot change what it saved")]


# -- buffers -----------------------------------------------------------------------------------------------


def buffer_rule(f: Finding, copy: WriteRecord) -> Verdict:
    name = f.tensor.name or "the buffer"
    save = f.saved_at.location
    backward = SourceLocation.from_dict(f.facts.backward_at)
    attribute = f"self.{name.rsplit('.', 1)[-1]}"
    code = copy.location.code if copy.location else copy.op
    clone = ([FixIntent("clone_expression", *_loc(save), target=attribute,
                        reason=f"the forward keeps a snapshot of {name} in the graph")]
             if save is not None and attribute in save.code else [])
    if (_same_function(copy.location, save) and copy.location is not None and save is not None
            and copy.location.line < save.line):
        # The write sits above the save in the same forward(): a later call of forward wrote what an
        # earlier call saved, i.e. two forwards ran before one backward.
        use = (f"use `{attribute}.clone()` in `{save.code}` (line {save.line})" if attribute in save.code
               else f"use a clone of the buffer in the computation at line {save.line}")
        return Verdict(
            "buffer_updated_by_second_forward",
            f"`{save.function}` ran twice before backward (two forward passes, e.g. on a real and a fake batch). "
            f"The first call saved buffer {name} ({_saver(f)}, line {save.line}); the second call refilled it in place "
            f"at {_where(copy, f)} (`{code}`){_versions(copy)}, so the first call's backward would use the second "
            f"call's value.",
            f"Keep a snapshot in the graph: {use}, as torch.nn.utils.spectral_norm does; or run one forward on "
            f"both batches (`torch.cat([real, fake])`), or backward after each forward.",
            clone,
        )
    after = f"after `{backward.code}` (line {backward.line})" if backward is not None else "after the backward"
    fixes = list(clone)
    if copy.location is not None and backward is not None and copy.location.file == backward.file:
        fixes.append(FixIntent("move_statement", *_loc(copy.location), target=copy.location.code,
                               detail={"after_line": backward.line}, reason=f"refill {name} after the backward",
                               preferred=not fixes))
    return Verdict(
        "buffer_refill",
        f"`{code}` at {_where(copy, f)} refilled buffer {name} in place{_versions(copy)} after {_saver(f)} saved it in "
        f"the forward call at {_short(save, f)}; backward needs the value that forward used: {why_saved(f)}.",
        f"Refill {name} only {after}: move the call that reaches {_line_of(copy.location)} there. Or have forward "
        f"use a snapshot (`{attribute}.clone()`).",
        fixes,
    )


# -- one version counter shared by the slots of a buffer ---------------------------------------------------


def _base_name(expression: str | None) -> str | None:
    """``outputs[t]`` -> ``outputs``; ``out[:, i]`` -> ``out``; ``self.buf[0]`` -> ``self.buf``."""
    return (expression.split("[", 1)[0].strip() or None) if expression else None


def shared_counter_rule(f: Finding, write: WriteRecord) -> Verdict:
    code = statement_code(write.location) or write.op
    written = written_expression(write.location.file, write.location.line) if write.location else None
    base = _base_name(written)
    if base and not f.tensor.name:
        f.tensor.name = base
    buffer = f"`{base}`" if base else "the same buffer"
    save = f.saved_at.location
    why = (f"{_saver(f)} saved a part of {buffer} (the forward call at {_short(save, f)}); `{code}` at "
           f"{_where(write, f)} wrote another part of it{_versions(write)}. The bytes backward needs did not change, "
           f"but every view of one buffer shares one version counter, and PyTorch checks the whole buffer's "
           f"counter, not the slot's bytes, so backward refuses the saved part.")
    fixes: list[FixIntent] = []
    reader = _slot_reader(save, base) if save is not None and base else None
    if reader is not None:
        slot, at = reader
        fixes.append(FixIntent("clone_expression", *_loc(at), target=slot,
                               reason=f"backward saves a copy of `{slot}`, which later slot writes cannot bump"))
        fix = (f"Collect the steps in a list and stack them once (`steps.append(...)`, then "
               f"`{base} = torch.stack(steps)`), so no slot is written after it was saved; or clone the slot "
               f"that is read: `{slot}.clone()` in `{at.code}` ({_line_of(at)}).")
    else:
        fix = (f"Collect the steps in a list and stack them once (`steps.append(...)`, then `{base or 'out'} = "
               f"torch.stack(steps)`), so no part of the buffer is written after a part of it was saved; or clone "
               f"the part that is read before it is saved (`.clone()`).")
    return Verdict("shared_version_counter", why, fix, fixes)


def _slot_reader(save: SourceLocation, base: str) -> tuple[str, SourceLocation] | None:
    """The slot of ``base`` the saving statement reads, and where: in the statement itself
    (``out[t] = f(out[t - 1])``) or in the assignment of a name it reads (``x = h[l - 1]`` ... ``x @ w``)."""
    code = statement_code(save)
    slot = _read_slot(code, base)
    if slot:
        return slot, save
    tree = parse_code(code.strip())
    if tree is None:
        return None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for name in sorted(names):
        made = assignment_before(save.file, save.line, name)
        slot = _read_slot(statement_code(made), base) if made is not None else None
        if slot:
            return slot, made
    return None


def _read_slot(code: str, base: str) -> str | None:
    """``out[t] = f(out[t - 1])`` -> ``out[t - 1]``: the first slot of ``base`` the statement reads."""
    stmt = parse_statement(code.strip())
    value = getattr(stmt, "value", None)
    for node in ast.walk(value) if value is not None else ():
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == base:
            return ast.get_source_segment(code.strip(), node) or ast.unparse(node)
    return None
