"""Nested torch.func transforms (vmap of grad, vmap of a custom Function) and the user's own saved-tensor hooks
under the guard, on every torch in the declared range. On torch 2.4 a nested transform popped the guard's hooks
twice (PyTorch's INTERNAL ASSERT), and gradguard's own reads of a Function's saved tensors called the user's
unpack hook again. Plain and guarded runs compared on exit code, output, gradients and hook calls."""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import gradguard

MODES = {"sentinel": {"fingerprint": "sample", "track_writes": False}, "forensic": {}}


class Square(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x

    @staticmethod
    def vmap(info, in_dims, x):
        return Square.apply(x), in_dims[0]


def vmap_of_grad():
    x = torch.linspace(-1, 1, 6).reshape(3, 2)
    return torch.func.vmap(torch.func.grad(lambda a: (a.sin() * a).sum()))(x)


def vmap_of_function():
    return torch.func.vmap(Square.apply)(torch.linspace(-1, 1, 6).reshape(3, 2))


def grad_of_vmap_of_function():
    return torch.func.grad(lambda a: torch.func.vmap(Square.apply)(a).sum())(torch.linspace(-1, 1, 6).reshape(3, 2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("program", [vmap_of_grad, vmap_of_function, grad_of_vmap_of_function])
def test_nested_transforms_run_as_without_gradguard(program, mode):
    expected = program()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradguard.NotWatched)
        with gradguard.guard(**MODES[mode]):
            got = program()
            x = torch.ones(3, requires_grad=True)
            y = x.exp()
            y.mul_(2)  # the guard watches again after the transforms
            with pytest.raises(gradguard.InplaceModificationError):
                y.sum().backward()
    assert torch.equal(got, expected)


def _counted_backward(where: str, program: str, options: dict):
    calls = []
    x = torch.linspace(-1, 1, 4, requires_grad=True)

    def hooks():
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: calls.append(1) or t)

    def forward():
        return (Square.apply(x) if program == "function" else x.exp()).sum()

    if where == "no guard":
        with hooks():
            y = forward()
        y.backward()
    elif where == "hooks around the guard":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gradguard.NotWatched)
            with hooks(), gradguard.guard(**options):
                forward().backward()
    else:
        with gradguard.guard(**options):
            with hooks():
                y = forward()
            y.backward()
    return len(calls), x.grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["hooks around the guard", "hooks inside the guard"])
@pytest.mark.parametrize("program", ["function", "exp"])
def test_the_users_unpack_hook_runs_once_per_saved_tensor(program, where, mode):
    expected = _counted_backward("no guard", program, {})
    got = _counted_backward(where, program, MODES[mode])
    assert got[0] == expected[0] == 1 and torch.equal(got[1], expected[1])


PROGRAM = textwrap.dedent("""
    import torch

    x = torch.linspace(-1, 1, 6).reshape(3, 2)
    print("vmap grad", torch.func.vmap(torch.func.grad(lambda a: (a.sin() * a).sum()))(x).tolist())
    print("jacrev of vmap", torch.func.jacrev(torch.func.vmap(torch.sin))(x).sum().item())
""")


def test_gradguard_run_nested_transforms_like_python(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)

    def run(*command):
        return subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    plain = run("prog.py")
    assert plain.returncode == 0, plain.stderr
    guarded = run("-m", "gradguard", "run", "prog.py")
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr[-3000:]
