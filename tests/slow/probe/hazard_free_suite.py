import subprocess, sys, threading, warnings
import numpy as np
import pytest
import torch


def test_func_grad():
    f = lambda x: (x.sin() * x).sum()
    x = torch.randn(4)
    g = torch.func.grad(f)(x)
    assert torch.allclose(g, x.cos() * x + x.sin())


def test_func_vjp_jacrev():
    x = torch.randn(3)
    j = torch.func.jacrev(torch.sin)(x)
    assert torch.allclose(j, torch.diag(x.cos()))


def test_compile_fullgraph():
    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(x):
        return (x.sin() * 2).sum()
    x = torch.randn(5, requires_grad=True)
    f(x).backward()
    assert torch.allclose(x.grad, 2 * x.detach().cos())


def test_user_saved_tensor_hooks():
    packed = []
    def pack(t):
        packed.append(1)
        return t.clone()
    x = torch.randn(4, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = (x.exp() * x).sum()
    y.backward()
    assert packed
    assert torch.allclose(x.grad, x.detach().exp() * (x.detach() + 1))


def test_checkpoint():
    from torch.utils.checkpoint import checkpoint
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    checkpoint(lambda t: lin(t).relu().sum(), x, use_reentrant=False).backward()
    assert x.grad is not None


def test_backward_in_thread():
    results = []
    def work():
        x = torch.randn(3, requires_grad=True)
        (x * x).sum().backward()
        results.append(torch.allclose(x.grad, 2 * x.detach()))
    threads = [threading.Thread(target=work) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results == [True, True]


def test_warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = torch.randn(3, requires_grad=True)
        x.sigmoid().sum().backward()
    assert x.grad is not None


def test_pytorch_inplace_error_match():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y = x.sigmoid()
        y.mul_(2)
        y.sum().backward()


def test_pytorch_backward_twice_match():
    x = torch.randn(3, requires_grad=True)
    y = x.exp().sum()
    y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_capsys_exact(capsys):
    x = torch.randn(3, requires_grad=True)
    x.exp().sum().backward()
    print("hello")
    assert capsys.readouterr() == ("hello\n", "")


def test_subprocess_torch():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "2.0\n"


def test_numpy_roundtrip():
    a = np.arange(4, dtype=np.float32)
    t = torch.from_numpy(a).requires_grad_()
    (t * t).sum().backward()
    a += 1  # after backward: legal
    assert t.grad.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_double_backward():
    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
    g.sum().backward()
    assert torch.allclose(x.grad, 6 * x.detach())


def test_sparse_csr():
    a = torch.eye(3).to_sparse_csr().requires_grad_()
    b = torch.randn(3, 2, requires_grad=True)
    (a @ b).sum().backward()
    assert b.grad is not None


def test_save_on_cpu():
    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        y = (x.exp() * 2).sum()
    y.backward()
    assert torch.allclose(x.grad, 2 * x.detach().exp())


def test_optimizer_step_loop():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        opt.step()
    assert all(p.grad is not None for p in model.parameters())
