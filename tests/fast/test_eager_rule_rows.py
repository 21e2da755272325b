"""The rows for PyTorch's eager errors (core/eager_rules.py) on hand-built findings, no framework: the facts the
torch probe gathers go in (``Facts.eager_check``, ``written``, ``carried``, ``crossing`` ...), the verdict comes out
(rule id, exact explanation and suggestion, intents, display lines), and the facts stay out of the JSON."""

from __future__ import annotations

import json
import linecache
import textwrap

import pytest

from gradguard.core.diagnosis import RULES, diagnose
from gradguard.core.facts import CrossingTensor, Facts
from gradguard.core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from gradguard.core.fixes import carried_state

SCRIPT = '''\
import torch
w = torch.randn(3, requires_grad=True)
w -= 0.1 * w.grad
x.add_(1)
a, b = pair.unbind(0)
a.mul_(2)
for c in pair.unbind(0):
    c.mul_(2)
embedding.weight[0] = 0
with torch.no_grad():
    first = hidden[:, :2]
first.mul_(2)
y.add_(1)
h = h0
for step in range(3):
    y, h = model(x, h)
    loss = y.sum()
    loss.backward()
total = 0
total += out.sum()
total.backward()
total += more.sum()
total.backward()
out = net(x)
target = teacher(x)
d_loss = D(target).sum()
d_loss.backward()
g_loss.backward()
'''


