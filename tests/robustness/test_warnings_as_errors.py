"""`-W error` / `PYTHONWARNINGS=error` on a legal program gradguard steps aside for (torch.func, sparse saved
tensors): the NotWatched notice must not become an exception inside PyTorch's hooks. Run plainly and under
`gradguard run`: same exit code and output (gradients printed)."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import gradguard

PROGRAM = textwrap.dedent("""
    import torch

    x = torch.linspace(-1, 1, 5)
    print("func.grad", torch.func.grad(lambda a: (a.sin() * a).sum())(x).tolist())
    a = torch.eye(3).to_sparse().requires_grad_()
    b = torch.linspace(0, 1, 6).reshape(3, 2).requires_grad_()
    torch.sparse.mm(a, b).sum().backward()
    print("sparse", b.grad.tolist())
""")


def _run(tmp_path, flags, env):
    (tmp_path / "prog.py").write_text(PROGRAM)
    return subprocess.run([sys.executable, *flags], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.parametrize("how", ["-W error", "PYTHONWARNINGS=error"])
def test_warnings_as_errors_run_like_python(tmp_path, how):
    flags, env = (["-W", "error"], {}) if how == "-W error" else ([], {"PYTHONWARNINGS": "error"})
    plain = _run(tmp_path, [*flags, "prog.py"], env)
    assert plain.returncode == 0, plain.stderr
    guarded = _run(tmp_path, [*flags, "-m", "gradguard", "run", "prog.py"], env)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr[-3000:]
    assert "INTERNAL ASSERT" not in guarded.stderr and "NotWatched" in guarded.stderr


@pytest.mark.parametrize("options", [{}, {"fingerprint": "sample", "track_writes": False}])
def test_an_error_filter_shows_the_notice_and_the_transform_runs(options):
    x = torch.linspace(-1, 1, 5)
    expected = torch.func.grad(lambda a: (a.sin() * a).sum())(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gradguard.guard(**options) as g:
            got = torch.func.grad(lambda a: (a.sin() * a).sum())(x)
            y = torch.ones(3, requires_grad=True)
            (y.exp() * 2).sum().backward()  # the guard's hooks are back after the transform
    assert torch.equal(got, expected) and torch.equal(y.grad, torch.ones(3).exp() * 2) and g.findings == []
