"""The cross-framework conformance table: one hazard, the same finding fields expected in every framework.

Each framework's test file (``tests/conformance/test_torch_conformance.py``,
``tests/paddle/test_paddle_conformance.py``, ``tests/mindspore/test_mindspore_conformance.py``) writes the hazards
below in its own API and checks its findings with :func:`check_finding`. Where a framework's semantics make a hazard
impossible (``y += 1`` rebinds in Paddle and MindSpore), the expected outcome is "no finding and gradients identical
to the unguarded run", and the reason is stated here; so is the reason where torch's finding differs.

``framework_raises``: what the framework itself does without gradguard (the parity half of the suite):
the exception class name it raises, or None when it computes a silently wrong (or correct) gradient.

A framework without the "guard" capability (``backends.KNOWN``: autograd) has a column too: no finding (there is no
guard to make one), its own parity (``framework_raises``, checked by ``tests/fast/test_autograd_check_op.py``), and,
where a hazard can be written as an op, ``check_op``: the check that catches it there.
"""

from __future__ import annotations

__all__ = ["HAZARDS", "check_finding"]

HAZARDS = {
    "augmented_assign": {
        "torch": {"finding": {"kind": "inplace_modification", "rule": "augmented_assignment", "tensor": "y",
                              "role": "activation", "write_op": "aten.add_.Tensor", "fix": "out of place"},
                  "framework_raises": "RuntimeError",
                  "why": "`y += 1` is Tensor.__iadd__ in torch: an in-place add (aten.add_) on the y that sin saved, "
                         "so the version check fails and gradguard names the augmented assignment"},
        "paddle": {"finding": None, "framework_raises": None,
                   "why": "`y += 1` rebinds y to a new tensor in Paddle 3.3 (Tensor has no __iadd__)"},
        "mindspore": {"finding": None, "framework_raises": None,
                      "why": "`y += 1` rebinds y to a new tensor in MindSpore 2.10"},
        "autograd": {"finding": None, "framework_raises": None,
                     "why": "no guard (autograd has no saved-tensor hooks); `y += 1` rebinds y to a new box in autograd "
                            "1.9 (ArrayBox has no __iadd__), so the gradient is right"},
    },
    "inplace_activation": {
        "torch": {"finding": {"kind": "inplace_modification", "rule": "inplace_activation", "tensor": "s",
                              "role": "activation", "write_op": "aten.tanh_", "fix": "out-of-place"},
                  "framework_raises": "RuntimeError"},
        "paddle": {"finding": {"kind": "inplace_modification", "rule": "inplace_activation", "role": "activation",
                               "fix": "out-of-place"},
                   "framework_raises": "RuntimeError"},
        "mindspore": {"finding": None, "framework_raises": None,
                      "why": "on CPU MindSpore 2.10 has no in-place activation kernels (InplaceTanh, InplaceReLU, "
                             "InplaceSigmoid are unregistered), and inside ms.grad `s.exp_()` leaves the value that "
                             "exp saved untouched"},
        "autograd": {"finding": None, "framework_raises": "TypeError",
                     "why": "no guard; `np.tanh(s, out=s)` on a traced array raises TypeError (ArrayBox refuses out=)"},
    },
    "optimizer_update": {
        "torch": {"finding": {"kind": "inplace_modification", "rule": "optimizer_step_before_backward",
                              "tensor": "net.weight", "role": "parameter", "write_op": "aten.add_.Tensor",
                              "fix": "after"},
                  "framework_raises": "RuntimeError",
                  "why": "torch's SGD.step() updates the parameter with an in-place aten op that bumps its version "
                         "counter, so torch itself raises and the write is an in-place modification (named by the "
                         "aten op; the explanation names SGD.step()), not a silent one as in Paddle and MindSpore"},
        "paddle": {"finding": {"kind": "silent_write", "rule": "optimizer_step_before_backward",
                               "tensor": "net.weight", "role": "parameter", "write_op": "paddle.optimizer.SGD.step()",
                               "fix": "after"},
                   "framework_raises": None},
        "mindspore": {"finding": {"kind": "silent_write", "rule": "optimizer_step_before_backward",
                                  "tensor": "net.w", "role": "parameter", "write_op": "mindspore.nn.SGD(grads)",
                                  "fix": "after"},
                      "framework_raises": None},
        "autograd": {"finding": None, "framework_raises": None,
                     "why": "cannot be written: autograd's grad runs the forward and the backward in one call, so no "
                            "optimizer step comes between them (autograd.misc.optimizers returns new arrays)"},
    },
    "direct_memory_write": {  # a NumPy/DLPack alias written between forward and backward, bisect mode on
        "torch": {"finding": {"kind": "silent_write", "rule": "silent_kernel_write", "tensor": "y",
                              "role": "activation", "write_op": "write outside torch", "fix": "copy"},
                  "framework_raises": None},
        "paddle": {"finding": {"kind": "silent_write", "rule": "silent_kernel_write", "role": "activation",
                               "write_op": "write outside paddle ops", "fix": "copy"},
                   "framework_raises": None},
        "mindspore": {"finding": {"kind": "silent_write", "rule": "silent_kernel_write", "role": "activation",
                                  "write_op": "write outside mindspore ops", "fix": "copy"},
                      "framework_raises": None},
        "autograd": {"finding": None, "framework_raises": None, "check_op": "mutation.silent_input_write",
                     "why": "no guard; a primitive whose forward writes into its input changes the array sin's vjp "
                            "closed over, silently (numpy has no version counter); check_op catches the primitive"},
    },
}


def check_finding(finding, expected: dict, *, save_line: int, write_line: int, backend: str) -> None:
    """The fields every framework's finding must carry: kind, rule, tensor, saver line, write line, why, fix."""
    assert finding.backend == backend
    assert (finding.kind, finding.rule) == (expected["kind"], expected["rule"]), (finding.kind, finding.rule)
    assert finding.tensor.role == expected["role"]
    if "tensor" in expected:
        assert finding.tensor.name == expected["tensor"]
    assert finding.saved_at.location is not None and finding.saved_at.location.line == save_line
    assert finding.saved_at.op, "the saver is named"
    writes = [(w.op, w.location.line if w.location else None) for w in finding.modified_at]
    assert any(line == write_line for _op, line in writes), writes
    if "write_op" in expected:
        assert expected["write_op"] in [op for op, _line in writes], writes
    # no other framework's name leaks into the words (torch's own findings may say "torch")
    foreign = ("paddle", "mindspore") if backend == "torch" else ("torch",)
    assert finding.explanation and not any(f in finding.explanation.lower() for f in foreign), finding.explanation
    assert expected["fix"] in finding.suggestion, finding.suggestion
    assert not any(f in finding.suggestion.lower() for f in foreign), finding.suggestion
