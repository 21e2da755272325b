"""A gradient read from a tensor autograd computed (NOTE [A gradient read from a tensor that is no leaf]): the
AttributeError or TypeError the user's line raises on the None comes out of the guard as a finding that names the
tensor and where it was made, with the repairs (keep its gradient there, or make it a leaf there); the error stays
an instance of what the line raised."""

from __future__ import annotations

import pytest

import gradguard
from gradguard._errors import NonLeafGradError, NonLeafGradTypeError, NonLeafParamError


def _finding(tmp_path, code: str, error: type):
    script = tmp_path / "attack.py"
    script.write_text(code)
    with pytest.raises(error) as info:
        with gradguard.guard():
            exec(compile(code, str(script), "exec"), {"__name__": "__main__"})
    assert isinstance(info.value, gradguard.GradientHazardError)
    return info.value.finding, code.splitlines()


def _line(lines, code: str) -> int:
    return next(i for i, text in enumerate(lines, 1) if text.strip().startswith(code))


PGD = '''\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
x_adv = x.clone().requires_grad_(True)
for _ in range(3):
    loss = F.cross_entropy(model(x_adv), y)
    loss.backward()
    x_adv = x_adv + 0.01 * x_adv.grad.sign()
    x_adv = torch.clamp(x_adv, -1, 1)
'''


def test_an_attack_step_that_turns_its_leaf_into_a_computed_tensor(tmp_path):
    finding, lines = _finding(tmp_path, PGD, AttributeError)
    made = _line(lines, "x_adv = torch.clamp")  # the previous iteration's assignment made the value read
    assert finding.kind == "non_leaf_grad" and finding.rule == "grad_of_non_leaf"
    assert finding.tensor.name == "x_adv" and finding.tensor.producer == "ClampBackward1"
    assert [(f.action, f.line, f.target, f.detail, f.preferred) for f in finding.fixes] == [
        ("insert_after", made, "x_adv", {"code": "x_adv.retain_grad()"}, True),
        ("replace_expression", made, "torch.clamp(x_adv, -1, 1)",
         {"with": "(torch.clamp(x_adv, -1, 1)).detach().requires_grad_()"}, False)]
    assert finding.explanation == (
        f"`x_adv` is a tensor autograd computed (output of ClampBackward1), made at line {made} "
        f"(`x_adv = torch.clamp(x_adv, -1, 1)`), not a leaf: backward accumulates gradients only into leaves (and "
        f"tensors that called .retain_grad()), so `x_adv.grad` at line {_line(lines, 'x_adv = x_adv + 0.01')} is "
        f"None and the line fails on it (AttributeError: 'NoneType' object has no attribute 'sign'). PyTorch only "
        f"warns at the read.")


def test_a_typeerror_on_the_none_stays_a_typeerror(tmp_path):
    code = '''\
import torch

w = torch.randn(3, 1, requires_grad=True) * 0.1
loss = (torch.randn(4, 3) @ w).pow(2).sum()
loss.backward()
step = 0.1 * w.grad
'''
    finding, lines = _finding(tmp_path, code, TypeError)
    assert finding.tensor.name == "w" and finding.facts.made_at.line == 3  # no node noted: the assignment before
    assert finding.fixes[0].detail == {"code": "w.retain_grad()"}


@pytest.mark.parametrize("code, error", [
    # a leaf that was never backpropagated: its None is the user's own business
    ("import torch\nw = torch.zeros(2, requires_grad=True)\nw.grad.zero_()\n", AttributeError),
    # an error about None that reads no gradient
    ("import torch\nx = None\nx.shape\n", AttributeError),
])
def test_other_errors_about_none_are_left_as_they_were(tmp_path, code, error):
    script = tmp_path / "other.py"
    script.write_text(code)
    with pytest.raises(error) as info:
        with gradguard.guard():
            exec(compile(code, str(script), "exec"), {"__name__": "__main__"})
    assert not isinstance(info.value, gradguard.GradguardError)


def test_the_error_classes_keep_what_the_line_raised():
    assert issubclass(NonLeafGradError, AttributeError) and issubclass(NonLeafGradTypeError, TypeError)
    assert issubclass(NonLeafParamError, ValueError)
    assert not issubclass(NonLeafGradError, TypeError) and not issubclass(NonLeafGradTypeError, AttributeError)


TEMPERATURE = '''\
import torch
import torch.nn as nn


class Calibrator(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = torch.ones(1, requires_grad=True) * 1.5
        self.optimizer = torch.optim.LBFGS([self.temperature], lr=0.01)


Calibrator()
'''


def test_an_optimizer_given_a_computed_tensor_gets_it_made_a_leaf_where_it_is_made(tmp_path):
    finding, lines = _finding(tmp_path, TEMPERATURE, ValueError)
    made = _line(lines, "self.temperature = ")
    assert finding.kind == "non_leaf_param" and finding.rule == "optimizer_of_non_leaf"
    assert finding.tensor.name == "self.temperature" and finding.tensor.producer == "MulBackward0"
    assert [(f.action, f.line, f.target, f.detail, f.preferred) for f in finding.fixes] == [
        ("replace_expression", made, "torch.ones(1, requires_grad=True) * 1.5",
         {"with": "(torch.ones(1, requires_grad=True) * 1.5).detach().requires_grad_()"}, True)]
    assert "the optimizer at line 9 refuses it (ValueError: can't optimize a non-leaf Tensor)" in finding.explanation


SALIENCY = '''\
import torch
import torch.nn as nn


def normalise(x):
    x = (x - x.mean()) / x.std()
    return x


def vanilla_gradient(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return x.grad.abs()


def perturb(model, x):
    xadv = x + 0.1 * torch.randn_like(x)
    return torch.clamp(xadv, 0, 1)


model = nn.Linear(4, 3)
image = torch.rand(2, 4)
vanilla_gradient(model, image, torch.tensor([0, 2]))
'''


def test_a_tensor_that_does_not_require_grad_gets_it_where_its_caller_made_it(tmp_path):
    finding, lines = _finding(tmp_path, SALIENCY, AttributeError)
    # `x` is the function's argument (an earlier function of the file assigns an `x` of its own): the caller's
    # `image` is where it was made
    made = _line(lines, "image = torch.rand")
    assert finding.kind == "non_leaf_grad" and finding.rule == "grad_of_tensor_not_requiring_grad"
    assert finding.tensor.name == "x" and finding.tensor.role == "leaf"
    assert finding.explanation.startswith(
        f"`image` (made at line {made}: `image = torch.rand(2, 4)`), read as `x`, does not require grad")
    assert [(f.action, f.line, f.target, f.detail) for f in finding.fixes] == [
        ("insert_after", made, "image", {"code": "image.requires_grad_()"})]


def test_a_value_made_in_a_helper_is_kept_where_the_caller_binds_it(tmp_path):
    code = SALIENCY.replace("vanilla_gradient(model, image, torch.tensor([0, 2]))\n", '''\
adv = perturb(model, image.requires_grad_())
nn.functional.cross_entropy(model(adv), torch.tensor([0, 2])).backward()
adv.grad.sign()
''')
    finding, lines = _finding(tmp_path, code, AttributeError)
    # the clamp's node was noted inside `perturb`, where it is called `xadv`: the caller's assignment binds `adv`
    assert finding.rule == "grad_of_non_leaf" and finding.facts.made_at.line == _line(lines, "adv = perturb")
    assert finding.fixes[0].detail == {"code": "adv.retain_grad()"}
