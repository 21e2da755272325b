"""Where gradguard cannot watch, it steps aside with one NotWatched warning per kind and the program runs as
without it (issue 11 point 2): torch.func transforms, sparse and nested tensors, torch.compile (fullgraph too),
in both guard modes. Gradients are compared bit for bit with the same code run without gradguard."""

import warnings

import pytest
import torch

import gradguard

MODES = {"sentinel": {"fingerprint": "sample", "track_writes": False}, "forensic": {}}


def func_grad():
    x = torch.linspace(-1, 1, 5)
    return (torch.func.grad(lambda a: (a.sin() * a).sum())(x),)


def func_vjp_jacrev():
    x = torch.linspace(-1, 1, 4)
    _, vjp = torch.func.vjp(torch.tanh, x)
    return vjp(torch.ones(4))[0], torch.func.jacrev(torch.sin)(x)


class _GradInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        g, v = torch.func.grad_and_value(lambda a: (a.sin() * a).sum())(x)
        ctx.save_for_backward(g)
        return v

    @staticmethod
    def backward(ctx, grad):
        (g,) = ctx.saved_tensors
        return grad * g


def func_inside_custom_function():
    x = torch.linspace(-1, 1, 5).requires_grad_()
    _GradInForward.apply(x).backward()
    return (x.grad,)


def sparse_csr():
    a = torch.eye(3).to_sparse_csr().requires_grad_()
    b = torch.linspace(0, 1, 6).reshape(3, 2).requires_grad_()
    (a @ b).sum().backward()
    return (b.grad,)


def nested():
    nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.full((4, 3), 0.5)], requires_grad=True)
    out = (nt * 2).sin()
    torch.nested.to_padded_tensor(out, 0.0).sum().backward()
    return tuple(nt.grad.unbind())


def compile_fullgraph():
    f = torch.compile(lambda a: (a.sin() * a).sum(), fullgraph=True, backend="eager")
    x = torch.linspace(-1, 1, 5).requires_grad_()
    f(x).backward()
    return (x.grad,)


PROGRAMS = {
    "torch.func.grad": (func_grad, "torch.func"),
    "torch.func.vjp/jacrev": (func_vjp_jacrev, "torch.func"),
    "grad_and_value in a Function's forward": (func_inside_custom_function, "torch.func"),
    "sparse CSR": (sparse_csr, "sparse_csr tensors"),
    "nested": (nested, "nested tensors"),
    "compile fullgraph": (compile_fullgraph, None),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_steps_aside_and_runs_as_without_gradguard(name, mode):
    program, unwatched = PROGRAMS[name]
    expected = program()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gradguard.guard(**MODES[mode]) as g:
            got = program()
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert g.findings == []
    notes = [str(w.message) for w in caught if issubclass(w.category, gradguard.NotWatched)]
    if unwatched is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith("gradguard: not watching ")
        assert unwatched in notes[0]
        assert "\n" not in notes[0]


def test_torch_func_outside_the_guard_still_refuses_the_users_own_hooks():
    # Stepping aside pops only gradguard's hooks: with the user's hooks on top, torch.func raises as it would
    # without gradguard.
    with gradguard.guard(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        with pytest.raises(RuntimeError, match="don't yet support saved tensor hooks"):
            func_grad()


def test_the_guard_still_watches_after_a_stepped_aside_region():
    with pytest.raises(gradguard.InplaceModificationError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gradguard.NotWatched)
            with gradguard.guard():
                func_grad()
                x = torch.ones(3, requires_grad=True)
                y = torch.sigmoid(x)
                y.mul_(2)
                y.sum().backward()


def test_a_compiled_function_keeps_running_its_compiled_graph_after_a_guarded_block():
    runs = []

    def counting_backend(gm, example_inputs):
        def compiled(*args):
            runs.append(1)
            return gm.forward(*args)
        return compiled

    torch._dynamo.reset()
    f = torch.compile(lambda a: (a.cos() * a).sum(), backend=counting_backend)
    x = torch.linspace(-1, 1, 5).requires_grad_()
    expected = f(x)
    assert len(runs) == 1
    with gradguard.guard():
        guarded = f(x)
    assert len(runs) == 2  # the compiled graph ran under the guard too
    after = f(x)
    assert len(runs) == 3  # and still runs after the guard left (it fell back to eager for good before)
    assert torch.equal(expected, guarded) and torch.equal(expected, after)
