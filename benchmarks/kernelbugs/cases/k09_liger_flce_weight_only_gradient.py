"""Liger-Kernel fused linear cross entropy: with only the weight requiring grad, the forward raises UnboundLocalError.

Report: https://github.com/linkedin/Liger-Kernel/issues/930 (under ``torch.no_grad()`` the loss crashes:
``grad_weight`` and ``grad_bias`` are only assigned when the input requires grad).
Fix:    https://github.com/linkedin/Liger-Kernel/pull/931 (commit 4a1677b: ``else: grad_weight = grad_bias = None``).
Code:   src/liger_kernel/ops/fused_linear_cross_entropy.py at 4a1677b^ and 4a1677b with the cross_entropy.py of
4a1677b (BSD-2-Clause), verbatim in the _liger_*.py files beside this one (only their import of the CE kernel
points at the copy). The same crash hits training a head on frozen features: only ``weight`` requires grad.
"""

import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

CASE = {
    "library": "liger-kernel 0.6.3",
    "kind": "forward (Triton host code)",
    "report": "https://github.com/linkedin/Liger-Kernel/issues/930",
    "fix": "https://github.com/linkedin/Liger-Kernel/pull/931",
    "code": "verbatim ops files at 4a1677b^ and 4a1677b",
    "root_cause": ("op.raised", "regime.grad_subset"),
    "without_reference": "caught",
    # The fix stops the crash, but the weight's gradient is then silently None when the input does not require
    # grad (both versions gate every gradient on the input's requires_grad; still so in liger-kernel 0.8.5,
    # checked by hand): check_op's grad_subset regime finds it; no public report found. Both versions also scale
    # the gradients saved in the forward in place in the backward, so a second backward (retain_graph) is wrong.
    "known_defects": ("regime.grad_subset", "mutation.backward_not_repeatable"),
}


def _load(name):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_Before = _load("_liger_flce_before_fix").LigerFusedLinearCrossEntropyFunction
_After = _load("_liger_flce_after_fix").LigerFusedLinearCrossEntropyFunction


def buggy(_input, weight, target):
    return _Before.apply(_input, weight, target)[0]


def fixed(_input, weight, target):
    return _After.apply(_input, weight, target)[0]


def reference(_input, weight, target):
    return F.cross_entropy(_input @ weight.t(), target)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 12, generator=g), torch.randn(16, 12, generator=g) * 0.3, torch.randint(0, 16, (8,), generator=g)


OPTIONS = {}
