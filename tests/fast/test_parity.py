"""Parity: under the guard, a program raises exactly when plain PyTorch raises, and otherwise every
gradient is bit-identical to the unguarded run.

Installing saved-tensor hooks switches PyTorch's own version check off, and a dispatch mode suppresses
``_foreach_`` version bumps; the guard must undo both effects exactly. Programs are generated from a
grammar of out-of-place ops, in-place ops (also through views and index assignment), optimizer steps
(single-tensor and foreach) and intermediate backward passes.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradguard

OUT_OF_PLACE = {
    "sin": lambda x, y, w: x.sin(),
    "exp": lambda x, y, w: (x * 0.1).exp(),
    "sigmoid": lambda x, y, w: x.sigmoid(),
    "tanh": lambda x, y, w: torch.tanh(x),
    "relu": lambda x, y, w: torch.relu(x),
    "mul": lambda x, y, w: x * y,
    "div": lambda x, y, w: x / (y.abs() + 1),
    "matmul_w": lambda x, y, w: x @ w,
    "softmax": lambda x, y, w: torch.softmax(x, dim=-1),
    "layer_norm": lambda x, y, w: torch.nn.functional.layer_norm(x, (4,)),
    "transpose_view": lambda x, y, w: x.t().t(),
    "slice_view": lambda x, y, w: x[:],
    "narrow_view": lambda x, y, w: x.narrow(0, 0, 3),
    "pow": lambda x, y, w: x**2,
    "clone": lambda x, y, w: x.clone(),
}


def _setitem(x, y, w):
    x[0] = 0.5


def _setitem_mask(x, y, w):
    x[x > 0.5] = 0.0


def _view_mul(x, y, w):
    x[:, 1].mul_(3)


def _index_put(x, y, w):
    x.index_put_((torch.tensor([0, 2]),), torch.tensor(1.5))


IN_PLACE = {
    "add_": lambda x, y, w: x.add_(1),
    "mul_": lambda x, y, w: x.mul_(2),
    "iadd": lambda x, y, w: x.__iadd__(y),
    "sigmoid_": lambda x, y, w: x.sigmoid_(),
    "relu_": lambda x, y, w: x.relu_(),
    "clamp_": lambda x, y, w: x.clamp_(-1, 1),
    "setitem": _setitem,
    "setitem_mask": _setitem_mask,
    "view_mul_": _view_mul,
    "index_put_": _index_put,
    "copy_": lambda x, y, w: x.copy_(y),
    "zero_": lambda x, y, w: x.zero_(),
}

STEPS = ("step_sgd", "step_sgd_foreach", "step_adam_foreach", "backward_retain")

op_names = st.sampled_from(sorted(OUT_OF_PLACE) + sorted(IN_PLACE) + list(STEPS))
programs = st.lists(
    st.tuples(op_names, st.integers(0, 7), st.integers(0, 7), st.booleans()), min_size=1, max_size=9
)


def run_program(program, guarded: bool):
    """Returns ("raised", exception) or ("ok", gradients)."""
    torch.manual_seed(0)
    a = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    optimizers = {
        "step_sgd": torch.optim.SGD([a, w], lr=0.1, foreach=False),
        "step_sgd_foreach": torch.optim.SGD([a, w], lr=0.1, foreach=True),
        "step_adam_foreach": torch.optim.Adam([a, w], lr=0.1, foreach=True),
    }
    block = gradguard.guard() if guarded else _NullContext()
    try:
        with block:
            pool = [a * 1.0, (a @ w).tanh()]
            for name, i, j, leaf_target in program:
                x, y = pool[i % len(pool)], pool[j % len(pool)]
                if name in OUT_OF_PLACE:
                    pool.append(OUT_OF_PLACE[name](x, y, w))
                elif name in IN_PLACE:
                    target = a if (leaf_target and name == "add_" and i == 7) else x
                    IN_PLACE[name](target, y, w)
                elif name == "backward_retain":
                    sum(t.sum() for t in pool).backward(retain_graph=True)
                else:
                    if a.grad is None:
                        pool[-1].sum().backward(retain_graph=True)
                    optimizers[name].step()
            loss = sum(t.sum() for t in pool)
            loss.backward()
    except RuntimeError as error:
        return "raised", error
    return "ok", (a.grad.clone() if a.grad is not None else None, w.grad.clone() if w.grad is not None else None)


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _same(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return torch.equal(x, y) and x.dtype == y.dtype


@settings(
    # 1000 on the pinned torch; the oldest and newest torch of the matrix run fewer (make test-torch-oldest/-newest)
    max_examples=int(os.environ.get("GRADGUARD_PARITY_EXAMPLES", "1000")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(programs)
def test_guard_raises_exactly_when_pytorch_raises_and_gradients_are_bit_identical(program):
    plain_outcome, plain_value = run_program(program, guarded=False)
    guarded_outcome, guarded_value = run_program(program, guarded=True)
    assert guarded_outcome == plain_outcome, (program, plain_value if plain_outcome == "raised" else guarded_value)
    if plain_outcome == "ok":
        assert _same(plain_value[0], guarded_value[0]) and _same(plain_value[1], guarded_value[1]), program
    else:
        assert isinstance(guarded_value, RuntimeError)
        if "modified by an inplace operation" in str(plain_value):
            assert isinstance(guarded_value, gradguard.InplaceModificationError), (program, guarded_value)
        assert not isinstance(guarded_value, gradguard.SilentModificationError), (program, guarded_value)


def test_generated_programs_cover_both_outcomes():
    # The property above is only meaningful if the grammar produces raising and non-raising programs,
    # and raising ones of the "modified by an inplace operation" kind in particular.
    outcomes = [
        run_program([("sigmoid", 0, 0, False), ("mul_", 2, 0, False)], guarded=False),
        run_program([("sin", 0, 0, False), ("exp", 2, 0, False)], guarded=False),
        run_program([("matmul_w", 0, 0, False), ("step_sgd_foreach", 0, 0, False)], guarded=False),
    ]
    assert outcomes[0][0] == "raised" and "modified by an inplace operation" in str(outcomes[0][1])
    assert outcomes[1][0] == "ok"
    assert outcomes[2][0] == "raised"
