"""A module writing into its caller's tensor that the caller reads again (issue 14, class 5).

PyTorch alone is silent and the forward is wrong (asserted); the write log (forensic mode) raises at the read
with the module, the write's call line and the read's line named (the sentinel, when the forward returns); correct uses of in-place modules (the name
rebound, a read in a branch not taken, metadata reads) stay quiet with bit-identical gradients.
"""

import pytest
import torch
from torch import nn

import gradguard
from _markers import Markers
from gradguard import SilentModificationError
from gradguard.core.later_reads import later_reads

MARKERS = Markers(__file__)
line_of = MARKERS.line


class VQResBlock(nn.Module):
    """rosinality/vq-vae-2-pytorch#60: the branch's first ReLU rectifies the block's input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(
            nn.ReLU(inplace=True),  # first relu
            nn.Conv2d(3, 4, 3, padding=1),
            nn.ReLU(inplace=True),  # second relu
            nn.Conv2d(4, 3, 1),
        )

    def forward(self, input):
        out = self.conv(input)  # vq call
        out += input  # vq read
        return out


class LeftOperand(nn.Module):
    """``x + self.branch(x)``: Python loads x before the call; the add reads the rectified x after it."""

    def __init__(self):
        super().__init__()
        self.branch = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(5, 5))

    def forward(self, x):
        return x + self.branch(x)  # left operand


class IResBlock(nn.Module):
    """iduta/iresnet#2: ``out = self.relu(x)`` keeps ``x`` bound to the same, rectified, tensor."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        identity = x
        out = self.relu(x)
        out = self.fc(out)
        return out + identity  # identity read


def _run(model, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    h = x * 1.0
    out = model(h)
    out.square().sum().backward()
    return out.detach(), x.grad


def test_vq_resblock_is_silently_wrong_without_the_guard():
    torch.manual_seed(0)
    block = VQResBlock()
    h = torch.randn(1, 3, 6, 6)
    expected = block.conv[3](torch.relu(block.conv[1](torch.relu(h)))) + h
    assert not torch.allclose(block(h.clone()), expected)


def test_vq_resblock_names_module_write_and_read():
    torch.manual_seed(0)
    block = VQResBlock()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            _run(block, (1, 3, 6, 6))
    f = info.value.finding
    assert f.kind == "module_input_write"
    assert f.rule == "module_writes_caller_input"
    assert f.tensor.name == "input"
    assert f.tensor.producer == "MulBackward0"  # before the ReLU wrote
    assert f.facts.module == "self.conv.0 (ReLU(inplace=True))"
    assert f.modified_at[0].location.line == line_of("vq call")
    assert f.facts.read["line"] == line_of("vq read")
    # this file constructs several ReLU(inplace=True): each is a candidate (the example file has one preferred)
    assert ("set_keyword", line_of("first relu")) in [(x.action, x.line) for x in f.fixes]
    assert ("clone_argument", line_of("vq call"), "input") in [(x.action, x.line, x.target) for x in f.fixes]


def test_left_operand_loaded_before_the_call_is_a_read():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            _run(LeftOperand(), (4, 5))
    f = info.value.finding
    assert f.tensor.name == "x"
    assert f.facts.module == "self.branch.0 (ReLU(inplace=True))"
    assert f.facts.read["line"] == line_of("left operand")


def test_alias_bound_before_the_call_is_a_read():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            _run(IResBlock(), (4, 5))
    f = info.value.finding
    assert f.tensor.name in ("x", "identity")
    assert f.facts.module == "self.relu (ReLU(inplace=True))"
    assert f.facts.read["line"] == line_of("identity read")


class Rebinds(nn.Module):
    """torchvision's BasicBlock shape: every in-place ReLU rebinds the name it is given."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 5), nn.Linear(5, 5)
        self.relu = nn.ReLU(inplace=True)
        self.seq = nn.Sequential(nn.Linear(5, 5), nn.ReLU(inplace=True), nn.Linear(5, 5))

    def forward(self, x, branch=False):
        identity = x
        out = self.fc1(x)
        out = self.relu(out)
        out = self.fc2(out)
        out += identity
        out = self.relu(out)
        h = self.seq(out)
        if branch:  # never taken in the test: a read that does not happen is not reported
            return h + out
        print_shape = out.shape  # metadata only
        assert print_shape[-1] == 5
        return h


class ReadInDeadBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x, mix=False):
        out = self.relu(x)
        if mix:
            return out + x
        return out * 2


class CalledForItsEffect(nn.Module):
    """``self.relu(h)`` as a statement of its own: the in-place effect is the point, reading ``h`` after is not a bug."""

    def __init__(self):
        super().__init__()
        self.fc, self.relu = nn.Linear(5, 5), nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        self.relu(h)
        return h * 2


@pytest.mark.parametrize("model", [Rebinds, ReadInDeadBranch, CalledForItsEffect],
                         ids=["rebinds", "dead_branch", "called_for_its_effect"])
def test_correct_inplace_modules_stay_quiet_and_bit_identical(model):
    torch.manual_seed(0)
    m = model()
    plain = _run(m, (4, 5))
    with gradguard.guard() as g:
        guarded = _run(m, (4, 5))
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


def test_the_callers_caller_reading_its_input_again():
    """The written tensor is the whole model's input: the training loop reads it again (an autoencoder target)."""
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(5, 5))
    torch.manual_seed(0)
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            target = torch.randn(4, 5)
            recon = model(target)
            loss = (recon - target).square().mean()  # autoencoder read
            loss.backward()
    f = info.value.finding
    assert f.tensor.name == "target" and f.tensor.role == "leaf"
    assert f.facts.read["line"] == line_of("autoencoder read")


