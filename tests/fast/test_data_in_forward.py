"""A forward changing its own parameter through ``.data`` before using it (issue 14, class 7).

PyTorch alone is silent and the gradient misses the normalisation (asserted); the write log (forensic mode)
raises when the forward saves the parameter, naming the ``.data`` statement and the use; the sentinel's module
forward hooks raise after the forward, naming the same two lines. Data-dependent
initialisation (ActNorm), resets and normalisation done in the graph stay quiet with bit-identical gradients.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradguard
from _markers import Markers
from gradguard import SilentModificationError
from gradguard.core.data_statements import data_statements

MARKERS = Markers(__file__)
line_of = MARKERS.line


class AssignNormalised(nn.Module):
    """ydwen/opensphere#7: ``self.w.data = F.normalize(self.w.data, dim=0)`` before ``x @ self.w``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        with torch.no_grad():
            self.w.data = F.normalize(self.w.data, dim=0)  # assign data
        return x @ self.w  # use w


class DivideInPlace(nn.Module):
    """Weight standardisation written as an in-place ``.data`` op."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        self.fc.weight.data.div_(self.fc.weight.data.norm(dim=1, keepdim=True))  # divide data
        return self.fc(x)  # use fc


class ActNorm(nn.Module):
    """Glow's data-dependent initialisation: the first batch sets the parameters through ``.data``."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, 6))
        self.scale = nn.Parameter(torch.ones(1, 6))
        self.initialized = False

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.loc.data.copy_(-x.mean(0, keepdim=True))
                self.scale.data.copy_(1 / (x.std(0, keepdim=True) + 1e-6))
            self.initialized = True
        return self.scale * (x + self.loc)


class ClippedInForward(nn.Module):
    """WGAN-style weight clipping done in forward: projected gradient descent, on purpose."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        self.fc.weight.data.clamp_(-0.01, 0.01)
        return self.fc(x)


class NormalisedInGraph(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        return x @ F.normalize(self.w, dim=0)


def _step(module):
    torch.manual_seed(1)
    x = torch.randn(5, 6, requires_grad=True)
    module(x * 1.0).square().sum().backward()
    return [p.grad for p in module.parameters()] + [x.grad]


def test_assigning_data_is_silently_wrong_without_the_guard():
    torch.manual_seed(0)
    m = AssignNormalised()
    w0 = m.w.detach().clone().requires_grad_()
    _step(m)
    torch.manual_seed(1)
    x = torch.randn(5, 6)
    (x @ F.normalize(w0, dim=0)).square().sum().backward()  # the loss the forward means
    assert not torch.allclose(m.w.grad, w0.grad)


@pytest.mark.parametrize("module, write, use, in_graph", [
    (AssignNormalised, "assign data", "use w", "w = F.normalize(self.w, dim=0)"),
    (DivideInPlace, "divide data", "use fc", "w = self.fc.weight.div(self.fc.weight.norm(dim=1, keepdim=True))"),
], ids=["assign", "div_"])
def test_data_write_before_use_is_caught(module, write, use, in_graph):
    torch.manual_seed(0)
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            _step(module())
    f = info.value.finding
    assert f.kind == "data_write_in_forward" and f.rule == "data_in_forward"
    assert f.modified_at[0].location.line == line_of(write)
    assert f.facts.used_at["line"] == line_of(use)
    assert f.tensor.role == "leaf"
    # the fix is the write's own computation, made in the graph (the `.data` reads dropped)
    assert f"Compute it as a new tensor and use that: `{in_graph}`" in f.suggestion
    assert "outside forward" in f.suggestion


class MaskedConvs(nn.Module):
    """A pruning mask applied through ``.data`` to every conv, in the blocks and in the stem: one finding, each
    write listed (the outer forward's post-hook runs after the blocks')."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, 6)
        self.mask = torch.ones(6, 6).tril()
        self.block = DivideInPlace()

    def forward(self, x):
        self.stem.weight.data = self.stem.weight * self.mask  # mask stem
        return self.block(self.stem(x))


def test_every_data_write_of_one_forward_is_listed_in_one_finding():
    torch.manual_seed(0)
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(fingerprint="sample", track_writes=False):  # the default run's sentinel: module hooks
            _step(MaskedConvs())
    f = info.value.finding
    assert [w.location.line for w in f.modified_at] == [line_of("divide data"), line_of("mask stem")]


@pytest.mark.parametrize("module", [ActNorm, NormalisedInGraph, ClippedInForward],
                         ids=["actnorm_init", "in_graph", "clipping"])
def test_initialisation_and_graph_normalisation_stay_quiet(module):
    torch.manual_seed(0)
    plain = _step(module())
    torch.manual_seed(0)
    with gradguard.guard() as g:
        guarded = _step(module())
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


@pytest.mark.parametrize("module, written, used", [(AssignNormalised, "assign data", "use w"),
                                                    (DivideInPlace, "divide data", "use fc")])
def test_sentinel_finds_the_data_write_through_its_forward_hooks(module, written, used):
    # no write log: the module forward hooks compare the parameter before and after the forward
    torch.manual_seed(0)
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(fingerprint="sample", track_writes=False):
            _step(module())
    finding = info.value.finding
    assert finding.kind == "data_write_in_forward"
    assert finding.modified_at[0].location.line == line_of(written)
    assert finding.facts.used_at["line"] == line_of(used)


def test_data_statements_keep_only_writes_that_read_the_old_value():
    code = ActNorm.forward.__code__
    assert data_statements(code.co_filename, code.co_firstlineno, "forward") == ()  # copy_ of another value
    code = DivideInPlace.forward.__code__
    (statement,) = data_statements(code.co_filename, code.co_firstlineno, "forward")
    assert statement[:2] == ("self.fc.weight", line_of("divide data"))


class FailingOuter(nn.Module):
    """An outer forward that raises after its block wrote `.data`: its post-hook never runs."""

    def __init__(self):
        super().__init__()
        self.block = DivideInPlace()

    def forward(self, x, fail=False):
        out = self.block(x)
        if fail:
            raise ValueError("the user's own error")
        return out


def test_a_forward_that_raised_does_not_hold_back_the_next_finding():
    torch.manual_seed(0)
    model = FailingOuter()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(fingerprint="sample", track_writes=False):
            with pytest.raises(ValueError, match="the user's own error"):  # the user's error stands as it is
                model(torch.randn(5, 6), fail=True)
            model(torch.randn(5, 6)).square().sum().backward()
    assert [w.location.line for w in info.value.finding.modified_at] == [line_of("divide data")]
