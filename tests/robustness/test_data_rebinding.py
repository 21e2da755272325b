"""`u.data = new` after a forward that saved `u`: PyTorch keeps a saved leaf as the tensor itself, so backward
reads the new memory. Under gradguard the gradient must be the same (its pack once kept a `detach()` alias of
the old memory: the gradient silently changed), and the rebinding, which changes what backward reads without
moving a version, is reported as a silent write where fingerprints are on."""

import subprocess
import sys
import textwrap

import pytest
import torch

import gradguard

PROGRAM = textwrap.dedent("""
    import torch

    x = torch.ones(3, requires_grad=True)
    u = torch.ones(3)
    y = (x * u).sum()
    u.data = torch.full((3,), 5.0)
    y.backward()
    print("grad", x.grad.tolist())
""")


def _rebinding_program():
    x = torch.ones(3, requires_grad=True)
    u = torch.ones(3)
    w = torch.nn.Parameter(torch.ones(3))
    y = (x * u * w).sum()
    u.data = torch.full((3,), 5.0)
    w.data = torch.full((3,), 2.0)
    y.backward()
    return x.grad, w.grad


@pytest.mark.parametrize("options", [{"fingerprint": "off"}, {"fingerprint": "off", "track_writes": False}])
def test_the_gradient_follows_the_rebinding_as_without_gradguard(options):
    expected = _rebinding_program()
    assert expected[0].tolist() == [10.0] * 3  # PyTorch reads the new u and w
    with gradguard.guard(**options) as g:
        got = _rebinding_program()
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and g.findings == []


@pytest.mark.parametrize("options", [{}, {"fingerprint": "sample", "track_writes": False}])
def test_the_rebinding_is_reported_as_a_silent_write(options):
    with pytest.raises(gradguard.SilentModificationError) as raised:
        with gradguard.guard(**options):
            _rebinding_program()
    notes = " ".join(raised.value.findings[0].notes)
    assert ("other memory than when it was saved" in notes) == bool(options.get("track_writes", True)), notes


def test_rebinding_to_equal_values_is_no_finding():
    x = torch.ones(3, requires_grad=True)
    u = torch.ones(3)
    with gradguard.guard() as g:
        y = (x * u).sum()
        u.data = u.data.clone()  # new memory, same values: backward reads the same numbers
        y.backward()
    assert g.findings == [] and x.grad.tolist() == [1.0] * 3


def test_gradguard_run_never_prints_the_old_memorys_gradient(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)

    def run(*command):
        return subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    plain = run("prog.py")
    assert (plain.returncode, plain.stdout) == (0, "grad [5.0, 5.0, 5.0]\n"), plain.stderr
    guarded = run("-m", "gradguard", "run", "prog.py")
    assert guarded.returncode == 1 and guarded.stdout == "", guarded.stdout  # reported, never (1, 1, 1)
    assert "SilentModificationError" in guarded.stderr and "u (float32[3])" in guarded.stderr, guarded.stderr[-3000:]