def test_sentinel_finds_the_write_when_the_forward_returns():
    """No write log: the module forward hooks see the input's version move and read the caller's source."""
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(fingerprint="sample", track_writes=False):
            _run(VQResBlock(), (1, 3, 6, 6))
    f = info.value.finding
    assert f.kind == "module_input_write" and f.tensor.name == "input"
    assert f.facts.module == "self.conv.0 (ReLU(inplace=True))"
    assert f.modified_at[0].location.line == line_of("vq call")
    assert f.facts.read["line"] == line_of("vq read")


def _code_of(fn):
    return fn.__code__


def _sample(x, f):
    y = f(x)
    z = y + x
    x = z * 2
    return x + y


def test_later_reads_stop_at_a_rebinding():
    code = _code_of(_sample)
    first = code.co_firstlineno
    line = first + 1  # y = f(x)
    text = MARKERS.lines[line - 1]
    col = text.index("f(x)")
    reads = later_reads(code, (line, line, col, col + 4), frozenset({"x"}))
    assert [(name, span[0]) for name, span in reads] == [("x", first + 2)]  # not the x of `return x + y`


def test_the_diagnosing_rerun_records_it_and_goes_on(monkeypatch):
    """In `gradguard run`'s re-run (which looks for the first run's finding) the finding is kept, not raised."""
    from gradguard._rerun import RERUN_ENV

    monkeypatch.setenv(RERUN_ENV, "1")
    with gradguard.guard() as g:
        _run(VQResBlock(), (1, 3, 6, 6))
    assert [f.kind for f in g.findings] == ["module_input_write"]
    assert g.findings[0].rule == "module_writes_caller_input"


class AddsPosition(nn.Module):
    """A user module writing its input itself (`token += pos`): the write's own line is the one to edit."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.ones(5))
        self.fc = nn.Linear(5, 5)

    def forward(self, token):
        token += self.pos  # position write
        return self.fc(token)


def test_a_write_in_the_users_own_forward_names_its_line():
    """The write log (forensic) keeps the call and the write inside the module, the line a repair edits."""
    model = AddsPosition()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            quant = torch.randn(2, 5, requires_grad=True) * 1.0
            a = model(quant)  # position call
            b = model(quant)  # position read
            (a + b).sum().backward()
    f = info.value.finding
    assert f.kind == "module_input_write"
    assert [(w.location.line, w.category) for w in f.modified_at] == [
        (line_of("position call"), "module_input"), (line_of("position write"), "module_input")]
    assert f.modified_at[1].via == "inside AddsPosition.forward"
    # the repair is that statement written out of place (every caller is fixed), the caller's copy an alternative
    assert [(i.action, i.line, i.preferred) for i in f.fixes] == [
        ("inplace_to_out_of_place", line_of("position write"), True),
        ("clone_argument", line_of("position call"), False)]
    assert f.suggestion.startswith("Write it out of place in the module's forward: `token = token + self.pos` at ")


def test_gradguard_run_reruns_to_name_the_write_inside_the_module(tmp_path):
    """The sentinel's forward hook knows only the call; `gradguard run` re-runs with the write log for the line."""
    import json
    import subprocess
    import sys
    import textwrap

    (tmp_path / "script.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn

        class AddsPosition(nn.Module):
            def __init__(self):
                super().__init__()
                self.pos = nn.Parameter(torch.ones(5))

            def forward(self, token):
                token += self.pos
                return token * 2

        model = AddsPosition()
        quant = torch.randn(2, 5, requires_grad=True) * 1.0
        a = model(quant)
        b = model(quant)
        (a + b).sum().backward()
    '''))
    proc = subprocess.run([sys.executable, "-m", "gradguard", "run", "--json", "out.json", "script.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "re-running" in proc.stderr
    (finding,) = json.loads((tmp_path / "out.json").read_text())["findings"]
    assert finding["kind"] == "module_input_write"
    assert [w["line"] for w in finding["modified_at"]] == [16, 11]
