"""core/patching.py: the one way gradguard replaces framework entry points (NOTE [One way to patch])."""

from __future__ import annotations

import logging
import types

import pytest
import torch

import gradguard
from gradguard.core.patching import SharedPatches, apply_patch, restore_patch


def _tagging(tag):
    def wrap(original):
        def wrapper(*args, **kwargs):
            return (tag, original(*args, **kwargs))

        return wrapper

    return wrap


def test_an_inherited_method_is_restored_by_deleting_ours():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        pass

    patch = apply_patch(Child, "f", _tagging("ours"))
    assert Child().f() == ("ours", "base")
    assert restore_patch(patch)
    assert "f" not in Child.__dict__
    Base.f = lambda self: "base, changed later"
    assert Child().f() == "base, changed later"  # inherits again, not a frozen copy


def test_a_module_attribute_is_put_back():
    module = types.SimpleNamespace(g=lambda: 1)
    original = module.g
    patch = apply_patch(module, "g", _tagging("ours"))
    assert module.g() == ("ours", 1)
    assert restore_patch(patch)
    assert module.g is original


def test_another_librarys_patch_on_top_of_ours_is_never_dropped(caplog):
    module = types.SimpleNamespace(g=lambda: 1)
    patch = apply_patch(module, "g", _tagging("ours"))
    theirs = _tagging("theirs")(module.g)
    module.g = theirs  # e.g. a profiler wrapping what it found while the guard was on
    with caplog.at_level(logging.DEBUG, logger="gradguard.patching"):
        assert not restore_patch(patch)
    assert module.g is theirs
    assert module.g() == ("theirs", ("ours", 1))
    assert any("another library replaced gradguard's wrapper" in r.getMessage() for r in caplog.records)


def test_nothing_to_wrap_is_logged_and_skipped(caplog):
    module = types.SimpleNamespace()
    with caplog.at_level(logging.DEBUG, logger="gradguard.patching"):
        assert apply_patch(module, "missing", _tagging("ours")) is None
    assert not hasattr(module, "missing")
    assert any("missing" in r.getMessage() for r in caplog.records)


def test_shared_patches_install_once_and_restore_after_the_last_holder():
    module = types.SimpleNamespace(g=lambda: 1, h=lambda: 2)
    original_g, original_h = module.g, module.h
    shared = SharedPatches(lambda: [(module, "g", _tagging("ours"))])
    shared.release()  # not held: nothing to undo, no error
    shared.acquire()
    shared.acquire()
    assert module.g() == ("ours", 1)  # wrapped once, not twice
    assert shared.add(module, "h", _tagging("late"))
    assert not shared.add(module, "h", _tagging("late"))  # already patched
    assert module.h() == ("late", 2)
    shared.release()
    assert module.g() == ("ours", 1) and shared.held
    shared.release()
    assert module.g is original_g and module.h is original_h and not shared.held
    assert not shared.add(module, "h", _tagging("late"))  # not held: nothing patched
    assert module.h is original_h


def test_a_guard_leaves_a_profilers_patch_made_inside_it_in_place():
    real = torch.Tensor.register_hook
    calls = []
    try:
        x = torch.ones(3, requires_grad=True)
        with gradguard.guard():
            found = torch.Tensor.register_hook  # gradguard's wrapper

            def profiled(self, hook):
                calls.append(hook)
                return found(self, hook)

            torch.Tensor.register_hook = profiled
        assert torch.Tensor.register_hook is profiled  # not silently dropped at the guard's exit
        seen = []
        y = x * 2
        y.register_hook(lambda g: seen.append(g.clone()))
        y.sum().backward()
        assert len(calls) == 1 and torch.equal(seen[0], torch.ones(3))
        assert torch.equal(x.grad, torch.full((3,), 2.0))
    finally:
        torch.Tensor.register_hook = real


def test_a_second_guard_over_a_left_behind_wrapper_changes_nothing():
    # After the test above's situation (a profiler's patch over gradguard's, kept at exit), a later guard wraps on
    # top of the profiler: two gradguard wrappers in the chain. The user's hook still runs once, gradients are
    # plain ones, and a real bug gives one finding.
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    real = torch.Tensor.register_hook
    try:
        with gradguard.guard():
            found = torch.Tensor.register_hook

            def profiled(self, hook):
                return found(self, hook)

            torch.Tensor.register_hook = profiled
        x = torch.randn(4, requires_grad=True)
        seen = []
        with gradguard.guard():
            y = Square.apply(x)
            y.register_hook(lambda g: seen.append(g.clone()))
            y.sum().backward()
        assert len(seen) == 1 and torch.equal(x.grad, 2 * x.detach())
        z = torch.randn(4, requires_grad=True)
        with pytest.raises(gradguard.InplaceModificationError) as caught:
            with gradguard.guard():
                s = z.sigmoid()
                s.mul_(2)
                s.sum().backward()
        assert str(caught.value).count("modified by an inplace operation") == 1
    finally:
        torch.Tensor.register_hook = real
