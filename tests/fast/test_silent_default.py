"""The silent classes found by the sentinel (no write log, the default of ``gradguard run``) through its module
forward hooks: a module writing its caller's input that the caller reads on every path, and a forward changing
its parameter through ``.data`` before using it. Correct programs with in-place modules and ``.data`` writes
stay quiet with bit-identical gradients, and the hooks are gone after the guard."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradguard
from _markers import Markers
from gradguard import SilentModificationError

MARKERS = Markers(__file__)
line_of = MARKERS.line


def _sentinel():
    return gradguard.guard(fingerprint="sample", track_writes=False)


class IdentityAfterBranch(nn.Module):
    """iResNet: the block input, rectified in place, is the identity added after an `if` that may rebind it."""

    def __init__(self, downsample=None):
        super().__init__()
        self.fc, self.relu, self.downsample = nn.Linear(5, 5), nn.ReLU(inplace=True), downsample

    def forward(self, x):
        identity = x
        out = self.relu(x)  # identity write
        out = self.fc(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity  # identity read
        return out


def test_an_input_read_after_a_branch_that_may_rebind_it():
    with pytest.raises(SilentModificationError) as info:
        with _sentinel():
            IdentityAfterBranch()(torch.randn(4, 5) * 1.0).sum().backward()
    f = info.value.finding
    assert f.kind == "module_input_write" and f.tensor.name in ("x", "identity")
    assert f.modified_at[0].location.line == line_of("identity write")
    assert f.facts.read["line"] == line_of("identity read")
    assert f.facts.module == "self.relu (ReLU(inplace=True))"


class CosFaceHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 5))

    def forward(self, x):
        w = self.weight
        w.data = F.normalize(w.data, dim=1)  # normalise data
        return F.normalize(x, dim=1) @ w.t()  # use weight


def test_a_data_normalisation_through_a_local_alias():
    with pytest.raises(SilentModificationError) as info:
        with _sentinel():
            CosFaceHead()(torch.randn(4, 5)).sum().backward()
    f = info.value.finding
    assert f.kind == "data_write_in_forward" and f.tensor.name == "w"
    assert f.modified_at[0].location.line == line_of("normalise data")
    assert f.facts.used_at["line"] == line_of("use weight")


class BranchOnlyRead(nn.Module):
    """The rectified input is read again only in a branch that does not run."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x, mix=False):
        out = self.relu(x)
        if mix:
            return out + x
        return out * 2


class Rebinding(nn.Module):
    """torchvision's BasicBlock: each in-place ReLU rebinds the name it is given; the identity is kept apart."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.relu = nn.Linear(5, 5), nn.Linear(5, 5), nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.relu(self.fc1(x))
        out = self.fc2(out)
        out += identity
        out = self.relu(out)
        return out


class ProjectedWeight(nn.Module):
    """Max-norm projection and a reset through .data: not the normalisation class (a projection on purpose)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        self.fc.weight.data.renorm_(2, 0, 1.0)
        return self.fc(x)


@pytest.mark.parametrize("model", [BranchOnlyRead, Rebinding, ProjectedWeight])
def test_correct_programs_stay_quiet_and_bit_identical(model):
    def run():
        torch.manual_seed(0)
        m = model()
        x = torch.randn(4, 5, requires_grad=True)
        m(x * 1.0).square().sum().backward()
        return [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]

    plain = run()
    with _sentinel() as g:
        guarded = run()
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


class ExpandedMessage(nn.Module):
    """HiDDeN's encoder: the message made 4-d with an in-place unsqueeze of a view of it (its shape, not its values)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, image, message):
        expanded = message.unsqueeze(-1)
        expanded.unsqueeze_(-1)  # bumps the version `message` shares, writes no value
        return self.fc(image) * expanded.squeeze(-1).squeeze(-1)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_view_reshaped_in_place_is_no_write_into_the_callers_input(transposed):
    def run():
        torch.manual_seed(0)
        m = ExpandedMessage()
        image, message = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
        if transposed:  # another metadata-only op, on the input itself
            message = message.t().t_()
        out = m(image, message)
        ((out - message) ** 2).sum().backward()  # the caller reads `message` again
        return [p.grad.clone() for p in m.parameters()] + [image.grad.clone()]

    plain = run()
    with _sentinel() as g:
        guarded = run()
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


def test_a_module_writing_the_values_of_its_input_is_still_found_beside_metadata_ops():
    class Scaled(ExpandedMessage):
        def forward(self, image, message):
            out = super().forward(image, message)
            message.mul_(2)  # a value written
            return out

    with pytest.raises(SilentModificationError) as info:
        with _sentinel():
            image, message = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
            out = Scaled()(image, message)
            ((out - message) ** 2).sum().backward()
    assert info.value.finding.kind == "module_input_write" and info.value.finding.tensor.name == "message"


def test_the_hooks_are_removed_when_the_guard_exits():
    from torch.nn.modules import module

    before = (len(module._global_forward_pre_hooks), len(module._global_forward_hooks))
    unsqueeze_ = torch.Tensor.__dict__.get("unsqueeze_")  # inherited from TensorBase: not in Tensor's own dict
    with _sentinel():
        assert len(module._global_forward_hooks) == before[1] + 1
        assert torch.Tensor.__dict__.get("unsqueeze_") is not None  # NOTE [Metadata-only in-place ops are no writes]
    assert (len(module._global_forward_pre_hooks), len(module._global_forward_hooks)) == before
    assert torch.Tensor.__dict__.get("unsqueeze_") is unsqueeze_
