"""The write log's call gate (NOTE [Ops at the price of calls], backends/torch/writes.py): the op stream runs
only inside in-place calls that may touch saved memory; every other write into saved memory is still named."""

import pytest
import torch
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function_unary

import gradguard
from _markers import Markers
from gradguard import InplaceModificationError
from gradguard.backends.torch import user_hooks as _compat, writes as _call_gate

# On torch 2.4 the write log keeps its op stream on for the whole guard (no gate): the behaviour tests below run
# there too; the ones about the gate's own mechanics do not apply.
gate_only = pytest.mark.skipif(not _compat.GATE_CALLS, reason="torch < 2.5: no call gate, the op stream is always on")

MARKERS = Markers(__file__)
line_of = MARKERS.line


def scale_in_place(t):
    """A torch-function-dispatching Python function that writes its argument without an in-place name: the
    shape of many of torch's own Python functions (running statistics, renorms)."""
    if has_torch_function_unary(t):
        return handle_torch_function(scale_in_place, (t,), t)  # gate-dispatch
    t.mul_(2)
    return t


def written_saved_tensor(write) -> gradguard.Finding:
    """The finding for ``write(h)`` on a tensor saved for backward."""
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            x = torch.randn(4, requires_grad=True)
            h = x.sigmoid()
            write(h)
            h.sum().backward()
    return info.value.finding


def test_an_in_place_call_is_named_by_its_aten_overload_and_line():
    (write,) = written_saved_tensor(lambda h: h.mul_(2)).modified_at  # gate-inplace
    assert write.op == "aten.mul_.Tensor"
    assert write.location.line == line_of("gate-inplace")


@gate_only
def test_a_write_by_a_call_without_an_in_place_name_is_named_from_its_version_change():
    (write,) = written_saved_tensor(scale_in_place).modified_at
    assert write.op == f"{__name__}.scale_in_place"
    # the innermost user frame around the write: here the function's own dispatch line (a torch function's
    # frames are library frames, and the user's call line is named instead)
    assert (write.location.function, write.location.line) == ("scale_in_place", line_of("gate-dispatch"))
    assert (write.version_before, write.version_after) == (0, 1)
    # learned: the next call goes through the op stream and is named by its aten op
    assert [w.op for w in written_saved_tensor(scale_in_place).modified_at] == ["aten.mul_.Tensor"]


@gate_only
def test_positional_inplace_arguments_are_in_place_calls():
    f = torch.nn.functional
    assert _call_gate.may_write(f.dropout, (torch.zeros(2), 0.5, True, True), {})
    assert not _call_gate.may_write(f.dropout, (torch.zeros(2), 0.5, True, False), {})
    assert _call_gate.may_write(f.relu, (torch.zeros(2),), {"inplace": True})
    assert not _call_gate.may_write(f.relu, (torch.zeros(2),), {})
    assert _call_gate.may_write(torch.add, (torch.zeros(2), 1), {"out": torch.zeros(2)})
    assert not _call_gate.may_write(torch.add, (torch.zeros(2), 1), {})
    assert _call_gate.may_write(torch.Tensor.__setitem__, (torch.zeros(2), 0, 1.0), {})
    assert _call_gate.may_write(torch.ops.aten.add_.Tensor, (), {})
    assert not _call_gate.may_write(torch.ops.aten.add.Tensor, (), {})


def test_a_write_in_a_custom_backward_is_still_seen():
    class WritesSavedInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, other):
            ctx.save_for_backward(other)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (other,) = ctx.saved_tensors
            shared.add_(1)  # gate-backward
            return g * 2, None

    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            w = torch.randn(3, requires_grad=True)
            shared = w.exp()  # saved by exp's node for its backward
            y = WritesSavedInBackward.apply(torch.randn(3, requires_grad=True), shared.detach())
            (y.sum() + shared.sum()).backward()
    writes = info.value.finding.modified_at
    assert [w.op for w in writes] == ["aten.add_.Tensor"]
    assert writes[0].location.line == line_of("gate-backward")


@gate_only
def test_the_engine_entry_is_restored_after_nested_guards_and_errors():
    original = torch.autograd._engine_run_backward
    with pytest.raises(ZeroDivisionError):
        with gradguard.guard():
            assert torch.autograd._engine_run_backward is not original
            with gradguard.guard():
                1 / 0
    assert torch.autograd._engine_run_backward is original
    with gradguard.guard(track_writes=False):
        assert torch.autograd._engine_run_backward is original  # the sentinel has no write log and no gate


def test_a_users_torch_function_mode_sees_the_same_calls_and_gradients_are_identical():
    class Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    def step(model, x):
        with Count() as counter:
            loss = model(x).relu_().sum()
        loss.backward()
        return counter.calls, [p.grad.clone() for p in model.parameters()]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    x = torch.randn(5, 4)
    plain_calls, plain_grads = step(model, x)
    model.zero_grad()
    with gradguard.guard():
        guarded_calls, guarded_grads = step(model, x)
    assert guarded_calls == plain_calls
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, guarded_grads))


@gate_only
def test_an_optimizer_step_after_backward_does_not_enter_the_op_stream():
    # Nothing is saved once backward has freed the graph: the gate runs the optimizer's in-place calls directly
    entered = []
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradguard.guard() as g:
        model(torch.randn(3, 4)).sum().backward()
        stream = _session_sessions()[-1]._mode._stream
        original = type(stream).__torch_dispatch__

        def spy(self, func, types, args=(), kwargs=None):
            entered.append(func)
            return original(self, func, types, args, kwargs)

        type(stream).__torch_dispatch__ = spy
        try:
            opt.step()
        finally:
            type(stream).__torch_dispatch__ = original
    assert g.findings == []
    assert entered == []


def _session_sessions():
    from gradguard.backends.torch import attribution as _attribution

    return [ref() for ref in _attribution._sessions if ref() is not None]


def test_a_write_inside_compiled_code_is_caught_and_named_where_python_runs_it():
    # Dynamo's eager backend runs the captured FX graph as Python calls: the gate sees its in-place call
    @torch.compile(backend="eager")
    def scale_(t):
        t.mul_(2)
        return t

    finding = written_saved_tensor(scale_)
    assert [w.op for w in finding.modified_at] == ["aten.mul_.Tensor"]
    assert finding.versions == {"saved": 0, "now": 1}


@gate_only
def test_a_function_compiled_outside_compiles_once_more_inside_and_both_graphs_stay_cached():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()

    @torch.compile(backend=counter)
    def loss_of(x):
        return (x.sin() * 2).sum()

    x = torch.randn(8, requires_grad=True)
    loss_of(x).backward()
    plain = x.grad.clone()
    assert counter.frame_count == 1
    for _ in range(3):  # Dynamo guards on the function-mode stack: the gate on it means one more graph, once
        x.grad = None
        with gradguard.guard():
            loss_of(x).backward()
        assert torch.equal(x.grad, plain)
    x.grad = None
    loss_of(x).backward()
    assert counter.frame_count == 2
