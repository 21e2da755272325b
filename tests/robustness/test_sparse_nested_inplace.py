"""An in-place write into a saved sparse (COO, CSR) or nested tensor: PyTorch raises its version error, and so
must the program under gradguard (its saved-tensor hooks switch PyTorch's own check off; stepping aside for
these layouts once let the program exit 0 with a wrong gradient). A legal program with such tensors keeps
its gradients bit for bit."""

import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import gradguard

PROGRAM = textwrap.dedent("""
    import sys
    import warnings

    import torch

    warnings.simplefilter("ignore", UserWarning)  # torch's beta/prototype notices for CSR and nested tensors
    kind, write = sys.argv[1], sys.argv[2] == "write"
    b = torch.linspace(0, 1, 6).reshape(3, 2).requires_grad_()
    if kind == "nested":
        a = torch.nested.nested_tensor([torch.ones(2, 3), torch.full((4, 3), 0.5)])
        w = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], requires_grad=True)
        y = a * w
    else:
        a = torch.eye(3).to_sparse() if kind == "coo" else torch.eye(3).to_sparse_csr()
        y = torch.sparse.mm(a, b) if kind == "coo" else a @ b
    if write:
        a.mul_(2)
    if kind == "nested":
        torch.nested.to_padded_tensor(y, 0.0).sum().backward()
        print("grad", [t.tolist() for t in w.grad.unbind()])
    else:
        y.sum().backward()
        print("grad", b.grad.tolist())
""")


def _run(tmp_path: pathlib.Path, *command):
    (tmp_path / "prog.py").write_text(PROGRAM)
    return subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("write", ["write", "legal"])
@pytest.mark.parametrize("kind", ["coo", "csr", "nested"])
def test_gradguard_run_keeps_pytorchs_version_check(tmp_path, kind, write):
    plain = _run(tmp_path, "prog.py", kind, write)
    guarded = _run(tmp_path, "-m", "gradguard", "run", "prog.py", kind, write)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr[-3000:]
    if write == "write":
        assert plain.returncode == 1 and "modified by an inplace operation" in plain.stderr
        assert "modified by an inplace operation" in guarded.stderr, guarded.stderr[-3000:]
    else:
        assert plain.returncode == 0 and plain.stdout.startswith("grad"), plain.stderr


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("options", [{}, {"fingerprint": "sample", "track_writes": False}])
def test_the_guard_raises_pytorchs_error_for_a_write_into_a_saved_sparse_tensor(options):
    b = torch.ones(3, 2, requires_grad=True)
    a = torch.eye(3).to_sparse()
    with gradguard.guard(**options):
        y = torch.sparse.mm(a, b)
        a.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    assert b.grad is None
