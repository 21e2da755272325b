"""Seeded random programs, run without gradguard and under both guard modes: gradients bit-identical, no
finding, no error (issue 11: a random-program differential test over views/expand, user hooks, torch.func,
compile regions and a deep graph)."""

import random
import warnings

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

import gradguard

MODES = {"sentinel": {"fingerprint": "sample", "track_writes": False}, "forensic": {}}
_compiled = torch.compile(lambda a: torch.tanh(a) * a, backend="eager")


def _hooked(op):
    def run(h):
        with saved_tensors_hooks(lambda t: (t.to(torch.float64), t.dtype), lambda p: p[0].to(p[1])):
            return op(h)
    return run


STEPS = [
    ("sin", torch.sin),
    ("tanh", torch.tanh),
    ("exp-scaled", lambda h: torch.exp(h * 0.1)),
    ("mul-self", lambda h: h * h),
    ("transpose-back", lambda h: h.t().contiguous().t()),
    ("expand-sum", lambda h: h.unsqueeze(0).expand(3, *h.shape).sum(0)),
    ("narrow-cat", lambda h: torch.cat([h.narrow(1, 0, 2) * 2, h.narrow(1, 2, h.shape[1] - 2)], dim=1)),
    ("clone-inplace", lambda h: h.clone().mul_(0.5).add_(1)),  # legal: writes into a fresh copy
    ("relu-inplace-after-linear", lambda h: torch.relu_(h @ torch.eye(h.shape[1]) + 0)),
    ("softmax", lambda h: torch.softmax(h, dim=-1)),
    ("torch.func grad", lambda h: h + torch.func.grad(lambda a: a.sin().sum())(h.detach())),
    ("compiled", _compiled),
    ("user hooks", _hooked(lambda h: torch.sigmoid(h) * h)),
]


def _program(seed: int):
    rng = random.Random(seed)
    steps = [rng.choice(STEPS) for _ in range(rng.randint(3, 9))]

    def run():
        torch.manual_seed(seed)
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 5, requires_grad=True)
        h = x @ w
        for _, op in steps:
            h = op(h)
        h.pow(2).mean().backward()
        return x.grad, w.grad

    return [name for name, _ in steps], run


@pytest.mark.parametrize("seed", range(24))
def test_random_program_gives_the_same_gradients(seed):
    names, run = _program(seed)
    expected = run()
    for mode, options in MODES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gradguard.NotWatched)
            with gradguard.guard(**options) as g:
                got = run()
        assert g.findings == [], (mode, names)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), (mode, names)


def test_deep_graph_of_100k_ops_is_built_and_freed_inside_a_function_under_both_modes():
    def run():  # the graph is freed when run() returns (tests/robustness/test_deep_graph_freed_in_function.py
        # runs the same in a subprocess, where a crash fails the test instead of killing pytest)
        h = torch.full((4,), 0.5, requires_grad=True)
        x = h
        for _ in range(34_000):
            x = torch.tanh(x * 0.999 + 0.001)
        x.sum().backward()
        return h.grad

    expected = run()
    for options in MODES.values():
        with gradguard.guard(**options) as g:
            got = run()
        assert g.findings == [] and torch.equal(got, expected)


def test_100k_saved_views_of_one_storage_under_both_modes():
    # Every view is a ledger entry of the same storage: freeing them once took a scan each (quadratic).
    def run():
        torch.manual_seed(0)
        base = torch.randn(100_000, 2)
        w = torch.randn(2, requires_grad=True)
        torch.stack([v * w for v in base.unbind()]).sum().backward()  # saves 100k views of base
        return w.grad

    expected = run()
    for options in MODES.values():
        with gradguard.guard(**options) as g:
            got = run()
        assert g.findings == [] and torch.equal(got, expected)