@pytest.fixture
def at(tmp_path):
    """(code) -> the SourceLocation of the first line of SCRIPT starting with code."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    linecache.checkcache(str(path))
    lines = path.read_text().splitlines()

    def locate(code: str) -> SourceLocation:
        number = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(code))
        return SourceLocation(str(path), number, "<module>", lines[number - 1].strip())

    return locate


def _refused(at, check: str, code: str, written: str | None, kind: str = "view_inplace", role: str = "view",
             **facts) -> Finding:
    """A finding as the probe gives it for an in-place write PyTorch refused at the line ``code``."""
    return diagnose(Finding(kind=kind, tensor=TensorInfo((3,), "float32", name=written, role=role),
                            modified_at=[WriteRecord("in-place write", at(code))],
                            facts=Facts(display=[], torch_message="PyTorch's message", eager_check=check,
                                        written=written, **facts)))


def _twice(at, backward: str, freed_by: str | None, **facts) -> Finding:
    """A finding as the probe gives it for a backward through a freed graph at the line ``backward``."""
    writes = [WriteRecord("backward", at(freed_by), via="the earlier backward, which freed the saved tensors",
                          category="backward")] if freed_by else []
    finding = Finding(kind="backward_twice", tensor=TensorInfo((), "float32", name="loss"), modified_at=writes,
                      facts=Facts(display=[], torch_message="Trying to backward through the graph a second time",
                                  eager_check="backward_twice", **facts))
    finding.facts.backward_at = at(backward).to_dict()
    return diagnose(finding)


def _intents(f: Finding) -> list[tuple]:
    return [(x.action, x.line, x.target, x.preferred) for x in f.fixes]


def test_a_leaf_update_goes_under_no_grad(at):
    f = _refused(at, "leaf", "w -= 0.1", "w", kind="leaf_inplace", role="leaf", made_at=at("w = torch"))
    assert f.rule == "leaf_inplace"
    assert f.explanation == (
        "`w` is a leaf tensor that requires grad (a parameter, or created with requires_grad=True): autograd "
        "accumulates its gradient into `w.grad`. Writing it in place with grad mode on would make that gradient "
        "refer to values that no longer exist, so PyTorch refuses the write.")
    assert f.suggestion == ("Make the update under no_grad, as optimizers do: `with torch.no_grad(): w -= 0.1 * "
                            "w.grad` (the update is not part of the model, so autograd must not record it).")
    assert _intents(f) == [("wrap_no_grad", 3, "w", True)]
    assert f.facts.display == [("created at", f"{at('w = torch').short}: w = torch.randn(3, requires_grad=True)")]


def test_a_leaf_computation_is_rewritten_out_of_place_first(at):
    f = _refused(at, "leaf", "x.add_(1)", "x", kind="leaf_inplace", role="leaf")
    assert f.suggestion == (
        "If this computes a new value, write it out of place: `x = x.add(1)` (a new tensor; gradients still flow "
        "to the original x). If it is meant to change the leaf itself (an update or initialisation), do it under "
        "no_grad: `with torch.no_grad(): x.add_(1)`.")
    assert _intents(f) == [("inplace_to_out_of_place", 4, "x", True), ("wrap_no_grad", 4, "x", False)]
    assert f.facts.display == []  # no line made it, and no parameter


def test_a_parameter_is_shown_as_made_by_its_module(at):
    f = _refused(at, "view_of_leaf", "embedding.weight[0]", "embedding.weight", kind="leaf_inplace",
                 role="parameter", owner_module="Embedding")
    assert f.rule == "view_of_leaf_inplace"
    assert f.explanation == ("`embedding.weight[0] = 0` writes a view (index/slice) of `embedding.weight`, a leaf "
                             "tensor that requires grad; writing the view writes the leaf, which autograd forbids "
                             "with grad mode on.")
    assert f.suggestion == (
        "Initialise or update the leaf under no_grad: `with torch.no_grad(): embedding.weight[0] = 0`. For a "
        "computation, write into a copy instead (`weight2 = embedding.weight.clone()` and index that). To keep an "
        "embedding's padding row at zero, `nn.Embedding(..., padding_idx=0)` zeroes it and keeps its gradient at "
        "zero.")
    assert f.facts.display == [("created at", "a module parameter (leaf tensor created by nn.Module)")]
    other = _refused(at, "view_of_leaf", "embedding.weight[0]", "embedding.weight", kind="leaf_inplace",
                     role="parameter", owner_module="Linear")
    assert "padding_idx" not in other.suggestion


def test_one_of_several_views_is_rewritten_or_cloned(at):
    f = _refused(at, "multi_output_view", "a.mul_(2)", "a", view_op="UnbindBackward0", made_at=at("a, b ="))
    assert f.rule == "multi_output_view_inplace"
    assert f.explanation == ("`a` is one of several views returned together by unbind() (line 5: `a, b = "
                             "pair.unbind(0)`). They share one backward node, so autograd cannot record an in-place "
                             "write into just one of them.")
    assert f.suggestion == ("Write it out of place: `a = a.mul(2)` instead of `a.mul_(2)`. Or clone the piece before "
                            "writing it (`a = a.clone()`).")
    assert _intents(f) == [("inplace_to_out_of_place", 6, "a", True), ("insert_before", 6, "a", False)]
    assert f.facts.display[0] == ("view of", "Unbind (several views returned by unbind())")


def test_a_loop_variable_view_is_indexed_not_rebound(at):
    f = _refused(at, "multi_output_view", "c.mul_(2)", "c", view_op="Unbind")
    assert f.suggestion.startswith("`c` is the variable of a for loop over a tensor")
    assert _intents(f) == [("index_loop_variable", 7, "c", True)]
    assert f.fixes[0].detail == {"index": "i"}


def test_a_view_made_under_no_grad_is_cloned_where_it_is_made(at):
    f = _refused(at, "no_grad_view", "first.mul_(2)", "first", made_at=at("first = hidden"))
    assert f.rule == "no_grad_view_inplace"
    assert f.explanation == ("`first` is a view created under torch.no_grad() (line 11) of a tensor that requires "
                             "grad, and `first.mul_(2)` writes it with grad mode on: autograd cannot tell whether the "
                             "write should be tracked, so it refuses.")
    assert f.suggestion == (
        "If `first` is meant as a separate value, make it a copy: `first = hidden[:, :2].clone()` (line 11). If the "
        "write should change the original without being tracked, move `first.mul_(2)` into the same `with "
        "torch.no_grad():` block; if it should be tracked, create the view outside no_grad.")
    assert _intents(f) == [("clone_assignment", 11, "first", True)]


def test_a_custom_functions_view_is_rewritten_out_of_place(at):
    f = _refused(at, "custom_function_view", "y.add_(1)", "y", view_op="Narrow")
    assert f.rule == "custom_function_view_inplace"
    assert f.explanation == ("`y` is a view returned by the custom autograd Function Narrow; autograd cannot rebase "
                             "the Function's backward on an in-place write into its output.")
    assert f.suggestion == ("Write it out of place (`y = y.add(1)`), or clone the output (`y = y.clone()`), or make "
                            "Narrow.forward return a fresh tensor (not a view of an input).")
    assert _intents(f) == [("inplace_to_out_of_place", 13, "y", True), ("insert_before", 13, "y", False)]
    # torch 2.4 names the Function's backward node ("NarrowBackward"): the same Function, the same words
    older = _refused(at, "custom_function_view", "y.add_(1)", "y", view_op="NarrowBackward")
    assert (older.explanation, older.suggestion) == (f.explanation, f.suggestion)
    assert f.facts.display == [("view from", "Narrow")]


def test_carried_state_is_detached_where_it_crosses_the_iteration(at):
    state = next(c for c in carried_state(at("loss.backward()")) if c.name == "h")
    f = _twice(at, "loss.backward()", "loss.backward()", carried=state, carried_tensors=2)
    assert f.rule == "carried_state_backward_twice"
    assert f.explanation == (
        "`h` carries the previous iteration's output into this one without .detach(), so this backward at line 18 "
        "runs on into the previous iteration's graph. The previous backward at line 18 already freed that graph's "
        "saved tensors (backward frees them unless retain_graph=True).")
    assert f.suggestion.startswith("Detach the carried state: `h = tuple(s.detach() for s in h)` right after line 16.")
    assert _intents(f) == [("insert_after", 16, "h", True)]
    assert f.facts.display == [("carried by", "`h` (a tuple of 2 tensors), assigned at line 16: y, h = model(x, h)"),
                               ("freed by", "the earlier backward at line 18: loss.backward()")]


def test_the_same_loss_backpropagated_twice_deletes_the_second_call(at):
    first, again = at("d_loss.backward()"), at("g_loss.backward()")
    f = _twice(at, "g_loss.backward()", "d_loss.backward()", receiver="g_loss", same_loss=[first, first, again])
    assert f.rule == "same_loss_backward_twice"
    assert f.explanation == ("The same `g_loss` is backpropagated twice: `d_loss.backward()` at line 27 already ran "
                             "its backward, which freed the saved tensors of its graph, and `g_loss.backward()` at "
                             "line 28 backpropagates it again.")
    assert f.suggestion.startswith("Backpropagate each loss once: delete `g_loss.backward()` at line 28;")
    assert _intents(f) == [("remove_statement", 28, "g_loss.backward()", True)]
    assert [label for label, _ in f.facts.display] == ["freed by", "again"]  # no second "freed by"


def test_a_forward_made_before_the_loop_is_repeated_in_it(at):
    hoisted = {"line": 16, "code": "out = net(x)", "name": "loss", "first": 24, "last": 24}
    f = _twice(at, "loss.backward()", "loss.backward()", forward_before_loop=hoisted)
    assert f.rule == "forward_outside_loop"
    assert f.suggestion.startswith("Run the forward inside the loop: line 24 again before line 16,")
    assert _intents(f) == [("insert_before", 16, "loss", True)]
    assert f.fixes[0].detail == {"code": "out = net(x)"}
    assert f.facts.display[0] == ("made", "`loss` once, before the loop (line 24)")


def test_a_crossing_tensor_is_detached_where_the_earlier_loss_uses_it(at):
    crossing = CrossingTensor("target", at("target = teacher"), at("d_loss = D(target)"), "D", "variable", "target",
                              False)
    f = _twice(at, "g_loss.backward()", "d_loss.backward()", crossing=crossing)
    assert f.rule == "freed_graph_reused"
    assert f.explanation == (
        "`target` (made at line 25) belongs to a graph that the backward at line 27 (`d_loss.backward()`) already "
        "went through and freed: `d_loss = D(target).sum()` (line 26) fed `target` into that backward's graph "
        "without .detach(), so that backward ran on into the graph that made `target`. The backward at line 28 "
        "(`g_loss.backward()`) reaches that graph again through `target` and finds its saved tensors gone.")
    assert f.suggestion == ("Detach it where the earlier loss uses it: `D(target.detach())` at line 26, so the "
                            "earlier backward stops at `target` and leaves its graph for the backward at line 28. If "
                            "the earlier loss must train what made `target` through it, detach it where the later "
                            "loss reads it instead (`gradguard fix` tries "
                            "both and keeps the one that leaves every optimizer its gradients).")
    assert _intents(f) == [("detach_argument", 26, "target", True)]
    assert [label for label, _ in f.facts.display] == ["crosses", "freed by"]


def test_a_crossing_tensor_without_its_use_is_detached_where_it_is_made(at):
    crossing = CrossingTensor("target", at("target = teacher"), None, None, None, None, False)
    f = _twice(at, "g_loss.backward()", "d_loss.backward()", crossing=crossing)
    assert f.suggestion.endswith("detach it where it is made: `target = teacher(x).detach()` (line 25).")
    assert _intents(f) == [("detach_assignment", 25, "target", True)]


def test_module_state_is_reset_or_detached_where_the_module_assigns_it(at):
    crossing = CrossingTensor("net.v", at("out = net(x)"), None, None, "module attribute", "out", False)
    f = _twice(at, "g_loss.backward()", "d_loss.backward()", crossing=crossing)
    assert f.explanation.startswith("`out` of net.v is state the module keeps from one forward to the next "
                                    "(assigned at line 24).")
    assert "or detach it where it is made: `out = net(x).detach()` (line 24)" in f.suggestion
    assert _intents(f) == [("detach_assignment", 24, "out", True)]


def test_module_state_its_class_never_assigns_is_detached_where_the_module_reads_it(at):
    # a register_buffer cache: no `self.v = ...` anywhere in the class, read back by `d_loss = D(target).sum()`
    crossing = CrossingTensor("net.v", None, None, None, "module attribute", "self.v", False,
                              read=at("d_loss = D(target)"))
    f = _twice(at, "g_loss.backward()", "d_loss.backward()", crossing=crossing)
    assert f.suggestion == (
        "Reset the state before each new sequence (set it to a fresh tensor, as a `reset()` or `reset_net(model)` "
        "after the optimizer step does), or detach it where the module reads it back: `self.v.detach()` in "
        "`d_loss = D(target).sum()` (line 26). retain_graph=True would only hide it: every iteration would "
        "backpropagate into all earlier ones.")
    assert _intents(f) == [("detach_expression", 26, "self.v", True)]


def test_an_accumulated_loss_is_reset_before_it_accumulates_again(at):
    f = _twice(at, "total.backward()", "total.backward()", receiver="total",
               accumulation={"first": 20, "again": 22, "reset_before": 22})
    assert f.rule == "accumulated_loss_not_reset"
    assert f.suggestion == ("Reset the accumulator before accumulating again: insert `total = 0` before line 22, so "
                            "each backward covers only its own losses.")
    assert _intents(f) == [("insert_before", 22, "total", True)]
    assert f.facts.display[0] == ("accumulates", "`total` at line 20, and again at line 22 without a reset in between")


def test_a_backward_twice_nothing_explains_gets_the_general_advice(at):
    f = _twice(at, "loss.backward()", "d_loss.backward()")
    assert f.rule == "backward_twice" and not f.fixes
    assert f.suggestion.startswith("Detach what you carry across iterations (`h = h.detach()`)")
    assert f.facts.display == [("freed by", "the earlier backward at line 27: d_loss.backward()")]
    assert _twice(at, "loss.backward()", None).facts.display == []


def test_the_probes_facts_stay_out_of_the_json(at):
    f = _refused(at, "leaf", "w -= 0.1", "w", kind="leaf_inplace", role="leaf", made_at=at("w = torch"))
    context = f.to_dict()["context"]
    assert list(context) == ["display", "torch_message"]
    text = json.dumps(f.to_dict())
    assert json.dumps(Finding.from_dict(json.loads(text)).to_dict()) == text


def test_findings_without_eager_facts_keep_their_verdict():
    # Paddle explains its own leaf error (backends/paddle/eager.py): no eager_check, no row runs
    f = diagnose(Finding(kind="leaf_inplace", tensor=TensorInfo((2,), "float32"), rule="leaf_inplace",
                         explanation="Paddle's why", suggestion="Paddle's fix", saved_at=SaveSite()))
    assert (f.rule, f.explanation, f.suggestion, f.fixes) == ("leaf_inplace", "Paddle's why", "Paddle's fix", [])


def test_every_eager_rule_id_is_a_row():
    names = [rule.name for rule in RULES]
    for rule in ("leaf_inplace", "view_of_leaf_inplace", "multi_output_view_inplace", "no_grad_view_inplace",
                 "custom_function_view_inplace", "carried_state_backward_twice", "same_loss_backward_twice",
                 "forward_outside_loop", "freed_graph_reused", "accumulated_loss_not_reset", "backward_twice"):
        assert rule in names
