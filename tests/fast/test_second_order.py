"""An in-place parameter update that drops the create_graph gradient it was made from (issue 14, class 6).

MAML's inner step applied under no_grad: PyTorch alone is silent and the meta-gradient is wrong (asserted); the
guard raises at the end of the outer backward in every mode, naming the parameter, the create_graph call, the
update (write log) and the backward. Uses of a create_graph gradient that are correct (functional fast weights,
Hessian-vector products, a gradient penalty, first-order MAML) stay quiet with bit-identical gradients.
"""

import gc
import pathlib
import weakref

import pytest
import torch
from torch import nn
from torch.func import functional_call

import gradguard
from gradguard import SilentModificationError

HERE = pathlib.Path(__file__)
SOURCE = HERE.read_text().splitlines()
MODES = [dict(), dict(fingerprint="sample"), dict(fingerprint="off"), dict(fingerprint="sample", track_writes=False)]
MODE_IDS = ["full", "sample", "off", "sentinel"]


def line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def _task():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    data = [torch.randn(6, 3), torch.randn(6, 1), torch.randn(6, 3), torch.randn(6, 1)]
    return model, data


def maml_in_place(model, data):
    sx, sy, qx, qy = data
    loss = nn.functional.mse_loss(model(sx), sy)
    grads = torch.autograd.grad(loss, model.parameters(), create_graph=True)  # create graph
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= 0.1 * g  # inner update
    nn.functional.mse_loss(model(qx), qy).backward()  # outer backward
    return [p.grad for p in model.parameters()]


def maml_functional(model, data):
    sx, sy, qx, qy = data
    params = dict(model.named_parameters())
    loss = nn.functional.mse_loss(model(sx), sy)
    grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
    fast = {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads)}
    nn.functional.mse_loss(functional_call(model, fast, (qx,)), qy).backward()
    return [p.grad for p in model.parameters()]


def first_order(model, data):
    sx, sy, qx, qy = data
    grads = torch.autograd.grad(nn.functional.mse_loss(model(sx), sy), model.parameters())
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= 0.1 * g
    nn.functional.mse_loss(model(qx), qy).backward()
    return [p.grad for p in model.parameters()]


def hvp_then_step(model, data):
    sx, sy, qx, qy = data
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    loss = nn.functional.mse_loss(model(sx), sy)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    hv = torch.autograd.grad(grads, params, [torch.ones_like(p) for p in params])
    for p, h in zip(params, hv):
        p.grad = h
    opt.step()
    opt.zero_grad()
    nn.functional.mse_loss(model(qx), qy).backward()
    return [p.grad for p in params]


def gradient_penalty(model, data):
    sx, sy, qx, qy = data
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in ((sx, sy), (qx, qy)):
        loss = nn.functional.mse_loss(model(x), y)
        grads = torch.autograd.grad(loss, model.parameters(), create_graph=True)
        (loss + sum(g.square().sum() for g in grads)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_maml_in_place_is_silently_first_order_without_the_guard():
    model, data = _task()
    wrong = maml_in_place(model, data)
    model, data = _task()
    right = maml_functional(model, data)
    assert not torch.allclose(wrong[0], right[0])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_maml_in_place_is_caught(mode):
    model, data = _task()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(**mode):
            maml_in_place(model, data)
    f = info.value.finding
    assert f.kind == "dropped_inner_update" and f.rule == "inner_update_dropped"
    assert f.tensor.name == "model.0.weight" and f.tensor.role == "leaf"
    assert f.facts.gradient_at["line"] == line_of("create graph")
    assert f.facts.backward_at["line"] == line_of("outer backward")
    assert "functional_call" in f.suggestion and "drop create_graph=True" in f.suggestion
    if mode.get("track_writes", True):  # the write log names the update's line
        assert [w.location.line for w in f.modified_at] == [line_of("inner update")]
    else:
        assert f.modified_at == []


@pytest.mark.parametrize("program", [maml_functional, first_order, hvp_then_step, gradient_penalty],
                         ids=["functional", "first_order", "hvp_then_step", "gradient_penalty"])
@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=["full", "sentinel"])
def test_correct_second_order_programs_stay_quiet(program, mode):
    model, data = _task()
    plain = program(model, data)
    model, data = _task()
    with gradguard.guard(**mode) as g:
        guarded = program(model, data)
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


def test_the_wrapper_keeps_no_gradient_or_graph_alive():
    model, data = _task()
    with gradguard.guard():
        loss = nn.functional.mse_loss(model(data[0]), data[1])
        grads = torch.autograd.grad(loss, model.parameters(), create_graph=True)
        refs = [weakref.ref(g) for g in grads] + [weakref.ref(loss)]
        del grads, loss
        gc.collect()
        assert all(r() is None for r in refs)


def test_the_wrapper_is_removed_on_exit():
    original = torch.autograd.grad
    with gradguard.guard():
        assert torch.autograd.grad is not original
    assert torch.autograd.grad is original


def test_a_leaf_dying_while_the_entries_lock_is_held_never_deadlocks():
    import threading

    from gradguard.backends.torch import attribution as so

    leaf = torch.ones(2, requires_grad=True)
    key = -12345  # not a real address: no other entry uses it
    with so._lock:
        so.entries[key] = so.Entry(weakref.ref(leaf, lambda ref: so._forget(key, ref)), 0, [False], None)
    finished = threading.Event()

    def die_under_the_lock():
        nonlocal leaf
        with so._lock:
            leaf = None  # the weakref callback runs here, with the lock held
        finished.set()

    worker = threading.Thread(target=die_under_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=10)
    try:
        assert finished.is_set(), "the weakref callback waited for _second_order's lock (deadlock)"
        assert key in so.entries and so._deferred.pending
        with so._lock:
            so._deferred.drain()  # what the next holder of the lock does first
        assert key not in so.entries and not so._deferred.pending
    finally:
        with so._lock:
            so._deferred.drain()
            so.entries.pop(key, None)
