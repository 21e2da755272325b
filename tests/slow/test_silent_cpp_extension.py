"""A real C++ extension writing through data_ptr: inside a custom Function, called bare, and as a torch op."""

import pathlib
import sys

import pytest
import torch

import gradguard
from gradguard import InplaceModificationError, SilentModificationError
from gradguard.backends.torch.bisect import bisect

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _cpp_extension  # noqa: E402

HERE = pathlib.Path(__file__)
SOURCE = HERE.read_text().splitlines()
SHORT = HERE.relative_to(pathlib.Path.cwd()) if HERE.is_relative_to(pathlib.Path.cwd()) else HERE


@pytest.fixture(scope="module")
def ext():
    return _cpp_extension.load()


def line_of(marker: str) -> int:
    (hit,) = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith("# " + marker)]
    return hit


class CppDouble(torch.autograd.Function):
    """loss = sum(2 * x); the extension doubles x in place in forward (mode="inplace") or a clone."""

    ext = None

    @staticmethod
    def forward(ctx, x, mode):
        y = x.detach().clone() if mode == "clone" else x.detach()
        CppDouble.ext.scale_inplace(y, 2.0)
        if mode == "increment_version":
            torch.autograd.graph.increment_version(x)
        return y.sum()

    @staticmethod
    def backward(ctx, g):
        return None, None


def test_extension_inside_a_function_is_named(ext):
    CppDouble.ext = ext
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            x = torch.linspace(-1, 1, 6, requires_grad=True)
            h = x.tanh()  # cpp-save
            loss = CppDouble.apply(h, "inplace") + h.sum()  # cpp-call
            loss.backward()
    f = info.value.finding
    (w,) = f.modified_at
    assert (f.rule, f.saved_at.op, f.saved_at.location.line) == ("silent_kernel_write", "TanhBackward0.result",
                                                                  line_of("cpp-save"))
    assert (w.op, w.location.line, w.bumps_version) == ("CppDouble.forward", line_of("cpp-call"), False)


def test_extension_corrected_variants(ext):
    CppDouble.ext = ext
    with gradguard.guard() as g:
        x = torch.linspace(-1, 1, 6, requires_grad=True)
        h = x.tanh()
        (CppDouble.apply(h, "clone") + h.sum()).backward()
    assert g.findings == []
    assert torch.allclose(x.grad, 1 - x.detach().tanh() ** 2)
    with pytest.raises(InplaceModificationError):
        with gradguard.guard():
            h = torch.linspace(-1, 1, 6, requires_grad=True).tanh()
            (CppDouble.apply(h, "increment_version") + h.sum()).backward()


def bare_call(ext):
    x = torch.linspace(-1, 1, 6, requires_grad=True)
    h = x.sigmoid()
    y = h.sum()  # bare-before
    ext.scale_inplace(h.detach(), 2.0)  # bare-call
    z = y * 1.0  # bare-after
    z.backward()


def test_extension_called_bare_is_flagged_and_bisect_pins_its_line(ext):
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            bare_call(ext)
    assert info.value.finding.modified_at == []
    (f,) = bisect(bare_call, ext)
    (w,) = f.modified_at
    # no torch op wrote: the line tracer pins the write to the extension's line
    assert (w.op, w.location.line, w.category) == ("write outside torch", line_of("bare-call"), "outside")


def op_call(ext):
    x = torch.linspace(-1, 1, 6, requires_grad=True)
    h = x.exp()
    torch.ops.gradguard_silent_test.scale_inplace(h.detach(), 2.0)  # op-call
    h.sum().backward()


def test_extension_registered_as_an_op_is_pinned_by_bisect(ext):
    (f,) = bisect(op_call, ext)
    (w,) = f.modified_at
    assert (w.op, w.location.line, w.category) == ("gradguard_silent_test.scale_inplace", line_of("op-call"),
                                                   "kernel")
    assert f.saved_at.op == "ExpBackward0.result"
