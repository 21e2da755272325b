"""A backward (or ``torch.autograd.grad``) of a tensor autograd never recorded: PyTorch's "element 0 of tensors
does not require grad and does not have a grad_fn" comes out of the guard as a finding that says where the graph
stopped being recorded (NOTE [Where the graph stopped]) and, for the two causes a keyword repairs, the edit."""

from __future__ import annotations

import pytest

import gradguard


def _finding(tmp_path, code: str):
    script = tmp_path / "train.py"
    script.write_text(code)
    with pytest.raises(gradguard.GradientHazardError) as info:
        with gradguard.guard():
            exec(compile(code, str(script), "exec"), {"__name__": "__main__"})
    assert isinstance(info.value, RuntimeError)
    assert "element 0 of tensors does not require grad" in str(info.value.__cause__ or info.value)
    return info.value.finding, code.splitlines()


PINN = '''\
import torch
import torch.nn as nn

net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
x = torch.linspace(0, 1, 6).view(-1, 1).requires_grad_(True)
u = net(x)
u_x = torch.autograd.grad(u, x, torch.ones_like(u), retain_graph=True)[0]
u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=True)[0]
'''


def test_a_gradient_taken_without_create_graph_gets_it_where_it_was_taken(tmp_path):
    finding, lines = _finding(tmp_path, PINN)
    assert finding.kind == "no_graph" and finding.rule == "second_order_without_create_graph"
    assert finding.tensor.name == "u_x" and finding.tensor.shape == (6, 1)
    assert finding.explanation == (
        "`u_x` has no graph: it comes from `torch.autograd.grad` at line 7, called without create_graph=True, "
        "which returns the gradient as a constant. Differentiating it again (a second derivative, a gradient "
        "penalty) needs the graph of that gradient, so PyTorch finds nothing to backpropagate.")
    assert [(f.action, f.line, f.detail) for f in finding.fixes] == [
        ("set_keyword", 7, {"call": "torch.autograd.grad", "keyword": "create_graph", "value": True, "add": True})]


CHECKPOINT = '''\
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

emb = nn.Embedding(10, 4)
emb.weight.requires_grad_(False)
layer = nn.Linear(4, 4)
h = checkpoint(layer, emb(torch.tensor([1, 2])), use_reentrant=True)
loss = h.sum()
loss.backward()
'''


def test_a_reentrant_checkpoint_without_an_input_that_requires_grad_gets_the_non_reentrant_one(tmp_path):
    finding, lines = _finding(tmp_path, CHECKPOINT)
    assert finding.rule == "reentrant_checkpoint_without_grad_input" and finding.tensor.name == "loss"
    assert finding.suggestion.startswith("Pass use_reentrant=False to the checkpoint (line 8)")
    assert [(f.action, f.line, f.detail["keyword"], f.detail["value"]) for f in finding.fixes] == [
        ("set_keyword", 8, "use_reentrant", False)]


def test_any_other_cut_is_explained_without_an_edit(tmp_path):
    finding, _ = _finding(tmp_path, "import torch\nw = torch.ones(2, requires_grad=True)\nwith torch.no_grad():\n"
                                    "    loss = (w * 2).sum()\nloss.backward()\n")
    assert finding.rule == "no_graph" and finding.tensor.name == "loss" and not finding.fixes
    assert "computed under torch.no_grad()" in finding.explanation
    assert ("made", "at line 4: loss = (w * 2).sum()") in finding.facts.display
