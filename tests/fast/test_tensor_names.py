"""Unnamed saved tensors are named by the user variable that holds them (issue 12, class 5): a local, an
attribute of a user object, or the NumPy buffer a tensor was made from (corpus cases 027, 028, 063)."""

import numpy as np
import pytest
import torch

import gradguard


def test_a_variable_holding_the_stale_tensor_names_it():
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard():
            a = torch.ones(3, requires_grad=True)
            out = a.sigmoid()
            out.data.zero_()
            out.sum().backward()
    assert info.value.finding.tensor.label == "out (float32[3], output of SigmoidBackward0)"


class Runner:
    def __init__(self):
        self.obs = torch.randn(2, 4)


def test_an_attribute_of_a_user_object_names_it():
    runner = Runner()
    model = torch.nn.Linear(4, 1)
    with pytest.raises(gradguard.InplaceModificationError) as info:
        with gradguard.guard():
            loss = model(runner.obs).sum()
            runner.obs[:] = torch.zeros(2, 4)
            loss.backward()
    assert info.value.finding.tensor.name == "runner.obs"


def test_the_numpy_buffer_a_saved_tensor_shares_names_it():
    obs = np.ones((2, 4), dtype=np.float32)
    model = torch.nn.Linear(4, 1)
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard():
            loss = model(torch.as_tensor(obs)).sum()
            obs[:] = 2.0  # the environment refills its observation buffer
            loss.backward()
    assert info.value.finding.tensor.name == "obs"


def test_a_variable_holding_a_different_view_of_the_memory_does_not_name_it():
    from gradguard.backends.torch.graph import name_by_variable

    buffer = torch.zeros(3, 4)
    row = buffer[1]  # noqa: F841 - the variable name is what is looked up
    assert name_by_variable(buffer[1:2].detach()) is None  # same storage, another layout: not `buffer`
    assert name_by_variable(buffer[1].detach()) == "row"


class _PreActBlock(torch.nn.Module):
    """Corpus 005 (pytorch#15428): the residual's first layer is an in-place ReLU on the block's input."""

    def __init__(self):
        super().__init__()
        self.residual = torch.nn.Sequential(torch.nn.ReLU(inplace=True), torch.nn.Conv2d(2, 2, 1))
        self.shortcut = torch.nn.Conv2d(2, 2, 1)

    def forward(self, x):
        sc = self.shortcut(x)
        return self.residual(x) + sc


def test_a_tensor_only_named_inside_the_frame_that_wrote_it_keeps_that_name():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), _PreActBlock())
    with pytest.raises(gradguard.InplaceModificationError) as info:
        with gradguard.guard():
            net(torch.randn(1, 1, 3, 3)).sum().backward()
    # when backward fails, Block.forward's frame is gone; while the ReLU wrote into it, `x` held it
    assert info.value.finding.tensor.label == "x (float32[1, 2, 3, 3], output of ConvolutionBackward0)"


def _halves_of(y):
    return {("left", 0): y[:, :2], ("right", 1): y[:, 2:]}


def _scale_halves(halves, keys, by):
    for side, k in keys:
        halves[(side, k)] *= by  # the write goes through the dict: no local holds the written tensor


def test_a_tensor_a_container_holds_is_named_by_the_reference_the_write_goes_through():
    x = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(gradguard.InplaceModificationError) as info:
        with gradguard.guard():
            halves = _halves_of(x.exp())  # exp saves its output; only the dict of its halves is kept
            _scale_halves(halves, [("left", 0)], 2.0)
            sum(h.sum() for h in halves.values()).backward()
    assert info.value.finding.tensor.name == "halves[(side, k)]"
